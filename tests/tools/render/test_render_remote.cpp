// infill-render against a real infill-engine (--engine): over TCP with a bearer token and over
// the Unix socket, through the client SDK. Golden outputs, resume across modes, a wrong
// token (exit 3) and SIGTERM mid-job.
#include "support/catch.h"

#include <c10/core/InferenceMode.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "engine_process.h"
#include "image_metrics.h"
#include "job_items.h"
#include "pipeline/image_io.h"
#include "png_text.h"
#include "render_process.h"
#include "support/temp_dir.h"

using namespace infill;
using namespace infill::test;
namespace fs = std::filesystem;

namespace {

const std::string kSource = INFILL_SOURCE_DIR;
const std::string kGolden = kSource + "/tests/data/golden";

at::Tensor rgb_of(const std::string& path) {
  auto img = load_image(path, int64_t{1} << 24);
  REQUIRE(img.ok());
  return to_rgb_tensor(*img);
}

}  // namespace

TEST_CASE("infill-render --engine: TCP with a token, Unix socket, wrong token exits 3", "[render][cli][remote]") {
  TempDir dir("infill-render-remote");
  EngineProcess engine(dir.path());
  REQUIRE(fs::exists(render_binary()));
  INFO(engine.log());
  REQUIRE(engine.ready());
  for (const char* f : {"golden.json", "hills_128.png", "hills_128_mask.png"}) fs::copy_file(kGolden + "/" + f, dir.file(f));
  const std::string tcp = "http://127.0.0.1:" + std::to_string(engine.port());

  // TCP + token: the golden job, same outputs as the embedded engine.
  RenderRun r = run_render({dir.file("golden.json"), "--engine", tcp, "--token-file", engine.token_file()}, dir.file("tcp"));
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  CHECK(count_lines_starting(r.out, "Saved: ") == 2);
  CHECK(r.out.substr(r.out.size() - 15) == "Progress: 100%\n");
  {
    c10::InferenceMode guard;
    for (const char* name : {"house_1.png", "house_2.png"}) {
      const double s = train::ssim(rgb_of(dir.file(std::string("out/") + name)), rgb_of(kGolden + "/expected/" + name));
      INFO(name << " ssim " << s);
      CHECK(s >= 0.999);  // not bytes: see tests/data/golden/README.md
    }
  }
  // The engine's model is the bundled one: outputs are up to date for the embedded engine too.
  RenderRun embedded = run_render({dir.file("golden.json"), "--cache-dir", dir.file("cache2")}, dir.file("emb"));
  CHECK(embedded.code == 0);
  CHECK(count_lines_starting(embedded.out, "Skipped: ") == 2);

  // Unix socket, forced.
  RenderRun unix_run = run_render({dir.file("golden.json"), "--engine", "unix:" + engine.socket(), "--force"}, dir.file("unix"));
  INFO(unix_run.err);
  CHECK(unix_run.code == 0);
  CHECK(count_lines_starting(unix_run.out, "Saved: ") == 2);

  // A wrong token: refused, exit 3, one error line on stderr, nothing on stdout.
  std::ofstream(dir.file("wrong_token")) << std::string(64, 'a');
  RenderRun refused = run_render({dir.file("golden.json"), "--engine", tcp, "--token-file", dir.file("wrong_token"), "--force"},
                                 dir.file("refused"));
  CHECK(refused.code == 3);
  CHECK(refused.out.empty());
  CHECK(refused.err.rfind("Error: engine " + tcp + " refused the token in " + dir.file("wrong_token"), 0) == 0);
  CHECK(count_lines_starting(refused.err, "Error: ") == 1);

  // Flags of the embedded engine make no sense with --engine; a missing token file is a bad flag.
  CHECK(run_render({dir.file("golden.json"), "--engine", tcp, "--token-file", engine.token_file(), "--no-cache"},
                   dir.file("nc")).code == 2);
  CHECK(run_render({dir.file("golden.json"), "--engine", tcp, "--token-file", dir.file("absent")}, dir.file("nt")).code == 2);
  CHECK(run_render({dir.file("golden.json"), "--engine", tcp}, dir.file("notoken")).code == 2);

  // SIGTERM mid-job: the engine's edits are cancelled, no partial file, death by SIGTERM.
  for (const char* f : {"hills_256.png", "hills_256_mask.png"}) fs::copy_file(kSource + "/resources/jobs/" + f, dir.file(f));
  std::ofstream(dir.file("slow.json")) << R"({"format": "infill-job/1",
    "edits": [{"template": "hills_256.png", "mask": "hills_256_mask.png", "steps": 16,
               "seeds": {"first": 1, "count": 40}, "output": "slow/{seed}.png"}]})";
  RenderProcess p({dir.file("slow.json"), "--engine", "unix:" + engine.socket(), "--max-in-flight", "2"}, dir.file("slow"));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (p.out().find("Saved: ") == std::string::npos && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ::kill(p.pid(), SIGTERM);
  const RenderRun killed = p.wait(60000);
  INFO(killed.out << killed.err);
  CHECK_FALSE(killed.exited);
  CHECK(killed.signal == SIGTERM);
  const int saved = count_lines_starting(killed.out, "Saved: ");
  CHECK(saved >= 1);
  CHECK(saved < 40);
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.file("slow"))) {
    ++files;
    CHECK(e.path().filename().string().find(".partial") == std::string::npos);
  }
  CHECK(files == saved);
}
