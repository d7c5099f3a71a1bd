#include <infill_protocol/edit_parameters.h>

#include "job_file.h"

#include <OpenImageIO/imageio.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/hash.h"
#include "output_pattern.h"
#include "pipeline/reference_size.h"

namespace infill::render {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kFormat = "infill-job/1";
constexpr size_t kMaxSeedsPerEdit = 100000;

std::string shown(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "a value";
  }
}

// Collects the first error; every check is a no-op once one is recorded.
class Checker {
 public:
  explicit Checker(std::string file) : file_(std::move(file)) {}
  bool failed() const { return !status_.ok(); }
  const Status& status() const { return status_; }
  void fail(const std::string& pointer, const std::string& what, const std::string& expected) {
    if (!failed()) status_ = job_error(file_, pointer, what, expected);
  }
  const std::string& file() const { return file_; }

 private:
  std::string file_;
  Status status_;
};

// The allowed keys of an object; anything else is an error (typos must not pass silently).
void check_keys(Checker& c, const json& obj, const std::string& pointer, const std::set<std::string>& allowed) {
  for (const auto& [key, value] : obj.items()) {
    if (!allowed.count(key)) {
      std::string list;
      for (const auto& k : allowed) list += (list.empty() ? "" : ", ") + k;
      c.fail(pointer + "/" + key, "unknown field \"" + key + "\"", "one of " + list);
      return;
    }
  }
}

// A field of an edit: the edit's own value, else the default's, else absent.
struct Lookup {
  const json* value = nullptr;
  std::string pointer;
};

Lookup find(const json& edit, const std::string& edit_ptr, const json* defaults, const std::string& key) {
  if (edit.contains(key)) return {&edit[key], edit_ptr + "/" + key};
  if (defaults && defaults->contains(key)) return {&(*defaults)[key], "/defaults/" + key};
  return {nullptr, edit_ptr + "/" + key};
}

void get_int(Checker& c, const Lookup& l, int lo, int hi, int fallback, Field<int>& out) {
  out = {fallback, l.pointer};
  if (!l.value) return;
  const json& v = *l.value;
  const std::string expected = "an integer in " + std::to_string(lo) + ".." + std::to_string(hi);
  if (!v.is_number_integer()) return c.fail(l.pointer, "is " + shown(v) + " (" + type_name(v) + ")", expected);
  const auto n = v.get<int64_t>();
  if (n < lo || n > hi) return c.fail(l.pointer, "is " + shown(v), expected);
  out.value = static_cast<int>(n);
}

// A parameter of the table (protocol/infill_protocol/edit_parameters.h) by its job-file name.
const protocol::EditParameter& job_parameter(std::string_view job_name) {
  const protocol::EditParameter* p = protocol::find_job_parameter(job_name);
  if (!p) throw std::logic_error("job parameter " + std::string(job_name) + " is not in the parameter table");
  return *p;
}

// An integer parameter, its range from the table.
void get_table_int(Checker& c, const Lookup& l, std::string_view job_name, int fallback, Field<int>& out) {
  const protocol::EditParameter& p = job_parameter(job_name);
  get_int(c, l, static_cast<int>(p.min), static_cast<int>(p.max), fallback, out);
}

// A number parameter, its range from the table; `unit` prefixes the expectation ("pixels, ").
void get_number(Checker& c, const Lookup& l, double lo, double hi, bool lo_open, double fallback,
                const std::string& expected, Field<double>& out);
void get_table_number(Checker& c, const Lookup& l, std::string_view job_name, double fallback, const std::string& unit,
                      Field<double>& out) {
  const protocol::EditParameter& p = job_parameter(job_name);
  get_number(c, l, p.min, p.max, p.min_exclusive, fallback, unit + "a number in " + protocol::range_text(p), out);
}

void get_number(Checker& c, const Lookup& l, double lo, double hi, bool lo_open, double fallback,
                const std::string& expected, Field<double>& out) {
  out = {fallback, l.pointer};
  if (!l.value) return;
  const json& v = *l.value;
  if (!v.is_number()) return c.fail(l.pointer, "is " + shown(v) + " (" + type_name(v) + ")", expected);
  const double x = v.get<double>();
  if (!(lo_open ? x > lo : x >= lo) || !(x <= hi)) return c.fail(l.pointer, "is " + shown(v), expected);
  out.value = x;
}

void get_string(Checker& c, const Lookup& l, const std::string& fallback, const std::string& expected,
                Field<std::string>& out) {
  out = {fallback, l.pointer};
  if (!l.value) return;
  if (!l.value->is_string()) return c.fail(l.pointer, "is " + shown(*l.value) + " (" + type_name(*l.value) + ")", expected);
  out.value = l.value->get<std::string>();
}

void get_seeds(Checker& c, const json& edit, const std::string& edit_ptr, const json* defaults,
               Field<std::vector<uint64_t>>& out) {
  const bool own = edit.contains("seed") || edit.contains("seeds");
  const json& src = own ? edit : (defaults ? *defaults : edit);
  const std::string base = own ? edit_ptr : "/defaults";
  if (src.contains("seed") && src.contains("seeds"))
    return c.fail(base + "/seeds", "both \"seed\" and \"seeds\" are given", "one of them");
  const std::string expected_one = "an integer in " + protocol::range_text(job_parameter("seed"));
  const auto max_seed = static_cast<uint64_t>(job_parameter("seed").max);
  auto one = [&](const json& v, const std::string& ptr, uint64_t& seed) {
    if (!v.is_number_integer() || (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)) {
      c.fail(ptr, "is " + shown(v), expected_one);
      return false;
    }
    seed = v.get<uint64_t>();
    if (seed > max_seed) {
      c.fail(ptr, "is " + shown(v), expected_one);
      return false;
    }
    return true;
  };
  if (src.contains("seed")) {
    out.pointer = base + "/seed";
    uint64_t s = 0;
    if (one(src["seed"], out.pointer, s)) out.value = {s};
    return;
  }
  out.pointer = base + "/seeds";
  if (!src.contains("seeds")) {
    out.value = {1};
    return;
  }
  const json& v = src["seeds"];
  const std::string expected =
      "a non-empty array of integers or {\"first\": N, \"count\": M} with 1 <= M <= " + std::to_string(kMaxSeedsPerEdit);
  if (v.is_array()) {
    if (v.empty() || v.size() > kMaxSeedsPerEdit) return c.fail(out.pointer, "has " + std::to_string(v.size()) + " seeds", expected);
    std::set<uint64_t> seen;
    for (size_t i = 0; i < v.size(); ++i) {
      uint64_t s = 0;
      if (!one(v[i], out.pointer + "/" + std::to_string(i), s)) return;
      if (!seen.insert(s).second)
        return c.fail(out.pointer + "/" + std::to_string(i), "repeats seed " + std::to_string(s), "distinct seeds");
      out.value.push_back(s);
    }
    return;
  }
  if (v.is_object()) {
    check_keys(c, v, out.pointer, {"first", "count"});
    if (c.failed()) return;
    if (!v.contains("first") || !v.contains("count"))
      return c.fail(out.pointer, "is " + shown(v), expected);
    uint64_t first = 0;
    if (!one(v["first"], out.pointer + "/first", first)) return;
    const json& n = v["count"];
    if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > static_cast<int64_t>(kMaxSeedsPerEdit))
      return c.fail(out.pointer + "/count", "is " + shown(n),
                    "an integer in 1.." + std::to_string(kMaxSeedsPerEdit));
    const auto count = static_cast<uint64_t>(n.get<int64_t>());
    if (first > max_seed - (count - 1))
      return c.fail(out.pointer + "/first", "is " + shown(v["first"]) + " with count " + std::to_string(count),
                    "a first seed whose last seed stays in " + protocol::range_text(job_parameter("seed")));
    for (uint64_t i = 0; i < count; ++i) out.value.push_back(first + i);
    return;
  }
  c.fail(out.pointer, "is " + shown(v) + " (" + type_name(v) + ")", expected);
}

std::string absolute_from(const std::string& dir, const std::string& path) {
  fs::path p(path);
  if (p.is_relative()) p = fs::path(dir) / p;
  return p.lexically_normal().string();
}

struct ImageFacts {
  std::string sha256;
  int width = 0, height = 0;
};

// Hashes the bytes and reads the size from the header (no pixels decoded).
Result<ImageFacts> image_facts(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return not_found("file " + path + " does not exist");
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) return io_error("cannot read " + path);
  ImageFacts f;
  f.sha256 = sha256_hex(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
  auto input = OIIO::ImageInput::open(path);
  if (!input) {
    std::string why = OIIO::geterror();
    return corrupt_data("file " + path + " is not a readable image (" + (why.empty() ? "unknown format" : why) + ")");
  }
  f.width = input->spec().width;
  f.height = input->spec().height;
  input->close();
  if (f.width <= 0 || f.height <= 0) return corrupt_data("image " + path + " has no pixels");
  return f;
}

// Files by absolute path, read once per job: images (templates, masks, references) and LoRAs.
struct FileCache {
  std::map<std::string, Result<ImageFacts>> images;
  std::map<std::string, Result<std::string>> loras;  // the SHA-256 of the bytes

  const Result<ImageFacts>& image(const std::string& path) {
    auto it = images.find(path);
    if (it == images.end()) it = images.emplace(path, image_facts(path)).first;
    return it->second;
  }
  const Result<std::string>& lora(const std::string& path) {
    auto it = loras.find(path);
    if (it == loras.end()) it = loras.emplace(path, lora_sha256(path)).first;
    return it->second;
  }

 private:
  // The SHA-256 of a safetensors file's bytes. Only the container is checked here (an 8-byte
  // little-endian header length within the file, then a JSON object); whether its tensors are
  // a LoRA the model takes is the engine's check (load_job_inputs).
  static Result<std::string> lora_sha256(const std::string& path) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return not_found("file " + path + " does not exist");
    std::ifstream in(path, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) return io_error("cannot read " + path);
    uint64_t header = 0;
    for (size_t i = 0; i < 8 && i < bytes.size(); ++i) header |= uint64_t(uint8_t(bytes[i])) << (8 * i);
    if (bytes.size() < 10 || header < 2 || header > bytes.size() - 8 || bytes[8] != '{')
      return corrupt_data("file " + path + " (" + std::to_string(bytes.size()) +
                          " bytes) is not a safetensors file: no header length and JSON header at its start");
    return sha256_hex(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
  }
};

// "adapters": at most the table's max_length entries {"file": path, "strength": number}, the
// strengths in the table's range (1 when omitted, as in the API).
void get_adapters(Checker& c, const Lookup& l, const std::string& dir, FileCache& files,
                  Field<std::vector<JobAdapter>>& out) {
  out = {{}, l.pointer};
  if (!l.value) return;
  const protocol::EditParameter& p = job_parameter("adapters");
  const std::string strength_expected = "a number in " + protocol::range_text(p);
  const std::string entry_expected = "{\"file\": a LoRA .safetensors path, \"strength\": " + strength_expected + "}";
  const std::string file_expected = "the path of a LoRA .safetensors file (relative to " + dir + ")";
  const json& v = *l.value;
  if (!v.is_array() || v.size() > p.max_length)
    return c.fail(l.pointer, v.is_array() ? "has " + std::to_string(v.size()) + " adapters" : "is " + shown(v) + " (" + type_name(v) + ")",
                  "an array of at most " + std::to_string(p.max_length) + " " + entry_expected);
  for (size_t i = 0; i < v.size() && !c.failed(); ++i) {
    const std::string ptr = l.pointer + "/" + std::to_string(i);
    const json& a = v[i];
    if (!a.is_object()) return c.fail(ptr, "is " + shown(a) + " (" + type_name(a) + ")", entry_expected);
    check_keys(c, a, ptr, {"file", "strength"});
    JobAdapter adapter;
    get_string(c, {a.contains("file") ? &a["file"] : nullptr, ptr + "/file"}, "", file_expected, adapter.file);
    get_number(c, {a.contains("strength") ? &a["strength"] : nullptr, ptr + "/strength"}, p.min, p.max, p.min_exclusive,
               1.0, strength_expected, adapter.strength);
    if (c.failed()) return;
    if (adapter.file.value.empty()) return c.fail(adapter.file.pointer, "is missing or empty", file_expected);
    adapter.file.value = absolute_from(dir, adapter.file.value);
    const Result<std::string>& sha = files.lora(adapter.file.value);
    if (!sha.ok()) return c.fail(adapter.file.pointer, sha.status().message(), file_expected);
    adapter.sha256 = *sha;
    out.value.push_back(std::move(adapter));
  }
}

// "references": at most the table's max_length distinct images (by their bytes: the engine's
// template ids may not repeat), each of a size the engine takes as a reference (read from the
// header: the engine's own rule, so that a remote engine's refusal does not wait for the item).
void get_references(Checker& c, const Lookup& l, const std::string& dir, FileCache& files,
                    Field<std::vector<JobReference>>& out) {
  out = {{}, l.pointer};
  if (!l.value) return;
  const protocol::EditParameter& p = job_parameter("references");
  const std::string file_expected = "the path of a reference image file (relative to " + dir + ")";
  const json& v = *l.value;
  if (!v.is_array() || v.size() > p.max_length)
    return c.fail(l.pointer, v.is_array() ? "has " + std::to_string(v.size()) + " images" : "is " + shown(v) + " (" + type_name(v) + ")",
                  "an array of at most " + std::to_string(p.max_length) + " distinct image paths");
  for (size_t i = 0; i < v.size() && !c.failed(); ++i) {
    JobReference ref;
    get_string(c, {&v[i], l.pointer + "/" + std::to_string(i)}, "", file_expected, ref.file);
    if (c.failed()) return;
    if (ref.file.value.empty()) return c.fail(ref.file.pointer, "is empty", file_expected);
    ref.file.value = absolute_from(dir, ref.file.value);
    const Result<ImageFacts>& facts = files.image(ref.file.value);
    if (!facts.ok()) return c.fail(ref.file.pointer, facts.status().message(), file_expected);
    if (Status sized = check_reference_size(ref.file.value, facts->width, facts->height);
        !sized.ok())
      return c.fail(ref.file.pointer, sized.message(),
                    "a reference image of " + reference_size_expected());
    ref.sha256 = facts->sha256;
    for (const JobReference& before : out.value) {
      if (before.sha256 == ref.sha256)
        return c.fail(ref.file.pointer, "is the same image as " + before.file.pointer + " (" + before.file.value + ")",
                      "distinct reference images");
    }
    out.value.push_back(std::move(ref));
  }
}

}  // namespace

Status job_error(const std::string& file, const std::string& pointer, const std::string& what,
                 const std::string& expected) {
  return invalid_argument(file + ": " + (pointer.empty() ? "/" : pointer) + ": " + what + "; expected " + expected);
}

Result<Job> load_job(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    return job_error(path, "", "the job file does not exist or is not a file", "a readable JSON job file");
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return job_error(path, "", "the job file cannot be read", "a readable JSON job file");
  return parse_job(ss.str(), path);
}

Result<Job> parse_job(const std::string& text, const std::string& path) {
  Checker c(path);
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    if (const size_t p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    return job_error(path, "", what, "a JSON document (docs/job.schema.json)");
  }
  Job job;
  job.path = path;
  std::error_code ec;
  job.dir = fs::absolute(fs::path(path).parent_path(), ec).lexically_normal().string();

  if (!root.is_object()) return job_error(path, "", "is " + std::string(type_name(root)), "an object with \"format\" and \"edits\"");
  check_keys(c, root, "", {"$schema", "format", "model", "deadline_s", "defaults", "edits"});
  if (!root.contains("format") || root["format"] != kFormat)
    c.fail("/format", root.contains("format") ? "is " + shown(root["format"]) : "is missing",
           std::string("\"") + kFormat + "\"");
  if (root.contains("model")) {
    if (!root["model"].is_string() || root["model"].get<std::string>().empty())
      c.fail("/model", "is " + shown(root["model"]), "the path of a model folder (string)");
    else
      job.model = absolute_from(job.dir, root["model"].get<std::string>());
  }
  if (root.contains("deadline_s")) {
    Field<double> d;
    get_number(c, {&root["deadline_s"], "/deadline_s"}, 0, 1e7, true, 0, "seconds, a number in (0, 1e7]", d);
    job.deadline_s = d.value;
  }
  const json* defaults = nullptr;
  if (root.contains("defaults")) {
    defaults = &root["defaults"];
    if (!defaults->is_object()) c.fail("/defaults", "is " + std::string(type_name(*defaults)), "an object");
    else
      check_keys(c, *defaults, "/defaults",
                 {"template", "mask", "prompt", "seed", "seeds", "steps", "strength", "guidance", "sampler", "halo",
                  "feather", "output", "adapters", "references"});
  }
  if (!root.contains("edits") || !root["edits"].is_array() || root["edits"].empty())
    c.fail("/edits", root.contains("edits") ? "is " + shown(root["edits"]) : "is missing", "a non-empty array of edits");
  if (c.failed()) return c.status();

  FileCache files;
  auto facts_of = [&](const Field<std::string>& f, const char* what) -> const ImageFacts* {
    const Result<ImageFacts>& r = files.image(f.value);
    if (!r.ok()) {
      c.fail(f.pointer, r.status().message(), std::string("the path of a readable ") + what + " image file (relative to " + job.dir + ")");
      return nullptr;
    }
    return &*r;
  };

  const json& edits = root["edits"];
  std::map<std::string, int> outputs;  // expanded path -> item number
  int item_number = 0;
  for (size_t i = 0; i < edits.size() && !c.failed(); ++i) {
    const std::string ptr = "/edits/" + std::to_string(i);
    const json& e = edits[i];
    if (!e.is_object()) {
      c.fail(ptr, "is " + std::string(type_name(e)), "an edit object");
      break;
    }
    check_keys(c, e, ptr,
               {"name", "template", "mask", "prompt", "seed", "seeds", "steps", "strength", "guidance", "sampler", "halo",
                "feather", "output", "adapters", "references"});
    JobEdit edit;
    edit.index = static_cast<int>(i);
    edit.pointer = ptr;
    get_string(c, find(e, ptr, defaults, "template"), "", "the path of the template image (string)", edit.template_path);
    get_string(c, find(e, ptr, defaults, "mask"), "", "the path of the mask image (string)", edit.mask_path);
    for (Field<std::string>* f : {&edit.template_path, &edit.mask_path}) {
      if (c.failed()) break;
      if (f->value.empty()) c.fail(f->pointer, "is missing or empty", "the path of an image file (string)");
      f->value = absolute_from(job.dir, f->value);
    }
    get_string(c, find(e, ptr, defaults, "prompt"), "", "free text, or words of the model's vocabulary (string)", edit.prompt);
    if (!c.failed() && edit.prompt.value.size() > job_parameter("prompt").max_length)
      c.fail(edit.prompt.pointer, "has " + std::to_string(edit.prompt.value.size()) + " bytes",
             "at most " + std::to_string(job_parameter("prompt").max_length));
    get_seeds(c, e, ptr, defaults, edit.seeds);
    get_table_int(c, find(e, ptr, defaults, "steps"), "steps", 0, edit.steps);
    get_table_number(c, find(e, ptr, defaults, "strength"), "strength", 1.0, "", edit.strength);
    get_table_number(c, find(e, ptr, defaults, "guidance"), "guidance", 0.0, "", edit.guidance);
    {
      const std::string choices(job_parameter("sampler").choices);
      const std::string expected = "one of " + choices;
      get_string(c, find(e, ptr, defaults, "sampler"), "", expected, edit.sampler);
      if (!c.failed() && !edit.sampler.value.empty() && !protocol::is_choice(job_parameter("sampler"), edit.sampler.value))
        c.fail(edit.sampler.pointer, "is " + json(edit.sampler.value).dump(), expected);
    }
    get_table_int(c, find(e, ptr, defaults, "halo"), "halo", 1, edit.halo);
    get_table_number(c, find(e, ptr, defaults, "feather"), "feather", 4.0, "pixels, ", edit.feather);
    get_adapters(c, find(e, ptr, defaults, "adapters"), job.dir, files, edit.adapters);
    get_references(c, find(e, ptr, defaults, "references"), job.dir, files, edit.references);
    get_string(c, find(e, ptr, defaults, "output"), "", "an output path pattern ending in .png, .tif or .exr", edit.output);
    if (c.failed()) break;
    if (edit.output.value.empty()) {
      c.fail(edit.output.pointer, "is missing",
             "an output path pattern ending in .png, .tif or .exr, e.g. \"out/{name}_{seed}.png\"");
      break;
    }
    if (Status s = check_output_pattern(edit.output.value); !s.ok()) {
      c.fail(edit.output.pointer, "is " + json(edit.output.value).dump() + ": " + s.message(),
             "text with the tokens {item}, {seed}, {name} (optionally {item:04})");
      break;
    }
    if (!output_file_format(edit.output.value)) {
      c.fail(edit.output.pointer, "is " + json(edit.output.value).dump(),
             "a pattern ending in .png, .tif, .tiff or .exr (the result's format, which stores the job hash)");
      break;
    }
    edit.output.value = absolute_from(job.dir, edit.output.value);

    // Name: given, else the template's file stem.
    if (e.contains("name")) {
      const json& n = e["name"];
      const std::string expected = "1 to 100 characters from A-Z a-z 0-9 . _ -";
      if (!n.is_string() || n.get<std::string>().empty() || n.get<std::string>().size() > 100 ||
          n.get<std::string>().find_first_not_of(
              "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") != std::string::npos) {
        c.fail(ptr + "/name", "is " + shown(n), expected);
        break;
      }
      edit.name = n.get<std::string>();
    } else {
      edit.name = fs::path(edit.template_path.value).stem().string();
    }

    const ImageFacts* t = facts_of(edit.template_path, "template");
    if (!t) break;
    const ImageFacts* m = facts_of(edit.mask_path, "mask");
    if (!m) break;
    if (m->width != t->width || m->height != t->height) {
      c.fail(edit.mask_path.pointer,
             "mask " + edit.mask_path.value + " is " + std::to_string(m->width) + "x" + std::to_string(m->height) +
                 ", template " + edit.template_path.value + " is " + std::to_string(t->width) + "x" +
                 std::to_string(t->height),
             "a mask of the template's size");
      break;
    }
    edit.template_sha256 = t->sha256;
    edit.mask_sha256 = m->sha256;
    edit.width = t->width;
    edit.height = t->height;

    for (uint64_t seed : edit.seeds.value) {
      if (item_number >= kMaxItems) {
        c.fail("/edits", "has more than " + std::to_string(kMaxItems) + " items", "at most that many (split the job)");
        break;
      }
      Job::Item item;
      item.number = ++item_number;
      item.edit = edit.index;
      item.seed = seed;
      item.output = expand_output_pattern(edit.output.value, {item.number, seed, edit.name});
      auto [it, inserted] = outputs.emplace(item.output, item.number);
      if (!inserted) {
        c.fail(edit.output.pointer,
               "items " + std::to_string(it->second) + " and " + std::to_string(item.number) + " both write " + item.output,
               "a pattern that gives each item its own file (use {seed}, {name} or {item})");
        break;
      }
      job.items.push_back(std::move(item));
    }
    job.edits.push_back(std::move(edit));
  }
  if (c.failed()) return c.status();
  return job;
}

}  // namespace infill::render
