#include "job_items.h"

#include <algorithm>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/hash.h"
#include "output_pattern.h"

namespace infill::render {
namespace {

std::vector<std::string> words_of(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> words;
  for (std::string w; in >> w;) {
    std::transform(w.begin(), w.end(), w.begin(), [](unsigned char ch) { return std::tolower(ch); });
    words.push_back(w);
  }
  return words;
}

}  // namespace

Result<std::vector<ResolvedItem>> resolve_items(const Job& job, const BackendInfo& info) {
  // Prompts first: one error per edit, before any item is built.
  std::vector<std::string> prompts(job.edits.size());
  for (const JobEdit& e : job.edits) {
    // A text encoder reads the prompt as written; a vocabulary model reads its words.
    const std::vector<std::string> words = info.free_text ? std::vector<std::string>{} : words_of(e.prompt.value);
    std::string joined = info.free_text ? e.prompt.value : std::string();
    for (const auto& w : words) joined += (joined.empty() ? "" : " ") + w;
    if (!info.free_text && !words.empty() && !info.vocabulary)
      return job_error(job.path, e.prompt.pointer, "is \"" + e.prompt.value + "\" but model " + info.model_id +
                                                       " takes no prompt", "an empty prompt");
    if (info.vocabulary && !info.free_text) {
      const std::set<std::string> known(info.vocabulary->begin(), info.vocabulary->end());
      for (const auto& w : words) {
        if (!known.count(w)) {
          std::string list;
          for (const auto& k : *info.vocabulary) list += (list.empty() ? "" : " ") + k;
          return job_error(job.path, e.prompt.pointer, "word \"" + w + "\" is not in the vocabulary of model " + info.model_id,
                           "words from: " + list);
        }
      }
    }
    prompts[static_cast<size_t>(e.index)] = joined;
    const int64_t pixels = int64_t{e.width} * e.height;
    if (info.max_image_pixels > 0 && pixels > info.max_image_pixels)
      return job_error(job.path, e.template_path.pointer,
                       "template " + e.template_path.value + " is " + std::to_string(e.width) + "x" +
                           std::to_string(e.height) + " = " + std::to_string(pixels) + " pixels",
                       "at most " + std::to_string(info.max_image_pixels) + " pixels (model " + info.model_id + ")");
  }

  std::vector<ResolvedItem> items;
  items.reserve(job.items.size());
  for (const Job::Item& it : job.items) {
    const JobEdit& e = job.edits[static_cast<size_t>(it.edit)];
    ResolvedItem r;
    r.number = it.number;
    r.edit = &e;
    r.output = it.output;
    RenderEdit& x = r.render;
    x.id = static_cast<uint64_t>(it.number);
    x.template_path = e.template_path.value;
    x.template_sha256 = e.template_sha256;
    x.mask_path = e.mask_path.value;
    x.prompt = prompts[static_cast<size_t>(e.index)];
    x.seed = it.seed;
    x.steps = e.steps.value > 0 ? e.steps.value : info.default_steps;
    x.strength = e.strength.value;
    // Guidance only applies with a prompt: without one it is 1 (and hashed as 1).
    x.guidance = x.prompt.empty() ? 1.0 : (e.guidance.value > 0 ? e.guidance.value : info.default_guidance);
    x.sampler = e.sampler.value.empty() ? info.default_sampler : e.sampler.value;
    x.halo = e.halo.value;
    x.feather = e.feather.value;
    x.output_format = output_file_format(it.output).value_or("png");
    nlohmann::json canonical = {
        {"hash", "infill-job-hash/1"}, {"model", info.model_id},       {"template_sha256", e.template_sha256},
        {"mask_sha256", e.mask_sha256}, {"prompt", x.prompt},          {"seed", x.seed},
        {"steps", x.steps},             {"strength", x.strength},      {"guidance", x.guidance},
        {"sampler", x.sampler},         {"halo", x.halo},              {"feather", x.feather}};
    // Only present when used, so that jobs without them keep their hashes (and outputs).
    for (const JobAdapter& a : e.adapters.value) {
      x.adapters.push_back({a.file.value, a.sha256, a.strength.value});
      canonical["adapters"].push_back({{"sha256", a.sha256}, {"strength", a.strength.value}});
    }
    for (const JobReference& ref : e.references.value) {
      x.references.push_back({ref.file.value, ref.sha256});
      canonical["references"].push_back(ref.sha256);
    }
    r.canonical = canonical.dump();  // keys sorted: nlohmann::json objects are std::map
    r.hash = sha256_hex(std::as_bytes(std::span<const char>(r.canonical.data(), r.canonical.size())));
    items.push_back(std::move(r));
  }
  return items;
}

Status load_job_inputs(const Job& job, RenderBackend& backend, RenderFailure& failure) {
  failure = RenderFailure::kBadInput;
  std::set<std::string> loaded;  // "a" or "r", then the path
  auto load = [&](char kind, const Field<std::string>& file) -> Status {
    if (!loaded.insert(kind + file.value).second) return {};
    Status s = kind == 'a' ? backend.load_adapter(file.value, failure) : backend.load_reference(file.value, failure);
    if (s.ok() || failure != RenderFailure::kBadInput) return s;
    const BackendInfo& info = backend.info();
    return job_error(job.path, file.pointer, s.message(),
                     kind == 'a' ? "a LoRA .safetensors file for model " + info.model_id
                                 : "a reference image that model " + info.model_id + " takes");
  };
  for (const JobEdit& e : job.edits) {
    for (const JobAdapter& a : e.adapters.value)
      if (Status s = load('a', a.file); !s.ok()) return s;
    for (const JobReference& r : e.references.value)
      if (Status s = load('r', r.file); !s.ok()) return s;
  }
  return {};
}

}  // namespace infill::render
