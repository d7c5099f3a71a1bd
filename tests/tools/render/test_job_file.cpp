// Job files: schema errors name the file, the JSON pointer and what was expected; expansion
// into items, output patterns, --items ranges, job hashes and the PNG text stamp.
#include "support/catch.h"

#include <filesystem>
#include <fstream>

#include <infill_protocol/edit_parameters.h>
#include <nlohmann/json.hpp>

#include "item_range.h"
#include "job_error.h"
#include "job_file.h"
#include "job_items.h"
#include "output_pattern.h"
#include "png_text.h"
#include "support/temp_dir.h"

using namespace infill;
using namespace infill::render;
using infill::test::require_job_error;
namespace fs = std::filesystem;

namespace {

const std::string kGolden = std::string(INFILL_SOURCE_DIR) + "/tests/data/golden";

// A temp folder with the golden template and mask, and a job file written from `text`.
struct JobDir {
  test::TempDir dir{"infill-job"};
  JobDir() {
    fs::copy_file(kGolden + "/hills_128.png", dir.file("t.png"));
    fs::copy_file(kGolden + "/hills_128_mask.png", dir.file("m.png"));
    fs::copy_file(std::string(INFILL_SOURCE_DIR) + "/resources/templates/sample_mask.png", dir.file("big_mask.png"));
  }
  Result<Job> parse(const std::string& text) const { return parse_job(text, dir.file("job.json")); }
};

const char* kEdit = R"("template": "t.png", "mask": "m.png", "output": "out/{name}_{seed}.png")";

std::string job_with(const std::string& edit_fields, const std::string& top = "") {
  return std::string(R"({"format": "infill-job/1", )") + top + R"("edits": [{)" + kEdit +
         (edit_fields.empty() ? "" : ", " + edit_fields) + "}]}";
}

BackendInfo tiny_info() {
  BackendInfo info;
  info.model_id = "infill-tiny@test";
  info.default_steps = 16;
  info.default_sampler = "euler_rf";
  info.default_guidance = 3.0;
  info.vocabulary = std::vector<std::string>{"red", "green", "blue", "bright", "dark"};
  return info;
}


}  // namespace

TEST_CASE("job file: a valid job expands into items with defaults and resolved paths", "[render][job]") {
  JobDir d;
  auto job = d.parse(R"({"format": "infill-job/1",
    "defaults": {"steps": 6, "prompt": "green", "output": "r/{name}-{seed}-{item:03}.png"},
    "edits": [
      {"template": "t.png", "mask": "m.png", "seeds": [5, 7]},
      {"name": "b", "template": "t.png", "mask": "m.png", "seeds": {"first": 10, "count": 3}, "steps": 4}
    ]})");
  REQUIRE(job.ok());
  REQUIRE(job->items.size() == 5);
  CHECK(job->items[0].output == d.dir.file("r/t-5-001.png"));
  CHECK(job->items[1].output == d.dir.file("r/t-7-002.png"));
  CHECK(job->items[4].output == d.dir.file("r/b-12-005.png"));
  CHECK(job->items[4].seed == 12);
  CHECK(job->edits[0].steps.value == 6);
  CHECK(job->edits[0].steps.pointer == "/defaults/steps");
  CHECK(job->edits[1].steps.value == 4);
  CHECK(job->edits[1].steps.pointer == "/edits/1/steps");
  CHECK(job->edits[0].width == 128);
  CHECK(job->edits[0].template_sha256.size() == 64);
  CHECK(job->edits[0].template_path.value == d.dir.file("t.png"));
}

TEST_CASE("job file: schema errors name the file, the JSON pointer and what was expected", "[render][job]") {
  JobDir d;
  const std::string f = d.dir.file("job.json");
  require_job_error(d.parse("{\"format\": "), f, "/", "a JSON document");
  require_job_error(d.parse("[]"), f, "/", "an object");
  require_job_error(d.parse(R"({"edits": []})"), f, "/format", "\"infill-job/1\"");
  require_job_error(d.parse(R"({"format": "infill-job/1", "edits": []})"), f, "/edits", "a non-empty array");
  require_job_error(d.parse(job_with(R"("stepz": 3)")), f, "/edits/0/stepz", "one of");
  require_job_error(d.parse(job_with("", R"("colour": 1, )")), f, "/colour", "one of");
  require_job_error(d.parse(job_with(R"("steps": "8")")), f, "/edits/0/steps", "an integer in 1..1000");
  require_job_error(d.parse(job_with(R"("steps": 8.5)")), f, "/edits/0/steps", "an integer in 1..1000");
  require_job_error(d.parse(job_with(R"("steps": 0)")), f, "/edits/0/steps", "an integer in 1..1000");
  require_job_error(d.parse(job_with(R"("strength": 0)")), f, "/edits/0/strength", "(0, 1]");
  require_job_error(d.parse(job_with(R"("guidance": 50)")), f, "/edits/0/guidance", "1..20");
  require_job_error(d.parse(job_with(R"("sampler": "heun")")), f, "/edits/0/sampler", "one of euler_rf|ddim");
  require_job_error(d.parse(job_with(R"("seeds": [])")), f, "/edits/0/seeds", "a non-empty array");
  require_job_error(d.parse(job_with(R"("seeds": [1, -2])")), f, "/edits/0/seeds/1", "an integer");
  require_job_error(d.parse(job_with(R"("seeds": [3, 3])")), f, "/edits/0/seeds/1", "distinct seeds");
  require_job_error(d.parse(job_with(R"("seed": 1, "seeds": [2])")), f, "/edits/0/seeds", "one of them");
  require_job_error(d.parse(job_with(R"("seeds": {"first": 1})")), f, "/edits/0/seeds", "\"count\"");
  require_job_error(d.parse(job_with(R"("name": "a b")")), f, "/edits/0/name", "A-Z a-z 0-9");
  require_job_error(d.parse(job_with("", R"("defaults": {"steps": -1}, )")), f, "/defaults/steps", "1..1000");
  require_job_error(d.parse(job_with("", R"("deadline_s": 0, )")), f, "/deadline_s", "(0, 1e7]");
}

TEST_CASE("job file: missing files, undecodable images and mask size mismatches", "[render][job]") {
  JobDir d;
  const std::string f = d.dir.file("job.json");
  auto r = d.parse(R"({"format": "infill-job/1", "edits": [{"template": "nope.png", "mask": "m.png", "output": "o.png"}]})");
  require_job_error(r, f, "/edits/0/template", "readable template image");
  CHECK(r.status().message().find(d.dir.file("nope.png")) != std::string::npos);
  std::ofstream(d.dir.file("junk.png")) << "not an image";
  r = d.parse(R"({"format": "infill-job/1", "edits": [{"template": "t.png", "mask": "junk.png", "output": "o.png"}]})");
  require_job_error(r, f, "/edits/0/mask", "readable mask image");
  r = d.parse(R"({"format": "infill-job/1", "edits": [{"template": "t.png", "mask": "big_mask.png", "output": "o.png"}]})");
  require_job_error(r, f, "/edits/0/mask", "a mask of the template's size");
  CHECK(r.status().message().find("is 512x512") != std::string::npos);
  CHECK(r.status().message().find("is 128x128") != std::string::npos);
  // A missing job file.
  auto missing = load_job(d.dir.file("absent.json"));
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().message().find(d.dir.file("absent.json")) != std::string::npos);
}

TEST_CASE("job file: output patterns are checked and must not collide", "[render][job]") {
  JobDir d;
  const std::string f = d.dir.file("job.json");
  auto pattern = [&](const std::string& p, const std::string& seeds = "[1]") {
    return d.parse(R"({"format": "infill-job/1", "edits": [{"template": "t.png", "mask": "m.png", "seeds": )" + seeds +
                   R"(, "output": ")" + p + R"("}]})");
  };
  require_job_error(pattern("out/{frame}.png"), f, "/edits/0/output", "{item}, {seed}, {name}");
  require_job_error(pattern("out/{seed.png"), f, "/edits/0/output", "{item}, {seed}, {name}");
  require_job_error(pattern("out/{seed}.jpg"), f, "/edits/0/output", "ending in .png");
  require_job_error(pattern("out/same.png", "[1, 2]"), f, "/edits/0/output", "its own file");
  CHECK(pattern("out/{seed}.png", "[1, 2]").ok());
  CHECK(pattern("out/{seed}.tif", "[1, 2]").ok());
  CHECK(pattern("out/{seed}.EXR", "[1, 2]").ok());
  CHECK(output_file_format("a/b.TIFF") == "tiff");
  CHECK(output_file_format("a/b.exr") == "exr");
  CHECK(output_file_format("a/b.png") == "png");
  CHECK_FALSE(output_file_format("a/b.jpg").has_value());

  CHECK(check_output_pattern("a/{item:04}_{seed}_{name}.png").ok());
  CHECK_FALSE(check_output_pattern("{item:x}").ok());
  CHECK_FALSE(check_output_pattern("a}b").ok());
  CHECK(expand_output_pattern("a/{item:04}_{seed}_{name}.png", {7, 42, "sky"}) == "a/0007_42_sky.png");
  CHECK(expand_output_pattern("{item}{item:2}", {123, 0, ""}) == "123123");
}

TEST_CASE("item ranges (--items): ranges, single items, open ends and bad ranges", "[render][items]") {
  auto r = parse_item_range("3-5", 10);
  REQUIRE(r.ok());
  CHECK(r->first == 3);
  CHECK(r->last == 5);
  CHECK(r->count() == 3);
  r = parse_item_range("4", 10);
  REQUIRE(r.ok());
  CHECK((r->first == 4 && r->last == 4));
  r = parse_item_range("8-", 10);
  REQUIRE(r.ok());
  CHECK((r->first == 8 && r->last == 10));
  for (const char* bad : {"5-3", "0-2", "1-11", "11", "a-b", "", "-3", "1-2-3", "1.5-2", "1-x"}) {
    auto b = parse_item_range(bad, 10);
    INFO(bad);
    REQUIRE_FALSE(b.ok());
    CHECK(b.status().message().rfind(std::string("--items ") + bad + ":", 0) == 0);
    CHECK(b.status().message().find("expected A-B") != std::string::npos);
  }
}

TEST_CASE("job hash: covers model, template and mask bytes and every parameter, not paths", "[render][hash]") {
  JobDir d;
  auto hash_of = [&](const std::string& fields, const BackendInfo& info = tiny_info()) {
    auto job = d.parse(job_with(fields));
    REQUIRE(job.ok());
    auto items = resolve_items(*job, info);
    REQUIRE(items.ok());
    return (*items)[0].hash;
  };
  const std::string base = hash_of(R"("prompt": "green", "seed": 1)");
  CHECK(base.size() == 64);
  CHECK(hash_of(R"("prompt": "green", "seed": 1)") == base);
  CHECK(hash_of(R"("prompt": "  GREEN ", "seed": 1)") == base);  // normalised words
  CHECK(hash_of(R"("prompt": "green", "seed": 1, "steps": 16)") == base);  // the model's default
  CHECK(hash_of(R"("prompt": "green", "seed": 1, "name": "other")") == base);
  for (const char* changed : {R"("prompt": "blue", "seed": 1)", R"("prompt": "green", "seed": 2)",
                              R"("prompt": "green", "seed": 1, "steps": 5)", R"("prompt": "green", "seed": 1, "strength": 0.5)",
                              R"("prompt": "green", "seed": 1, "guidance": 2)", R"("prompt": "green", "seed": 1, "sampler": "ddim")",
                              R"("prompt": "green", "seed": 1, "halo": 2)", R"("prompt": "green", "seed": 1, "feather": 1)"}) {
    INFO(changed);
    CHECK(hash_of(changed) != base);
  }
  BackendInfo other = tiny_info();
  other.model_id = "infill-tiny@other";
  CHECK(hash_of(R"("prompt": "green", "seed": 1)", other) != base);
  // The mask's bytes: a different mask file of the same size.
  fs::copy_file(kGolden + "/hills_128.png", d.dir.file("m2.png"));
  auto job = d.parse(R"({"format": "infill-job/1", "edits": [{"template": "t.png", "mask": "m2.png", "prompt": "green", "seed": 1, "output": "out/{name}_{seed}.png"}]})");
  REQUIRE(job.ok());
  CHECK((*resolve_items(*job, tiny_info()))[0].hash != base);
}

TEST_CASE("job items: prompt words are checked against the model's vocabulary", "[render][job]") {
  JobDir d;
  auto job = d.parse(job_with(R"("prompt": "green purplish")"));
  REQUIRE(job.ok());
  auto items = resolve_items(*job, tiny_info());
  REQUIRE_FALSE(items.ok());
  const std::string& m = items.status().message();
  CHECK(m.rfind(d.dir.file("job.json") + ": /edits/0/prompt: word \"purplish\"", 0) == 0);
  CHECK(m.find("expected words from: red green blue bright dark") != std::string::npos);
  BackendInfo small = tiny_info();
  small.max_image_pixels = 100 * 100;
  auto big = resolve_items(*d.parse(job_with(R"("prompt": "green")")), small);
  REQUIRE_FALSE(big.ok());
  CHECK(big.status().message().rfind(d.dir.file("job.json") + ": /edits/0/template: ", 0) == 0);
  CHECK(big.status().message().find("is 128x128 = 16384 pixels; expected at most 10000 pixels") != std::string::npos);
  BackendInfo no_prompt = tiny_info();
  no_prompt.vocabulary.reset();
  auto none = resolve_items(*job, no_prompt);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().message().find("takes no prompt") != std::string::npos);
}

TEST_CASE("PNG text: a stamped PNG reads back, anything else reads as unstamped", "[render][png]") {
  test::TempDir dir("infill-png");
  std::ifstream in(kGolden + "/hills_128_mask.png", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> png(reinterpret_cast<const std::byte*>(raw.data()),
                             reinterpret_cast<const std::byte*>(raw.data()) + raw.size());
  auto stamped = add_png_text(png, {{"infill:job-hash", "abc123"}, {"infill:job", "{\"a\":1}"}});
  REQUIRE(stamped.ok());
  {
    std::ofstream out(dir.file("s.png"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(stamped->data()), static_cast<std::streamsize>(stamped->size()));
  }
  CHECK(read_png_text(dir.file("s.png"), "infill:job-hash") == std::optional<std::string>("abc123"));
  CHECK(read_png_text(dir.file("s.png"), "infill:job") == std::optional<std::string>("{\"a\":1}"));
  CHECK_FALSE(read_png_text(dir.file("s.png"), "infill:job-has").has_value());
  CHECK_FALSE(read_png_text(kGolden + "/hills_128_mask.png", "infill:job-hash").has_value());
  CHECK_FALSE(read_png_text(dir.file("absent.png"), "infill:job-hash").has_value());
  CHECK_FALSE(add_png_text({}, {{"k", "v"}}).ok());
  CHECK_FALSE(add_png_text(png, {{"", "v"}}).ok());
  // The stamped file still decodes (CRCs right): checked by the CLI tests through OIIO.
}

TEST_CASE("job file: docs/job.schema.json and the reader take every job parameter's range from the table",
          "[render][job][params]") {
  namespace proto = infill::protocol;
  std::ifstream in(std::string(INFILL_SOURCE_DIR) + "/docs/job.schema.json");
  REQUIRE(in);
  const nlohmann::json schema = nlohmann::json::parse(in);
  const nlohmann::json& defs = schema["$defs"];
  const nlohmann::json& edit_props = schema["properties"]["edits"]["items"]["properties"];
  const nlohmann::json& default_props = schema["properties"]["defaults"]["properties"];
  JobDir d;
  int rows = 0;
  for (const proto::EditParameter& p : proto::kEditParameters) {
    if (!(p.clients & proto::kJobFile)) continue;
    const std::string name(p.job_name);
    INFO(name);
    ++rows;
    REQUIRE(defs.contains(name));
    CHECK(edit_props.contains(name));
    CHECK(default_props.contains(name));
    const nlohmann::json& def = defs[name];
    switch (p.type) {
      case proto::ParamType::kInteger:
      case proto::ParamType::kNumber: {
        CHECK(def["type"] == (p.type == proto::ParamType::kInteger ? "integer" : "number"));
        CHECK(def[p.min_exclusive ? "exclusiveMinimum" : "minimum"].get<double>() == p.min);
        CHECK_FALSE(def.contains(p.min_exclusive ? "minimum" : "exclusiveMinimum"));
        CHECK(def["maximum"].get<double>() == p.max);
        // The reader refuses a value beyond the top, naming the table's range.
        const std::string beyond = p.type == proto::ParamType::kInteger ? nlohmann::json(int64_t(p.max) + 1).dump()
                                                                        : nlohmann::json(p.max + 0.5).dump();
        if (name != "seed") {  // seeds are checked with "seeds" below
          auto r = d.parse(job_with("\"" + name + "\": " + beyond));
          require_job_error(r, d.dir.file("job.json"), "/edits/0/" + name, proto::range_text(p));
        }
        break;
      }
      case proto::ParamType::kEnum: {
        std::string choices;
        for (const auto& c : def["enum"]) {
          if (!choices.empty()) choices += '|';
          choices += c.get<std::string>();
        }
        CHECK(choices == p.choices);
        break;
      }
      case proto::ParamType::kString:
        CHECK(def["type"] == "string");
        if (p.max_length > 0) CHECK(def["maxLength"].get<size_t>() == p.max_length);
        break;
      case proto::ParamType::kRectangle:
        FAIL("no rectangle parameters in job files");
        break;
      case proto::ParamType::kAdapterList: {
        // [{"file", "strength"}]: the count and the strengths' range (test_job_inputs.cpp
        // checks the reader's refusals of each).
        CHECK(def["type"] == "array");
        CHECK(def["maxItems"].get<size_t>() == p.max_length);
        const nlohmann::json& strength = def["items"]["properties"]["strength"];
        CHECK(strength["type"] == "number");
        CHECK(strength["minimum"].get<double>() == p.min);
        CHECK(strength["maximum"].get<double>() == p.max);
        CHECK(def["items"]["required"] == nlohmann::json::array({"file"}));
        auto r = d.parse(job_with("\"" + name + "\": [{\"file\": \"t.png\", \"strength\": " +
                                  nlohmann::json(p.max + 0.5).dump() + "}]"));
        require_job_error(r, d.dir.file("job.json"), "/edits/0/" + name + "/0/strength", proto::range_text(p));
        break;
      }
      case proto::ParamType::kTemplateList: {
        // [image path]: the count; distinct images.
        CHECK(def["type"] == "array");
        CHECK(def["maxItems"].get<size_t>() == p.max_length);
        CHECK(def["uniqueItems"] == true);
        CHECK(def["items"]["type"] == "string");
        std::string paths;
        for (size_t i = 0; i <= p.max_length; ++i) paths += std::string(i ? ", " : "") + "\"t.png\"";
        auto r = d.parse(job_with("\"" + name + "\": [" + paths + "]"));
        require_job_error(r, d.dir.file("job.json"), "/edits/0/" + name, "at most " + std::to_string(p.max_length));
        break;
      }
    }
  }
  CHECK(rows == 11);  // template prompt seed steps strength guidance sampler halo feather adapters references
  // Seeds: single, listed and counted, all bounded by the table's seed range.
  const proto::EditParameter& seed = proto::edit_parameter("seed");
  CHECK(defs["seeds"]["oneOf"][0]["items"]["maximum"].get<double>() == seed.max);
  CHECK(defs["seeds"]["oneOf"][1]["properties"]["first"]["maximum"].get<double>() == seed.max);
  require_job_error(d.parse(job_with(R"("seeds": [9007199254740992])")), d.dir.file("job.json"), "/edits/0/seeds/0",
                    proto::range_text(seed));
  require_job_error(d.parse(job_with(R"("seeds": {"first": 9007199254740991, "count": 2})")), d.dir.file("job.json"),
                    "/edits/0/seeds/first", proto::range_text(seed));
  auto top = d.parse(job_with(R"("seeds": {"first": 9007199254740990, "count": 2}, "halo": 64)"));
  REQUIRE(top.ok());
  CHECK(top->edits[0].seeds.value.back() == 9007199254740991ull);
  CHECK(top->edits[0].halo.value == 64);
}
