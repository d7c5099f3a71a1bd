#include "embedded_backend.h"

#include <c10/core/InferenceMode.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <thread>
#include <vector>

#include "cache/activation_store.h"
#include "model/compute_threads.h"
#include "model/lora_adapter.h"
#include "model/model.h"
#include "pipeline/bundled_models.h"
#include "pipeline/load_edit_model.h"
#include "pipeline/mask.h"
#include "pipeline/reference_image.h"
#include "pipeline/template_image.h"
#include "serving/cost_model.h"
#include "serving/serving_runtime.h"

namespace infill::render {
namespace {

namespace fs = std::filesystem;

RenderFailure failure_of(const Status& s) {
  switch (s.code()) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kNotFound:
    case ErrorCode::kCorruptData:
    case ErrorCode::kOutOfRange: return RenderFailure::kBadInput;
    case ErrorCode::kCancelled: return RenderFailure::kCancelled;
    default: return RenderFailure::kInternal;
  }
}

class EmbeddedBackend final : public RenderBackend {
 public:
  EmbeddedBackend(std::shared_ptr<const EditModel> model, std::unique_ptr<ServingRuntime> runtime, BackendInfo info)
      : model_(std::move(model)), runtime_(std::move(runtime)), info_(std::move(info)) {}
  ~EmbeddedBackend() override {
    // Stop the workers before the templates and masks they may still reference go.
    runtime_.reset();
  }

  const BackendInfo& info() const override { return info_; }

  Status load_adapter(const std::string& path, RenderFailure& failure) override {
    failure = RenderFailure::kBadInput;
    auto adapter = adapter_of(path);
    if (!adapter.ok()) failure = failure_of(adapter.status());
    return adapter.status();
  }

  Status load_reference(const std::string& path, RenderFailure& failure) override {
    failure = RenderFailure::kBadInput;
    auto ref = reference_of(path);
    if (!ref.ok()) failure = failure_of(ref.status());
    return ref.status();
  }

  Status submit(const RenderEdit& edit, RenderEvents events, RenderFailure& failure) override {
    c10::InferenceMode guard;
    failure = RenderFailure::kBadInput;
    auto tmpl = template_of(edit.template_path);
    if (!tmpl.ok()) return tmpl.status();
    auto mask = mask_of(edit.mask_path, **tmpl);
    if (!mask.ok()) return mask.status();
    ServingRequest r;
    if (Status prompted = model_->set_prompt(r.params, edit.prompt); !prompted.ok()) return prompted;
    r.id = edit.id;
    r.client_id = 1;
    r.tmpl = *tmpl;
    r.params.mask = *mask;
    r.params.guidance_scale = edit.guidance;
    r.params.seed = edit.seed;
    r.params.strength = edit.strength;
    r.params.schedule.sampler = edit.sampler;
    r.params.schedule.steps = edit.steps;
    r.params.cache = edit.use_cache ? CacheMode::kUse : CacheMode::kOff;
    r.params.halo_tokens = edit.halo;
    r.params.feather_px = static_cast<float>(edit.feather);
    for (const RenderAdapter& a : edit.adapters) {
      auto adapter = adapter_of(a.path);
      if (!adapter.ok()) return adapter.status();
      r.params.adapters.push_back({*adapter, a.strength});
    }
    for (const RenderReference& ref : edit.references) {
      auto made = reference_of(ref.path);
      if (!made.ok()) return made.status();
      r.params.references.push_back(*made);
    }
    r.cls = RequestClass::kBatch;
    // The run's deadline is enforced by the runner; the runtime orders by submission.
    r.deadline_ms = 24.0 * 3600 * 1000;
    r.encode_result = true;
    r.result_format = parse_image_file_format(edit.output_format).value_or(ImageFileFormat::kPng);
    r.on_progress = [cb = events.on_progress](const RequestProgress& p) {
      if (cb) cb(p.id, p.steps_done, p.steps_total);
    };
    r.on_complete = [cb = events.on_complete](const RequestResult& res) {
      RenderOutcome o;
      o.id = res.id;
      o.steps_run = res.output.steps_run;
      o.used_cache = res.output.used_cache;
      switch (res.state) {
        case RequestState::kDone: o.file = res.result_file; break;
        case RequestState::kCancelled:
          o.status = res.status.ok() ? Status(ErrorCode::kCancelled, "cancelled") : res.status;
          o.failure = RenderFailure::kCancelled;
          break;
        case RequestState::kExpired:
          o.status = res.status.ok() ? Status(ErrorCode::kOutOfRange, "expired at its deadline") : res.status;
          o.failure = RenderFailure::kDeadline;
          break;
        default:
          o.status = res.status.ok() ? Status(ErrorCode::kInternal, "failed") : res.status;
          o.failure = failure_of(o.status);
          break;
      }
      if (cb) cb(std::move(o));
    };
    failure = RenderFailure::kInternal;
    return runtime_->submit(std::move(r));
  }

  void cancel(uint64_t id) override { runtime_->cancel(id); }

 private:
  // Decoded and encoded once per file: every edit on a template shares it (and its cache key).
  Result<std::shared_ptr<const TemplateImage>> template_of(const std::string& path) {
    auto it = templates_.find(path);
    if (it != templates_.end()) return it->second;
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found("template image " + path + " cannot be opened");
    const std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (data.empty()) return invalid_argument("template image " + path + " is empty");
    auto t = model_->make_template(std::as_bytes(std::span<const char>(data)), path);
    if (!t.ok()) return t.status();
    templates_.emplace(path, *t);
    return *t;
  }
  // Read once per file for the model: every edit naming it shares it (and its cache keys).
  Result<std::shared_ptr<const LoraAdapter>> adapter_of(const std::string& path) {
    auto it = adapters_.find(path);
    if (it != adapters_.end()) return it->second;
    c10::InferenceMode guard;
    auto a = model_->read_adapter(path);
    if (!a.ok()) return a.status();
    adapters_.emplace(path, *a);
    return *a;
  }
  // Decoded, encoded and scaled once per file, as the engine does for an uploaded reference.
  Result<ReferenceImage> reference_of(const std::string& path) {
    auto it = references_.find(path);
    if (it != references_.end()) return it->second;
    c10::InferenceMode guard;
    auto tmpl = template_of(path);
    if (!tmpl.ok()) return tmpl.status();
    auto made = model_->make_reference(**tmpl);
    if (!made.ok()) return Status(made.status().code(), "reference image " + path + ": " + made.status().message());
    references_.emplace(path, *made);
    return *made;
  }
  Result<at::Tensor> mask_of(const std::string& path, const TemplateImage& tmpl) {
    const std::string key = path + "@" + std::to_string(tmpl.width) + "x" + std::to_string(tmpl.height);
    auto it = masks_.find(key);
    if (it != masks_.end()) return it->second;
    auto m = load_mask(path, tmpl.width, tmpl.height);
    if (!m.ok()) return m.status();
    masks_.emplace(key, *m);
    return *m;
  }

  std::shared_ptr<const EditModel> model_;
  std::unique_ptr<ServingRuntime> runtime_;
  BackendInfo info_;
  // Owned by the runner's thread (submit()).
  std::map<std::string, std::shared_ptr<const TemplateImage>> templates_;
  std::map<std::string, at::Tensor> masks_;
  std::map<std::string, std::shared_ptr<const LoraAdapter>> adapters_;
  std::map<std::string, ReferenceImage> references_;
};

}  // namespace

std::string bundled_model_path() {
  const std::vector<std::string> dirs = bundled_model_dirs(INFILL_SOURCE_DIR);
  return dirs.empty() ? std::string() : dirs.front();
}

Result<std::unique_ptr<RenderBackend>> open_embedded_backend(const EmbeddedOptions& options) {
  const std::string path = options.model_path.empty() ? bundled_model_path() : options.model_path;
  if (path.empty()) return not_found("no model: the bundled infill-tiny-2 was not found; pass --model DIR");
  const int threads = options.threads > 0 ? options.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  set_compute_threads(threads);
  c10::InferenceMode guard;
  auto model = load_edit_model(path);
  if (!model.ok()) return Status(model.status().code(), "model " + path + ": " + model.status().message());
  ActivationStoreOptions so;
  so.ram_budget_bytes = options.ram_cache_bytes;
  so.disk_dir = options.cache_dir;
  so.disk_budget_bytes = uint64_t{16} << 30;
  auto store = ActivationStore::open(so);
  if (!store.ok()) return store.status();
  RuntimeOptions ro;
  ro.workers = 1;
  ro.threads_per_worker = threads;
  ro.pool_threads = 1;
  // With one worker and one class of requests only their order depends on the cost model:
  // the plausible one spares a start-up timing run per farm task.
  auto runtime = ServingRuntime::create(model->model, std::shared_ptr<ActivationStore>(std::move(*store)),
                                        std::make_shared<const StepCostModel>(StepCostModel::plausible()), ro);
  if (!runtime.ok()) return runtime.status();

  BackendInfo info;
  const EditModelInfo& m = model->model->info();
  info.model_id = m.id;
  info.where = "embedded";
  info.default_steps = m.default_steps;
  info.default_sampler = m.default_sampler;
  info.default_guidance = m.default_guidance;
  info.max_image_pixels = m.max_image_pixels;
  info.free_text = m.free_text;
  // A vocabulary model without words takes no prompt (nullopt); free text is never checked.
  if (!m.free_text && !m.vocabulary.empty()) info.vocabulary = m.vocabulary;
  return std::unique_ptr<RenderBackend>(new EmbeddedBackend(model->model, std::move(*runtime), std::move(info)));
}

}  // namespace infill::render
