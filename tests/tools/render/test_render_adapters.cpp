// infill-render with LoRAs and reference images on a tiny FLUX.2 model (real model folder, real
// LoRA files written here): a job's adapters and references change the render inside the mask
// only, the same job renders the same bytes twice, and files the model cannot use are refused
// before any item runs, naming the job file, the entry's JSON pointer and what was expected
// (a reference of a size no engine takes while the job loads, --engine too).
// Embedded engine and --engine (which uploads them: POST /v1/adapters, POST /v1/templates).
#include "support/catch.h"
#include "support/tiny_flux2.h"

#include <c10/core/InferenceMode.h>

#include <filesystem>
#include <fstream>

#include "engine_process.h"
#include "job_items.h"
#include "output_stamp.h"
#include "pipeline/image_io.h"
#include "render_process.h"
#include "support/file_bytes.h"
#include "support/temp_dir.h"

using namespace infill;
using namespace infill::test;
namespace fs = std::filesystem;

namespace {

const std::string kGolden = std::string(INFILL_SOURCE_DIR) + "/tests/data/golden";

// A tiny FLUX.2 folder, a LoRA for it, one for a wider model, and the golden template and mask.
struct LoraDir {
  TempDir dir{"infill-render-lora"};
  LoraDir() {
    c10::InferenceMode guard;
    write_tiny_flux2_folder(dir.file("flux2"));
    const Flux2Config config = tiny_flux2_config(3 * tiny_qwen3_config().hidden_size);
    fs::create_directories(dir.file("loras"));
    write_random_lora(dir.file("loras/style.safetensors"), config, 11);
    Flux2Config wider = config;
    wider.hidden_size = 128;
    wider.mlp_hidden = 256;
    write_random_lora(dir.file("loras/wider.safetensors"), wider, 12);
    for (const char* f : {"hills_128.png", "hills_128_mask.png"}) fs::copy_file(kGolden + "/" + f, dir.file(f));
    fs::copy_file(std::string(INFILL_SOURCE_DIR) + "/resources/jobs/dusk_256.png", dir.file("dusk_256.png"));
    // Smaller than a reference may be (64 pixels a side).
    PixelImage small;
    small.width = small.height = 40;
    small.channels = 3;
    small.data.assign(40 * 40 * 3, std::byte{90});
    if (!save_image(dir.file("small.png"), small).ok()) throw std::runtime_error("small.png");
  }
  // A job of the edits `edits` (JSON array text) on the tiny model, written to `name`.
  std::string job(const std::string& name, const std::string& edits, bool with_model = true) const {
    std::ofstream(dir.file(name)) << R"({"format": "infill-job/1", )" << (with_model ? R"("model": "flux2", )" : "")
                                  << R"("defaults": {"template": "hills_128.png", "mask": "hills_128_mask.png",
                                        "prompt": "a red roof", "seed": 3},
                                        "edits": )"
                                  << edits << "}";
    return dir.file(name);
  }
  std::vector<std::string> args(const std::string& job, std::vector<std::string> extra = {}) const {
    std::vector<std::string> a = {job, "--cache-dir", dir.file("cache"), "--threads", "2"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
};

const char* kTwoEdits = R"([
  {"name": "plain", "output": "out/plain.png"},
  {"name": "lora", "adapters": [{"file": "loras/style.safetensors", "strength": 1.5}], "output": "out/lora.png"}])";
const char* kReferenceEdits = R"([
  {"name": "plain", "output": "ref/plain.png"},
  {"name": "dusk", "references": ["dusk_256.png"], "output": "ref/dusk.png"},
  {"name": "both", "references": ["dusk_256.png", "hills_128_mask.png"],
   "adapters": [{"file": "loras/style.safetensors"}], "output": "ref/both.png"}])";

// What a job error says a reference's size must be (check_reference_size's rule).
const std::string kReferenceSizeExpected =
    "; expected a reference image of at least 64 pixels a side"
    " with an aspect ratio of at most 8";

PixelImage pixels(const std::string& path) {
  auto img = load_image(path, int64_t{1} << 24);
  REQUIRE(img.ok());
  return *img;
}

// Pixels of `a` and `b` that differ where the mask keeps (0) and where it regenerates (> 0).
struct Differences {
  int64_t kept = 0, masked = 0;
};
Differences differences(const PixelImage& a, const PixelImage& b, const PixelImage& mask) {
  REQUIRE(a.width == b.width);
  REQUIRE(a.height == b.height);
  REQUIRE(a.channels == b.channels);
  REQUIRE(a.format == PixelFormat::kU8);
  REQUIRE(mask.format == PixelFormat::kU8);
  Differences d;
  const auto* pa = reinterpret_cast<const uint8_t*>(a.data.data());
  const auto* pb = reinterpret_cast<const uint8_t*>(b.data.data());
  const auto* pm = reinterpret_cast<const uint8_t*>(mask.data.data());
  for (int64_t i = 0; i < a.pixel_count(); ++i) {
    bool differs = false;
    for (int c = 0; c < a.channels; ++c) differs |= pa[i * a.channels + c] != pb[i * b.channels + c];
    if (differs) ++(pm[i * mask.channels] == 0 ? d.kept : d.masked);
  }
  return d;
}

// A job refused before any item: exit 2, nothing written, one error line naming the job
// file, the pointer and what was expected.
void require_refused(const RenderRun& r, const std::string& job, const std::string& pointer,
                     const std::vector<std::string>& parts) {
  INFO(r.out << r.err);
  CHECK(r.exited);
  CHECK(r.code == 2);
  CHECK(r.out.find("Saved: ") == std::string::npos);
  CHECK(r.err.rfind("Error: " + job + ": " + pointer + ": ", 0) == 0);
  CHECK(count_lines_starting(r.err, "Error: ") == 1);
  for (const std::string& p : parts) CHECK(r.err.find(p) != std::string::npos);
}

}  // namespace

TEST_CASE("infill-render: a job's LoRA changes the FLUX.2 render inside the mask, twice the same, bad files refused",
          "[render][cli][lora]") {
  REQUIRE(fs::exists(render_binary()));
  LoraDir d;
  const std::string job = d.job("lora.json", kTwoEdits);
  const RenderRun first = run_render(d.args(job), d.dir.file("run1"));
  INFO(first.err);
  REQUIRE(first.code == 0);
  CHECK(count_lines_starting(first.out, "Saved: ") == 2);
  const std::string plain = d.dir.file("out/plain.png"), lora = d.dir.file("out/lora.png");
  {
    c10::InferenceMode guard;
    const Differences diff = differences(pixels(plain), pixels(lora), pixels(d.dir.file("hills_128_mask.png")));
    CHECK(diff.kept == 0);    // outside the mask both are the template
    CHECK(diff.masked > 0);   // inside, the LoRA changes the edit
  }
  // The job hash records the LoRA's bytes and strength.
  const std::string canonical = render::read_output_stamp(lora, render::kCanonicalKeyword).value_or("");
  INFO(canonical);
  CHECK(canonical.find("\"adapters\":[{\"sha256\":\"") != std::string::npos);
  CHECK(canonical.find("\"strength\":1.5}]") != std::string::npos);
  CHECK(render::read_output_stamp(plain, render::kCanonicalKeyword).value_or("adapters").find("adapters") ==
        std::string::npos);

  // The same job again: up to date; forced, the same bytes (hash stamp included).
  const RenderRun again = run_render(d.args(job), d.dir.file("run2"));
  CHECK(again.code == 0);
  CHECK(count_lines_starting(again.out, "Skipped: ") == 2);
  const std::vector<std::byte> plain_bytes = file_bytes(plain), lora_bytes = file_bytes(lora);
  const RenderRun forced = run_render(d.args(job, {"--force"}), d.dir.file("run3"));
  INFO(forced.err);
  REQUIRE(forced.code == 0);
  CHECK(count_lines_starting(forced.out, "Saved: ") == 2);
  CHECK((file_bytes(plain) == plain_bytes));
  CHECK((file_bytes(lora) == lora_bytes));

  // A LoRA for another model size: refused by the model, naming the file and the key.
  const std::string wide = d.job("wide.json", R"([{"adapters": [{"file": "loras/style.safetensors"},
      {"file": "loras/wider.safetensors", "strength": 0.5}], "output": "wide/{seed}.png"}])");
  require_refused(run_render(d.args(wide), d.dir.file("wide")), wide, "/edits/0/adapters/1/file",
                  {d.dir.file("loras/wider.safetensors"), "diffusion_model.", "; expected a LoRA .safetensors file for model "});
  CHECK_FALSE(fs::exists(d.dir.file("wide")));
  // A missing file and a file that is no safetensors file: refused while reading the job.
  const std::string missing = d.job("missing.json", R"([{"adapters": [{"file": "loras/absent.safetensors"}],
      "output": "missing/{seed}.png"}])");
  require_refused(run_render(d.args(missing), d.dir.file("missing")), missing, "/edits/0/adapters/0/file",
                  {d.dir.file("loras/absent.safetensors") + " does not exist", "expected the path of a LoRA .safetensors file"});
  const std::string image = d.job("image.json", R"([{"adapters": [{"file": "hills_128.png"}], "output": "image/{seed}.png"}])");
  require_refused(run_render(d.args(image), d.dir.file("image")), image, "/edits/0/adapters/0/file",
                  {"is not a safetensors file"});
  // A strength out of the table's range.
  const std::string strong = d.job("strong.json", R"([{"adapters": [{"file": "loras/style.safetensors", "strength": 12}],
      "output": "strong/{seed}.png"}])");
  require_refused(run_render(d.args(strong), d.dir.file("strong")), strong, "/edits/0/adapters/0/strength",
                  {"is 12; expected a number in -10..10"});
  // The bundled infill-tiny-2 (the job names no model) is a FLUX.2 model of another size.
  const std::string bundled = d.job("bundled.json", R"([{"adapters": [{"file": "loras/style.safetensors"}],
      "output": "bundled/{seed}.png"}])", false);
  require_refused(run_render(d.args(bundled), d.dir.file("bundled")), bundled, "/edits/0/adapters/0/file",
                  {"a LoRA for another model size?", "expected a LoRA .safetensors file for model infill-tiny-2"});
}

TEST_CASE("infill-render: a job's reference images change the FLUX.2 render inside the mask, bad ones refused",
          "[render][cli][lora][references]") {
  REQUIRE(fs::exists(render_binary()));
  LoraDir d;
  const std::string job = d.job("refs.json", kReferenceEdits);
  const RenderRun r = run_render(d.args(job), d.dir.file("run"));
  INFO(r.err);
  REQUIRE(r.code == 0);
  CHECK(count_lines_starting(r.out, "Saved: ") == 3);
  {
    c10::InferenceMode guard;
    const PixelImage mask = pixels(d.dir.file("hills_128_mask.png")), plain = pixels(d.dir.file("ref/plain.png"));
    for (const char* name : {"ref/dusk.png", "ref/both.png"}) {
      INFO(name);
      const Differences diff = differences(plain, pixels(d.dir.file(name)), mask);
      CHECK(diff.kept == 0);
      CHECK(diff.masked > 0);
    }
  }
  const std::string canonical = render::read_output_stamp(d.dir.file("ref/both.png"), render::kCanonicalKeyword).value_or("");
  INFO(canonical);
  CHECK(canonical.find("\"references\":[\"") != std::string::npos);
  CHECK(canonical.find("\"adapters\":[{") != std::string::npos);
  const RenderRun again = run_render(d.args(job), d.dir.file("again"));
  CHECK(count_lines_starting(again.out, "Skipped: ") == 3);

  // Smaller than a reference may be: refused while the job loads, naming the file and the limit.
  const std::string small = d.job("small.json", R"([{"references": ["dusk_256.png", "small.png"], "output": "small/{seed}.png"}])");
  require_refused(
      run_render(d.args(small), d.dir.file("small")), small, "/edits/0/references/1",
      {d.dir.file("small.png"), "is 40x40 pixels; a reference is at least 64 pixels a side",
       kReferenceSizeExpected});
  CHECK_FALSE(fs::exists(d.dir.file("small")));
  const std::string missing = d.job("nofile.json", R"([{"references": ["absent.png"], "output": "nofile/{seed}.png"}])");
  require_refused(run_render(d.args(missing), d.dir.file("nofile")), missing, "/edits/0/references/0",
                  {d.dir.file("absent.png") + " does not exist"});
}

TEST_CASE("infill-render --engine: uploads a job's LoRAs and reference images, the engine applies them and refuses "
          "a LoRA for another model", "[render][cli][remote][lora]") {
  REQUIRE(fs::exists(render_binary()));
  LoraDir d;
  EngineProcess engine(d.dir.path(), 2, d.dir.file("flux2"));
  INFO(engine.log());
  REQUIRE(engine.ready());
  const std::string where = "unix:" + engine.socket();
  const std::string job = d.job("lora.json", kTwoEdits), refs = d.job("refs.json", kReferenceEdits);
  for (const std::string& j : {job, refs}) {
    const RenderRun r = run_render({j, "--engine", where}, d.dir.file("remote"));
    INFO(r.err);
    REQUIRE(r.code == 0);
    CHECK(r.err.empty());
  }
  {
    c10::InferenceMode guard;
    const PixelImage mask = pixels(d.dir.file("hills_128_mask.png"));
    const Differences lora = differences(pixels(d.dir.file("out/plain.png")), pixels(d.dir.file("out/lora.png")), mask);
    CHECK(lora.kept == 0);
    CHECK(lora.masked > 0);
    const PixelImage plain = pixels(d.dir.file("ref/plain.png"));
    for (const char* name : {"ref/dusk.png", "ref/both.png"}) {
      INFO(name);
      const Differences diff = differences(plain, pixels(d.dir.file(name)), mask);
      CHECK(diff.kept == 0);
      CHECK(diff.masked > 0);
    }
  }
  // The engine's model decides the hash: the embedded engine on the same folder finds every
  // output up to date.
  for (const std::string& j : {job, refs}) {
    const RenderRun local = run_render(d.args(j), d.dir.file("local"));
    INFO(local.err);
    CHECK(local.code == 0);
    CHECK(count_lines_starting(local.out, "Saved: ") == 0);
  }
  // The engine reads an uploaded LoRA for its model: one for another size is refused before
  // any item, as a job error naming the entry.
  const std::string wide = d.job("wide.json", R"([{"adapters": [{"file": "loras/wider.safetensors"}],
      "output": "wide/{seed}.png"}])");
  require_refused(run_render({wide, "--engine", where}, d.dir.file("wide")), wide, "/edits/0/adapters/0/file",
                  {"refused the LoRA " + d.dir.file("loras/wider.safetensors"), "invalid_adapter",
                   "; expected a LoRA .safetensors file for model "});
  CHECK_FALSE(fs::exists(d.dir.file("wide")));
  // A reference the engine would refuse for its size (it takes any template, and checks a
  // reference's size only when an edit names it): refused while the job loads, before the
  // first edit (which needs no reference) runs.
  const std::string small = d.job("small.json", R"([{"name": "first", "output": "small/first.png"},
      {"name": "second", "references": ["small.png"], "output": "small/{seed}.png"}])");
  require_refused(run_render({small, "--engine", where}, d.dir.file("small")), small,
                  "/edits/1/references/0",
                  {"reference image " + d.dir.file("small.png") +
                       " is 40x40 pixels; a reference is at least 64 pixels a side",
                   kReferenceSizeExpected});
  CHECK_FALSE(fs::exists(d.dir.file("small")));
}
