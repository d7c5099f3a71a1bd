// Job files' LoRAs ("adapters") and reference images ("references"): parsed with the pointer of
// every entry, files checked (a LoRA must be a safetensors file, a reference a readable image),
// the table's limits, the job hash, and the backend's refusals reported as job errors.
#include "support/catch.h"

#include <filesystem>
#include <fstream>
#include <set>

#include <infill_protocol/edit_parameters.h>

#include "job_error.h"
#include "job_file.h"
#include "job_items.h"
#include "pipeline/image_io.h"
#include "support/temp_dir.h"

using namespace infill;
using namespace infill::render;
using infill::test::require_job_error;
namespace fs = std::filesystem;

namespace {

const std::string kGolden = std::string(INFILL_SOURCE_DIR) + "/tests/data/golden";

// A safetensors file holding no tensors (the container is all the job reader checks).
void write_empty_safetensors(const std::string& path, const std::string& tag) {
  const std::string header = R"({"__metadata__":{"tag":")" + tag + R"("}})";
  std::string bytes(8, '\0');
  for (size_t i = 0; i < 8; ++i) bytes[i] = static_cast<char>((uint64_t(header.size()) >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << bytes << header;
}

// A grey `width` x `height` PNG.
void write_grey_png(const std::string& path, int width, int height) {
  PixelImage img;
  img.width = width;
  img.height = height;
  img.channels = 3;
  img.data.assign(static_cast<size_t>(width) * height * 3, std::byte{90});
  REQUIRE(save_image(path, img).ok());
}

struct InputsDir {
  test::TempDir dir{"infill-job-inputs"};
  InputsDir() {
    fs::copy_file(kGolden + "/hills_128.png", dir.file("t.png"));
    fs::copy_file(kGolden + "/hills_128_mask.png", dir.file("m.png"));
    fs::create_directories(dir.file("loras"));
    write_empty_safetensors(dir.file("loras/a.safetensors"), "a");
    write_empty_safetensors(dir.file("loras/b.safetensors"), "b");
    fs::copy_file(kGolden + "/hills_128.png", dir.file("ref1.png"));
    fs::copy_file(kGolden + "/hills_128_mask.png", dir.file("ref2.png"));
  }
  std::string job() const { return dir.file("job.json"); }
  Result<Job> parse(const std::string& text) const { return parse_job(text, job()); }
  // One edit with `fields` and the job's top-level `top`.
  Result<Job> edit(const std::string& fields, const std::string& top = "") const {
    return parse(R"({"format": "infill-job/1", )" + top +
                 R"("edits": [{"template": "t.png", "mask": "m.png", "output": "out/{seed}.png", )" + fields + "}]}");
  }
};


BackendInfo flux2_info() {
  BackendInfo info;
  info.model_id = "flux2@test";
  info.where = "scripted";
  info.default_steps = 4;
  info.default_sampler = "euler_rf";
  info.free_text = true;
  return info;
}

// Takes every LoRA and reference except the files it is told to refuse; counts the loads.
class InputsBackend final : public RenderBackend {
 public:
  std::set<std::string> refuse;
  RenderFailure refusal = RenderFailure::kBadInput;
  std::vector<std::string> loaded;
  const BackendInfo& info() const override { return info_; }
  Status submit(const RenderEdit&, RenderEvents, RenderFailure&) override { return {}; }
  void cancel(uint64_t) override {}
  Status load_adapter(const std::string& path, RenderFailure& failure) override { return load(path, failure); }
  Status load_reference(const std::string& path, RenderFailure& failure) override { return load(path, failure); }

 private:
  Status load(const std::string& path, RenderFailure& failure) {
    loaded.push_back(path);
    if (!refuse.count(path)) return {};
    failure = refusal;
    return invalid_argument("LoRA " + path + ": key diffusion_model.x.lora_A.weight is [4, 128], expected [4, 64]");
  }
  BackendInfo info_ = flux2_info();
};

}  // namespace

TEST_CASE("job file: adapters and references parse with defaults, pointers and the files' SHA-256", "[render][job][lora]") {
  InputsDir d;
  auto job = d.parse(R"({"format": "infill-job/1",
    "defaults": {"adapters": [{"file": "loras/a.safetensors"}], "references": ["ref1.png"]},
    "edits": [
      {"template": "t.png", "mask": "m.png", "output": "o/1_{seed}.png"},
      {"template": "t.png", "mask": "m.png", "output": "o/2_{seed}.png",
       "adapters": [{"file": "loras/b.safetensors", "strength": -0.5}, {"file": "loras/a.safetensors", "strength": 2}],
       "references": ["ref2.png", "ref1.png"]},
      {"template": "t.png", "mask": "m.png", "output": "o/3_{seed}.png", "adapters": [], "references": []}
    ]})");
  INFO((job.ok() ? "" : job.status().message()));
  REQUIRE(job.ok());
  const JobEdit& first = job->edits[0];
  REQUIRE(first.adapters.value.size() == 1);
  CHECK(first.adapters.pointer == "/defaults/adapters");
  CHECK(first.adapters.value[0].file.value == d.dir.file("loras/a.safetensors"));
  CHECK(first.adapters.value[0].file.pointer == "/defaults/adapters/0/file");
  CHECK(first.adapters.value[0].strength.value == 1.0);  // the API's default
  CHECK(first.adapters.value[0].sha256.size() == 64);
  REQUIRE(first.references.value.size() == 1);
  CHECK(first.references.value[0].file.pointer == "/defaults/references/0");

  // An edit's own list replaces the defaults' (no merging), in its order.
  const JobEdit& second = job->edits[1];
  REQUIRE(second.adapters.value.size() == 2);
  CHECK(second.adapters.value[0].file.value == d.dir.file("loras/b.safetensors"));
  CHECK(second.adapters.value[0].strength.value == -0.5);
  CHECK(second.adapters.value[1].file.pointer == "/edits/1/adapters/1/file");
  CHECK(second.adapters.value[1].strength.pointer == "/edits/1/adapters/1/strength");
  CHECK(second.adapters.value[1].sha256 == first.adapters.value[0].sha256);
  CHECK(second.adapters.value[0].sha256 != first.adapters.value[0].sha256);
  REQUIRE(second.references.value.size() == 2);
  CHECK(second.references.value[0].file.value == d.dir.file("ref2.png"));
  CHECK(second.references.value[1].file.pointer == "/edits/1/references/1");
  // [] = none.
  CHECK(job->edits[2].adapters.value.empty());
  CHECK(job->edits[2].references.value.empty());

  // Resolved items carry them to the backend.
  auto items = resolve_items(*job, flux2_info());
  REQUIRE(items.ok());
  const RenderEdit& r = (*items)[1].render;
  REQUIRE(r.adapters.size() == 2);
  CHECK(r.adapters[0].path == d.dir.file("loras/b.safetensors"));
  CHECK(r.adapters[0].strength == -0.5);
  CHECK(r.adapters[1].sha256 == first.adapters.value[0].sha256);
  REQUIRE(r.references.size() == 2);
  CHECK(r.references[1].path == d.dir.file("ref1.png"));
  CHECK((*items)[2].render.adapters.empty());
}

TEST_CASE("job file: bad adapters and references name the file, the entry's pointer and what was expected",
          "[render][job][lora]") {
  InputsDir d;
  const std::string f = d.job();
  const auto& adapters = protocol::edit_parameter("adapters");
  const auto& references = protocol::edit_parameter("references");
  require_job_error(d.edit(R"("adapters": "loras/a.safetensors")"), f, "/edits/0/adapters", "an array of at most 8");
  require_job_error(d.edit(R"("adapters": ["loras/a.safetensors"])"), f, "/edits/0/adapters/0", "{\"file\"");
  require_job_error(d.edit(R"("adapters": [{"file": "loras/a.safetensors", "weight": 1}])"), f,
                    "/edits/0/adapters/0/weight", "one of file, strength");
  require_job_error(d.edit(R"("adapters": [{"strength": 1}])"), f, "/edits/0/adapters/0/file", "LoRA .safetensors");
  require_job_error(d.edit(R"("adapters": [{"file": 7}])"), f, "/edits/0/adapters/0/file", "LoRA .safetensors");
  // A missing file: the pointer of the entry's file and the path.
  auto missing = d.edit(R"("adapters": [{"file": "loras/a.safetensors"}, {"file": "loras/nope.safetensors"}])");
  require_job_error(missing, f, "/edits/0/adapters/1/file", "the path of a LoRA .safetensors file");
  CHECK(missing.status().message().find(d.dir.file("loras/nope.safetensors") + " does not exist") != std::string::npos);
  // Not a safetensors file at all (an image, a truncated header).
  auto image = d.edit(R"("adapters": [{"file": "t.png"}])");
  require_job_error(image, f, "/edits/0/adapters/0/file", "LoRA .safetensors");
  CHECK(image.status().message().find(d.dir.file("t.png") + " (") != std::string::npos);
  CHECK(image.status().message().find("is not a safetensors file") != std::string::npos);
  std::ofstream(d.dir.file("loras/cut.safetensors"), std::ios::binary) << std::string("\x40\0\0\0\0\0\0\0{\"a\"", 12);
  require_job_error(d.edit(R"("adapters": [{"file": "loras/cut.safetensors"}])"), f, "/edits/0/adapters/0/file",
                    "LoRA .safetensors");
  // Strengths in the table's range.
  require_job_error(d.edit(R"("adapters": [{"file": "loras/a.safetensors", "strength": 11}])"), f,
                    "/edits/0/adapters/0/strength", "a number in " + protocol::range_text(adapters));
  require_job_error(d.edit(R"("adapters": [{"file": "loras/a.safetensors", "strength": "1"}])"), f,
                    "/edits/0/adapters/0/strength", "a number in -10..10");
  CHECK(d.edit(R"("adapters": [{"file": "loras/a.safetensors", "strength": -10}])").ok());
  // At most the table's count.
  std::string nine;
  for (size_t i = 0; i <= adapters.max_length; ++i) nine += std::string(i ? ", " : "") + R"({"file": "loras/a.safetensors"})";
  auto too_many = d.edit(R"("adapters": [)" + nine + "]");
  require_job_error(too_many, f, "/edits/0/adapters", "at most " + std::to_string(adapters.max_length));
  CHECK(too_many.status().message().find("has 9 adapters") != std::string::npos);
  // In the defaults: the defaults' pointer.
  require_job_error(d.edit("\"seed\": 1", R"("defaults": {"adapters": [{"file": "absent.safetensors"}]}, )"), f,
                    "/defaults/adapters/0/file", "LoRA .safetensors");

  require_job_error(d.edit(R"("references": "ref1.png")"), f, "/edits/0/references", "distinct image paths");
  require_job_error(d.edit(R"("references": [3])"), f, "/edits/0/references/0", "reference image");
  auto not_image = d.edit(R"("references": ["ref1.png", "loras/a.safetensors"])");
  require_job_error(not_image, f, "/edits/0/references/1", "the path of a reference image file");
  CHECK(not_image.status().message().find("not a readable image") != std::string::npos);
  require_job_error(d.edit(R"("references": ["ref1.png", "absent.png"])"), f, "/edits/0/references/1", "reference image");
  // The same bytes under another name are the same template on the engine: refused.
  fs::copy_file(d.dir.file("ref1.png"), d.dir.file("ref1_copy.png"));
  auto repeated = d.edit(R"("references": ["ref1.png", "ref1_copy.png"])");
  require_job_error(repeated, f, "/edits/0/references/1", "distinct reference images");
  CHECK(repeated.status().message().find("/edits/0/references/0") != std::string::npos);
  auto five = d.edit(R"("references": ["ref1.png", "ref2.png", "t.png", "m.png", "ref1_copy.png"])");
  require_job_error(five, f, "/edits/0/references", "at most " + std::to_string(references.max_length));

  // Sizes the engine refuses as a reference, read from the header while the job loads (the
  // engine's rule, check_reference_size), so that no item runs first, embedded or remote.
  const std::string size_expected =
      "a reference image of at least 64 pixels a side with an aspect ratio of at most 8";
  write_grey_png(d.dir.file("small.png"), 40, 40);
  write_grey_png(d.dir.file("short.png"), 200, 63);
  write_grey_png(d.dir.file("thin.png"), 600, 64);  // aspect 9.4
  write_grey_png(d.dir.file("edge.png"), 64, 512);  // 64 a side, aspect 8: taken
  auto small = d.edit(R"("references": ["ref1.png", "small.png"])");
  require_job_error(small, f, "/edits/0/references/1", size_expected);
  CHECK(small.status().message().find(
            "reference image " + d.dir.file("small.png") +
            " is 40x40 pixels; a reference is at least 64 pixels a side") != std::string::npos);
  auto short_side = d.edit(R"("references": ["short.png"])");
  require_job_error(short_side, f, "/edits/0/references/0", size_expected);
  CHECK(short_side.status().message().find(d.dir.file("short.png") + " is 200x63 pixels") !=
        std::string::npos);
  auto thin = d.edit(R"("references": ["thin.png"])");
  require_job_error(thin, f, "/edits/0/references/0", size_expected);
  CHECK(thin.status().message().find(
            d.dir.file("thin.png") +
            " is 600x64 pixels; a reference's aspect ratio is at most 8") != std::string::npos);
  require_job_error(d.edit("\"seed\": 1", R"("defaults": {"references": ["thin.png"]}, )"), f,
                    "/defaults/references/0", size_expected);
  CHECK(d.edit(R"("references": ["edge.png"])").ok());
}

TEST_CASE("job hash: covers each LoRA's bytes, strength and order and each reference's bytes, jobs without them keep theirs",
          "[render][hash][lora]") {
  InputsDir d;
  auto item_of = [&](const std::string& fields) {
    auto job = d.edit(R"("prompt": "a red roof", "seed": 1)" + (fields.empty() ? "" : ", " + fields));
    INFO(fields);
    REQUIRE(job.ok());
    auto items = resolve_items(*job, flux2_info());
    REQUIRE(items.ok());
    return (*items)[0];
  };
  const ResolvedItem plain = item_of("");
  // Without them, the canonical JSON has neither key: outputs rendered before stay up to date.
  CHECK(plain.canonical.find("adapters") == std::string::npos);
  CHECK(plain.canonical.find("references") == std::string::npos);
  CHECK(item_of(R"("adapters": [], "references": [])").hash == plain.hash);

  const std::string a = R"({"file": "loras/a.safetensors"})", b = R"({"file": "loras/b.safetensors"})";
  const ResolvedItem with_a = item_of(R"("adapters": [)" + a + "]");
  CHECK(with_a.hash != plain.hash);
  CHECK(with_a.canonical.find(with_a.render.adapters[0].sha256) != std::string::npos);
  CHECK(item_of(R"("adapters": [{"file": "loras/a.safetensors", "strength": 1}])").hash == with_a.hash);
  // The file's bytes count, not its path.
  fs::copy_file(d.dir.file("loras/a.safetensors"), d.dir.file("a_copy.safetensors"));
  CHECK(item_of(R"("adapters": [{"file": "a_copy.safetensors"}])").hash == with_a.hash);
  std::set<std::string> hashes = {plain.hash, with_a.hash};
  for (const std::string& changed : std::vector<std::string>{
           R"("adapters": [{"file": "loras/a.safetensors", "strength": 0.5}])", R"("adapters": [)" + b + "]",
        R"("adapters": [)" + a + ", " + b + "]", R"("adapters": [)" + b + ", " + a + "]",
        std::string(R"("references": ["ref1.png"])"), std::string(R"("references": ["ref2.png"])"),
        std::string(R"("references": ["ref1.png", "ref2.png"])"), std::string(R"("references": ["ref2.png", "ref1.png"])")}) {
    INFO(changed);
    CHECK(hashes.insert(item_of(changed).hash).second);
  }
}

TEST_CASE("load_job_inputs: each file loaded once, a refusal names the file, its pointer and the model", "[render][job][lora]") {
  InputsDir d;
  auto job = d.parse(R"({"format": "infill-job/1",
    "defaults": {"template": "t.png", "mask": "m.png"},
    "edits": [
      {"output": "o/1_{seed}.png", "adapters": [{"file": "loras/a.safetensors"}], "references": ["ref1.png"]},
      {"output": "o/2_{seed}.png", "adapters": [{"file": "loras/a.safetensors"}, {"file": "loras/b.safetensors"}]}
    ]})");
  REQUIRE(job.ok());
  InputsBackend ok;
  RenderFailure failure = RenderFailure::kInternal;
  CHECK(load_job_inputs(*job, ok, failure).ok());
  CHECK(ok.loaded == std::vector<std::string>{d.dir.file("loras/a.safetensors"), d.dir.file("ref1.png"),
                                              d.dir.file("loras/b.safetensors")});

  InputsBackend picky;
  picky.refuse = {d.dir.file("loras/b.safetensors")};
  Status refused = load_job_inputs(*job, picky, failure);
  REQUIRE_FALSE(refused.ok());
  CHECK(failure == RenderFailure::kBadInput);
  const std::string& m = refused.message();
  INFO(m);
  CHECK(m.rfind(d.job() + ": /edits/1/adapters/1/file: LoRA " + d.dir.file("loras/b.safetensors") + ": key ", 0) == 0);
  CHECK(m.find("; expected a LoRA .safetensors file for model flux2@test") != std::string::npos);

  // An engine that went away is not the job's fault: its own message, its own kind.
  InputsBackend gone;
  gone.refuse = {d.dir.file("loras/a.safetensors")};
  gone.refusal = RenderFailure::kEngine;
  Status lost = load_job_inputs(*job, gone, failure);
  REQUIRE_FALSE(lost.ok());
  CHECK(failure == RenderFailure::kEngine);
  CHECK(lost.message().rfind(d.job(), 0) != 0);

  // A backend that takes no adapters (the interface's default) refuses them as a job error.
  struct Plain final : RenderBackend {
    BackendInfo i = flux2_info();
    const BackendInfo& info() const override { return i; }
    Status submit(const RenderEdit&, RenderEvents, RenderFailure&) override { return {}; }
    void cancel(uint64_t) override {}
  } plain;
  Status none = load_job_inputs(*job, plain, failure);
  REQUIRE_FALSE(none.ok());
  CHECK(none.message().rfind(d.job() + ": /edits/0/adapters/0/file: engine scripted takes no LoRA adapters", 0) == 0);
}
