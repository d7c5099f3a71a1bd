// The infill-render binary end to end on the default bundled model (infill-tiny-2): golden outputs, the
// output protocol, exit codes for bad jobs, resumable runs, --items, SIGTERM and deadlines.
#include "support/catch.h"

#include <c10/core/InferenceMode.h>
#include <c10/util/Half.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include "image_metrics.h"
#include "job_items.h"
#include "output_stamp.h"
#include "pipeline/image_io.h"
#include "png_text.h"
#include "render_process.h"
#include "support/temp_dir.h"

using namespace infill;
using namespace infill::test;
using infill::render::read_png_text;
namespace fs = std::filesystem;

namespace {

const std::string kSource = INFILL_SOURCE_DIR;
const std::string kGolden = kSource + "/tests/data/golden";

bool have_binary() {
  if (fs::exists(render_binary())) return true;
  FAIL("infill-render is not built at " << render_binary() << "; build the infill-render target");
  return false;
}

// A folder with the golden job's inputs; runs use `--cache-dir <dir>/cache` so nothing
// outside the folder is touched.
struct GoldenDir {
  TempDir dir{"infill-render"};
  GoldenDir() {
    for (const char* f : {"golden.json", "hills_128.png", "hills_128_mask.png"})
      fs::copy_file(kGolden + "/" + f, dir.file(f));
  }
  std::string job() const { return dir.file("golden.json"); }
  std::vector<std::string> args(std::vector<std::string> extra = {}) const {
    std::vector<std::string> a = {job(), "--cache-dir", dir.file("cache"), "--threads", "2"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

// Every line of stdout is part of the protocol.
void check_protocol(const std::string& out) {
  const std::regex line(R"(^(Progress: (100|[1-9]?[0-9])%|Saved: /.+|Skipped: /.+ \(up to date\))$)");
  std::istringstream in(out);
  int last = -1;
  for (std::string l; std::getline(in, l);) {
    INFO(l);
    CHECK(std::regex_match(l, line));
    if (l.rfind("Progress: ", 0) == 0) {
      const int p = std::stoi(l.substr(10));
      CHECK(p > last);  // one line per change, increasing
      last = p;
    }
  }
  CHECK(last == 100);
}

at::Tensor rgb_of(const std::string& path) {
  auto img = load_image(path, int64_t{1} << 24);
  REQUIRE(img.ok());
  return to_rgb_tensor(*img);
}

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.insert(e.path().filename().string());
  return names;
}

}  // namespace

TEST_CASE("infill-render: the golden job reproduces the committed outputs (SSIM >= 0.999)", "[render][cli][golden]") {
  if (!have_binary()) return;
  GoldenDir g;
  const RenderRun r = run_render(g.args(), g.dir.file("run"));
  INFO(r.err);
  REQUIRE(r.exited);
  REQUIRE(r.code == 0);
  CHECK(r.err.empty());
  check_protocol(r.out);
  CHECK(count_lines_starting(r.out, "Saved: ") == 2);
  c10::InferenceMode guard;
  for (const char* name : {"house_1.png", "house_2.png"}) {
    INFO(name);
    const std::string got = g.dir.file(std::string("out/") + name);
    REQUIRE(fs::exists(got));
    CHECK(r.out.find("Saved: " + got + "\n") != std::string::npos);
    // Not bit-exact: the packed attention and GEMMs take AVX-512 or AVX2 paths depending on
    // the CPU, which round differently; SSIM >= 0.999 still catches any real change.
    const double s = train::ssim(rgb_of(got), rgb_of(kGolden + "/expected/" + name));
    INFO("ssim " << s);
    CHECK(s >= 0.999);
    CHECK(read_png_text(got, render::kHashKeyword).has_value());
    CHECK(read_png_text(got, render::kCanonicalKeyword).value_or("").find("\"seed\":") != std::string::npos);
  }
  // Different seeds give different edits.
  CHECK(train::ssim(rgb_of(g.dir.file("out/house_1.png")), rgb_of(g.dir.file("out/house_2.png"))) < 0.999);
}

TEST_CASE("infill-render: outputs already up to date are skipped, --force redoes them", "[render][cli][resume]") {
  if (!have_binary()) return;
  GoldenDir g;
  REQUIRE(run_render(g.args(), g.dir.file("run1")).code == 0);
  const auto t1 = fs::last_write_time(g.dir.file("out/house_1.png"));

  RenderRun again = run_render(g.args(), g.dir.file("run2"));
  CHECK(again.code == 0);
  CHECK(count_lines_starting(again.out, "Skipped: ") == 2);
  CHECK(count_lines_starting(again.out, "Saved: ") == 0);
  check_protocol(again.out);
  CHECK(fs::last_write_time(g.dir.file("out/house_1.png")) == t1);

  // Without the cache the item is the same edit: still up to date.
  RenderRun nocache = run_render(g.args({"--no-cache"}), g.dir.file("run3"));
  CHECK(count_lines_starting(nocache.out, "Skipped: ") == 2);

  RenderRun forced = run_render(g.args({"--force"}), g.dir.file("run4"));
  CHECK(forced.code == 0);
  CHECK(count_lines_starting(forced.out, "Saved: ") == 2);
  CHECK(count_lines_starting(forced.out, "Skipped: ") == 0);

  // A stale output (another seed's file in its place) and a foreign PNG are redone.
  fs::copy_file(g.dir.file("out/house_2.png"), g.dir.file("out/house_1.png"), fs::copy_options::overwrite_existing);
  fs::copy_file(kGolden + "/hills_128.png", g.dir.file("out/house_2.png"), fs::copy_options::overwrite_existing);
  RenderRun stale = run_render(g.args(), g.dir.file("run5"));
  CHECK(count_lines_starting(stale.out, "Saved: ") == 2);

  // A changed parameter changes the hash: redone.
  {
    std::ofstream(g.job()) << R"({"format": "infill-job/1", "defaults": {"steps": 7},
      "edits": [{"name": "house", "template": "hills_128.png", "mask": "hills_128_mask.png", "prompt": "blue",
                 "seeds": [1, 2], "output": "out/{name}_{seed}.png"}]})";
  }
  RenderRun changed = run_render(g.args(), g.dir.file("run6"));
  CHECK(count_lines_starting(changed.out, "Saved: ") == 2);
}

TEST_CASE("infill-render: 16-bit PNG and TIFF, half and float EXR plates keep their depth outside the mask, outputs stamped",
          "[render][cli][depth]") {
  if (!have_binary()) return;
  GoldenDir g;
  auto hills = load_image(kGolden + "/hills_128.png", int64_t{1} << 24);
  auto mask = load_image(kGolden + "/hills_128_mask.png", int64_t{1} << 24);
  REQUIRE(hills.ok());
  REQUIRE(mask.ok());
  REQUIRE(hills->format == PixelFormat::kU8);
  REQUIRE(mask->channels == 1);
  // The same picture at three depths (the float ones as linear light, values up to 3).
  const size_t n = hills->data.size();
  const auto* u8 = reinterpret_cast<const uint8_t*>(hills->data.data());
  PixelImage u16 = PixelImage::allocate(hills->width, hills->height, hills->channels, PixelFormat::kU16);
  PixelImage f16 = PixelImage::allocate(hills->width, hills->height, hills->channels, PixelFormat::kF16);
  PixelImage f32 = PixelImage::allocate(hills->width, hills->height, hills->channels, PixelFormat::kF32);
  for (size_t i = 0; i < n; ++i) {
    reinterpret_cast<uint16_t*>(u16.data.data())[i] = static_cast<uint16_t>(u8[i] * 257 + i % 251);
    reinterpret_cast<uint16_t*>(f16.data.data())[i] = c10::Half(u8[i] / 85.0f).x;
    reinterpret_cast<float*>(f32.data.data())[i] = u8[i] / 85.0f + 1e-7f * float(i % 7);
  }
  REQUIRE(save_image(g.dir.file("plate16.tif"), u16).ok());
  REQUIRE(save_image(g.dir.file("plate16.png"), u16).ok());
  REQUIRE(save_image(g.dir.file("plate_half.exr"), f16).ok());
  REQUIRE(save_image(g.dir.file("plate_float.exr"), f32).ok());
  std::ofstream(g.job()) << R"({"format": "infill-job/1", "defaults": {"steps": 4, "mask": "hills_128_mask.png", "seeds": [5]},
    "edits": [{"name": "png16", "template": "plate16.png", "output": "out/{name}.png"},
              {"name": "tiff16", "template": "plate16.tif", "output": "out/{name}.tif"},
              {"name": "half", "template": "plate_half.exr", "output": "out/{name}.exr"},
              {"name": "float", "template": "plate_float.exr", "output": "out/{name}.EXR"}]})";
  const RenderRun r = run_render(g.args(), g.dir.file("run"));
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(count_lines_starting(r.out, "Saved: ") == 4);
  const auto* m = reinterpret_cast<const uint8_t*>(mask->data.data());
  struct Expected {
    const char* output;
    const PixelImage* input;
    const char* file_format;
  };
  for (const Expected& e : {Expected{"out/png16.png", &u16, "png"}, Expected{"out/tiff16.tif", &u16, "tiff"},
                            Expected{"out/half.exr", &f16, "openexr"},
                            Expected{"out/float.EXR", &f32, "openexr"}}) {
    INFO(e.output);
    auto out = load_image(g.dir.file(e.output), int64_t{1} << 24);
    REQUIRE(out.ok());
    CHECK(out->file_format == e.file_format);
    REQUIRE(out->format == e.input->format);
    REQUIRE(out->channels == e.input->channels);
    const size_t px = out->channels * bytes_per_sample(out->format);
    int64_t kept_bad = 0, changed_inside = 0;
    for (int64_t p = 0; p < out->pixel_count(); ++p) {
      const bool same = std::memcmp(out->data.data() + p * px, e.input->data.data() + p * px, px) == 0;
      if (m[p] == 0) kept_bad += !same;
      else changed_inside += !same;
    }
    CHECK(kept_bad == 0);
    CHECK(changed_inside > 0);
    CHECK(render::read_output_stamp(g.dir.file(e.output), render::kHashKeyword).has_value());
    CHECK(render::read_output_stamp(g.dir.file(e.output), render::kCanonicalKeyword).value_or("").find("\"seed\":5") !=
          std::string::npos);
  }
  // The stamp inside TIFF and EXR outputs makes a rerun skip them.
  const RenderRun again = run_render(g.args(), g.dir.file("run2"));
  CHECK(again.code == 0);
  CHECK(count_lines_starting(again.out, "Skipped: ") == 4);
}

TEST_CASE("infill-render: --items runs a slice, bad ranges exit 2", "[render][cli][items]") {
  if (!have_binary()) return;
  GoldenDir g;
  RenderRun second = run_render(g.args({"--items", "2-2"}), g.dir.file("run"));
  INFO(second.err);
  REQUIRE(second.code == 0);
  CHECK(count_lines_starting(second.out, "Saved: ") == 1);
  CHECK(second.out.find("house_2.png") != std::string::npos);
  CHECK(files_in(g.dir.file("out")) == std::set<std::string>{"house_2.png"});
  check_protocol(second.out);

  RenderRun rest = run_render(g.args({"--items", "1-"}), g.dir.file("rest"));
  CHECK(rest.code == 0);
  CHECK(count_lines_starting(rest.out, "Saved: ") == 1);
  CHECK(count_lines_starting(rest.out, "Skipped: ") == 1);

  RenderRun list = run_render({g.job(), "--list"}, g.dir.file("list"));
  CHECK(list.code == 0);
  CHECK(list.out == "1\t" + g.dir.file("out/house_1.png") + "\n2\t" + g.dir.file("out/house_2.png") + "\n");

  for (const char* bad : {"3", "2-1", "0-1", "1-3", "x", "1-b", ""}) {
    INFO("--items '" << bad << "'");
    RenderRun r = run_render(g.args({"--items", bad}), g.dir.file("bad"));
    CHECK(r.code == 2);
    CHECK(r.out.empty());
    CHECK(r.err.rfind(std::string("Error: --items ") + bad + ":", 0) == 0);
    CHECK(r.err.find("the job has 2 items") != std::string::npos);
  }
}

TEST_CASE("infill-render: bad job files exit 2 naming the file, the field and what was expected", "[render][cli][errors]") {
  if (!have_binary()) return;
  GoldenDir g;
  fs::copy_file(kSource + "/resources/templates/sample_mask.png", g.dir.file("big_mask.png"));
  struct Case {
    const char* what;
    std::string job;
    std::string pointer;
    std::string expected;
    std::vector<std::string> args = {};  // e.g. a model with a prompt vocabulary
  };
  auto edit = [](const std::string& fields) {
    return R"({"format": "infill-job/1", "edits": [{"template": "hills_128.png", "mask": "hills_128_mask.png", "output": "o/{seed}.png", )" +
           fields + "}]}";
  };
  const std::vector<Case> cases = {
      {"syntax", R"({"format": "infill-job/1", "edits": [)", "/", "expected a JSON document"},
      {"schema: unknown field", edit(R"("seedz": [1])"), "/edits/0/seedz", "expected one of"},
      {"schema: type", edit(R"("steps": "many")"), "/edits/0/steps", "expected an integer in 1..1000"},
      {"schema: range", edit(R"("strength": 1.5)"), "/edits/0/strength", "expected a number in (0, 1]"},
      {"missing template",
       R"({"format": "infill-job/1", "edits": [{"template": "gone.png", "mask": "hills_128_mask.png", "output": "o.png"}]})",
       "/edits/0/template", "expected the path of a readable template image"},
      {"missing mask",
       R"({"format": "infill-job/1", "edits": [{"template": "hills_128.png", "mask": "gone.png", "output": "o.png"}]})",
       "/edits/0/mask", "expected the path of a readable mask image"},
      {"size mismatch",
       R"({"format": "infill-job/1", "edits": [{"template": "hills_128.png", "mask": "big_mask.png", "output": "o.png"}]})",
       "/edits/0/mask", "expected a mask of the template's size"},
      {"unknown prompt word", edit(R"("prompt": "green chartreuse")"), "/edits/0/prompt", "expected words from: red",
       {"--model", kSource + "/resources/models/infill-tiny"}},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    std::ofstream(g.dir.file("bad.json")) << c.job;
    std::vector<std::string> args = {g.dir.file("bad.json"), "--cache-dir", g.dir.file("cache")};
    args.insert(args.end(), c.args.begin(), c.args.end());
    RenderRun r = run_render(args, g.dir.file("bad"));
    INFO(r.err);
    CHECK(r.exited);
    CHECK(r.code == 2);
    CHECK(r.out.empty());  // errors on stderr and nowhere else
    CHECK(r.err.rfind("Error: " + g.dir.file("bad.json") + ": " + c.pointer + ": ", 0) == 0);
    CHECK(r.err.find(c.expected) != std::string::npos);
    CHECK(count_lines_starting(r.err, "Error: ") == 1);
  }
  // Not a job at all, and bad options.
  RenderRun missing = run_render({g.dir.file("absent.json")}, g.dir.file("absent"));
  CHECK(missing.code == 2);
  CHECK(missing.err.find(g.dir.file("absent.json")) != std::string::npos);
  CHECK(run_render({g.job(), "--frobnicate"}, g.dir.file("opt")).code == 2);
  RenderRun old_cli = run_render({"--template", g.dir.file("hills_128.png")}, g.dir.file("old"));
  CHECK(old_cli.code == 2);
  CHECK(old_cli.err.find("expected a job file") != std::string::npos);
  CHECK(run_render({g.job(), "--engine", "ftp://x"}, g.dir.file("eng")).code == 2);
  CHECK(run_render({}, g.dir.file("none")).code == 2);
}

TEST_CASE("infill-render: an engine that cannot start or be reached exits 3", "[render][cli][engine]") {
  if (!have_binary()) return;
  GoldenDir g;
  RenderRun bad_model = run_render(g.args({"--model", g.dir.file("no-model")}), g.dir.file("model"));
  CHECK(bad_model.code == 3);
  CHECK(bad_model.err.rfind("Error: ", 0) == 0);
  CHECK(bad_model.out.empty());
  RenderRun unreachable = run_render({g.job(), "--engine", "unix:" + g.dir.file("no.sock")}, g.dir.file("unix"));
  CHECK(unreachable.code == 3);
  CHECK(unreachable.err.rfind("Error: ", 0) == 0);
}

TEST_CASE("infill-render: SIGTERM mid-job leaves no partial file and kills the process by SIGTERM, the rerun resumes",
          "[render][cli][signal]") {
  if (!have_binary()) return;
  TempDir dir("infill-render-sig");
  for (const char* f : {"hills_256.png", "hills_256_mask.png"})
    fs::copy_file(kSource + "/resources/jobs/" + f, dir.file(f));
  std::ofstream(dir.file("slow.json")) << R"({"format": "infill-job/1",
    "edits": [{"template": "hills_256.png", "mask": "hills_256_mask.png", "prompt": "red", "steps": 16,
               "seeds": {"first": 1, "count": 24}, "output": "out/{name}_{seed:03}.png"}]})";
  const std::vector<std::string> args = {dir.file("slow.json"), "--cache-dir", dir.file("cache"), "--threads", "2",
                                         "--max-in-flight", "2", "--no-cache"};
  {
    RenderProcess p(args, dir.file("run"));
    // Mid-job: after the first output is written, with more in flight.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (p.out().find("Saved: ") == std::string::npos && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    REQUIRE(p.out().find("Saved: ") != std::string::npos);
    ::kill(p.pid(), SIGTERM);
    const auto t_kill = std::chrono::steady_clock::now();
    const RenderRun r = p.wait(60000);
    // Cancelled at the next step boundary, not after the edits in flight finish.
    CHECK(std::chrono::steady_clock::now() - t_kill < std::chrono::seconds(10));
    INFO(r.out << r.err);
    CHECK_FALSE(r.exited);
    CHECK(r.signal == SIGTERM);
    CHECK(r.err.empty());
    const int saved = count_lines_starting(r.out, "Saved: ");
    CHECK(saved >= 1);
    CHECK(saved < 24);
    // Exactly the announced files exist, each complete and stamped; no partial file anywhere.
    const auto names = files_in(dir.file("out"));
    CHECK(static_cast<int>(names.size()) == saved);
    for (const auto& n : names) {
      INFO(n);
      CHECK(n.find(".partial") == std::string::npos);
      CHECK(r.out.find("Saved: " + dir.file("out/" + n) + "\n") != std::string::npos);
      CHECK(read_png_text(dir.file("out/" + n), render::kHashKeyword).has_value());
      CHECK(load_image(dir.file("out/" + n), int64_t{1} << 24).ok());
    }
    // The rerun (with the cache, which does not change the job hash) skips what was written.
    std::vector<std::string> rerun(args.begin(), args.end() - 1);
    const RenderRun again = run_render(rerun, dir.file("again"), 180000);
    INFO(again.err);
    CHECK(again.code == 0);
    CHECK(count_lines_starting(again.out, "Skipped: ") == saved);
    CHECK(count_lines_starting(again.out, "Saved: ") == 24 - saved);
  }
}

TEST_CASE("infill-render: a missed deadline exits 4 and leaves no partial file", "[render][cli][deadline]") {
  if (!have_binary()) return;
  TempDir dir("infill-render-dl");
  for (const char* f : {"hills_256.png", "hills_256_mask.png"})
    fs::copy_file(kSource + "/resources/jobs/" + f, dir.file(f));
  std::ofstream(dir.file("slow.json")) << R"({"format": "infill-job/1", "deadline_s": 2,
    "edits": [{"template": "hills_256.png", "mask": "hills_256_mask.png", "steps": 16,
               "seeds": {"first": 1, "count": 200}, "output": "out/{seed}.png"}]})";
  const RenderRun r = run_render({dir.file("slow.json"), "--cache-dir", dir.file("cache"), "--no-cache", "--threads", "2"},
                                 dir.file("run"));
  INFO(r.err);
  CHECK(r.code == 4);
  CHECK(r.err.rfind("Error: the deadline of 2 s passed", 0) == 0);
  for (const auto& n : files_in(dir.file("out"))) CHECK(n.find(".partial") == std::string::npos);
}

TEST_CASE("infill-render: SIGINT mid-edit cancels, writes nothing more and kills the process by SIGINT",
          "[render][cli][signal]") {
  if (!have_binary()) return;
  TempDir dir("infill-render-int");
  for (const char* f : {"hills_256.png", "hills_256_mask.png"})
    fs::copy_file(kSource + "/resources/jobs/" + f, dir.file(f));
  std::ofstream(dir.file("slow.json")) << R"({"format": "infill-job/1",
    "edits": [{"template": "hills_256.png", "mask": "hills_256_mask.png", "steps": 16,
               "seeds": {"first": 1, "count": 8}, "output": "out/{seed}.png"}]})";
  RenderProcess p({dir.file("slow.json"), "--cache-dir", "none", "--no-cache", "--threads", "2"}, dir.file("run"));
  // Interrupted inside the first batch of edits: some progress, nothing saved yet.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (p.out().find("Progress: 1") == std::string::npos && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ::kill(p.pid(), SIGINT);
  const RenderRun r = p.wait(60000);
  INFO(r.out << r.err);
  CHECK_FALSE(r.exited);
  CHECK(r.signal == SIGINT);
  CHECK(r.err.empty());
  const int saved = count_lines_starting(r.out, "Saved: ");
  CHECK(static_cast<int>(files_in(dir.file("out")).size()) == saved);
  for (const auto& n : files_in(dir.file("out"))) CHECK(n.find(".partial") == std::string::npos);
}
