#pragma once
/// @file
/// Header-only C++17 wrapper over the C API of libinfill_client (infill_client.h): RAII
/// handles, exceptions (infill::client::Error) for failed calls, std::function callbacks.
///
/// Threading is the C API's: every call is thread-safe; callbacks run on the client's own
/// thread, one at a time, and `on_done` exactly once per submitted edit. A callback that
/// throws has its exception swallowed (it cannot cross the C ABI); catch inside it.
///
///   infill::client::ClientOptions options;
///   options.endpoint = "unix:/run/user/1000/infill/engine.sock";
///   infill::client::Client client(options);
///   auto tmpl = client.upload_template_file("photo.png");
///   infill::client::EditRequest req;
///   req.template_id = tmpl.id;
///   req.mask_rect = {{64, 64, 128, 96}};
///   req.on_progress = [](const infill_progress& p) { ... };
///   infill::client::Job job = client.submit(req);
///   job.wait();
///   std::string png = job.result_png();

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "infill_client.h"

namespace infill::client {

/// A failed call: the C error's code, message, HTTP status and engine code.
class Error : public std::runtime_error {
 public:
  /// Takes ownership of `e` (not NULL).
  explicit Error(infill_error* e)
      : std::runtime_error(infill_error_message(e)),
        code_(infill_error_get_code(e)),
        http_status_(infill_error_http_status(e)),
        engine_code_(infill_error_engine_code(e)),
        retry_after_s_(infill_error_retry_after_s(e)) {
    infill_error_delete(e);
  }
  /// A copy of an error the library owns (e.g. infill_done::error).
  static Error copy_of(const infill_error* e) {
    return Error(infill_error_get_code(e), infill_error_message(e), infill_error_http_status(e),
                 infill_error_engine_code(e), infill_error_retry_after_s(e));
  }
  infill_error_code code() const noexcept { return code_; }
  const char* code_name() const noexcept { return infill_error_code_name(code_); }
  int http_status() const noexcept { return http_status_; }
  const std::string& engine_code() const noexcept { return engine_code_; }
  int retry_after_s() const noexcept { return retry_after_s_; }

 private:
  Error(infill_error_code code, const char* message, int status, const char* engine_code, int retry)
      : std::runtime_error(message), code_(code), http_status_(status), engine_code_(engine_code), retry_after_s_(retry) {}
  infill_error_code code_;
  int http_status_;
  std::string engine_code_;
  int retry_after_s_;
};

namespace detail {
/// Throws Error when `e` is not NULL.
inline void check(infill_error* e) {
  if (e) throw Error(e);
}
}  // namespace detail

struct ClientOptions {
  std::string endpoint;     ///< "" = $INFILL_ENDPOINT or the local engine's socket
  std::string token;        ///< "" = token_file, $INFILL_TOKEN, ~/.config/infill/token
  std::string token_file;
  std::string client_name;  ///< "" = unique per client
  uint32_t connect_timeout_ms = 0;  ///< 0 = the library's default
  uint32_t request_timeout_ms = 0;
  uint32_t stream_idle_timeout_ms = 0;
  uint32_t reconnect_interval_ms = 0;
  uint32_t engine_lost_timeout_ms = 0;
  bool cancel_on_destroy = true;
};

struct Health {
  bool ready = false;
  uint32_t live_edits = 0;
  std::string model_id;
};

struct ModelInfo {
  std::string id, name, description, default_sampler;
  uint32_t default_steps = 0;
  double default_guidance = 1.0;
  std::vector<std::string> vocabulary;
  uint64_t max_image_pixels = 0;
  uint32_t grid_pixels = 0;
  bool free_text = false;  ///< prompts are free text (vocabulary is then empty)
  std::string family;      ///< "dit", "flux2"; "" from an older library
};

struct TemplateInfo {
  std::string id;
  uint32_t width = 0, height = 0, model_width = 0, model_height = 0, channels = 0;
  std::string format;
  infill_template_state state = INFILL_TEMPLATE_READY;
  uint32_t edits_waiting = 0;
  bool created = false;
};

/// An adapter in the engine's store (see infill_adapter_info).
struct AdapterInfo {
  std::string id, name;
  std::string format;  ///< "upstream", "kohya", "diffusers"; "" when not read since the engine started
  uint32_t min_rank = 0, max_rank = 0, layers = 0;
  uint64_t bytes = 0;
  bool created = false;  ///< upload: new on the engine
};

/// One LoRA of an edit: its id and strength (-10..10).
struct EditAdapter {
  std::string id;
  double strength = 1.0;
};

/// What on_done receives: the final state, the error (when not DONE) and the result PNG.
struct DoneEvent {
  uint64_t edit_id = 0;
  infill_job_state state = INFILL_JOB_FAILED;
  std::optional<Error> error;
  std::string_view png;         ///< the result file; valid during the callback only
  std::string_view media_type;  ///< its format: "image/png", "image/tiff", "image/x-exr"
  uint32_t steps_run = 0;
  double total_ms = 0;
  /// The K the edit ran with (EditRequest::adapters_from_step); 0 without adapters, when not
  /// DONE, or from a library older than this field (infill_done.adapters_from_step).
  uint32_t adapters_from_step = 0;
};

/// An edit request; see infill_edit_params for each field.
struct EditRequest {
  std::string template_id;
  std::string mask_png;                            ///< an encoded mask image, or
  const uint8_t* mask_pixels = nullptr;            ///< 8-bit grey pixels (not copied), or
  uint32_t mask_width = 0, mask_height = 0;
  size_t mask_stride = 0;
  std::optional<std::array<int32_t, 4>> mask_rect;  ///< x, y, width, height
  std::string prompt;
  uint64_t seed = 0;
  uint32_t steps = 0;
  double strength = 0;
  double guidance = 0;
  std::string sampler;
  infill_edit_class edit_class = INFILL_CLASS_DEFAULT;
  double deadline_ms = 0;
  uint32_t preview_every_steps = 0;
  uint64_t supersedes = 0;
  int32_t halo_tokens = -1;
  double feather_px = -1;
  std::string model;  ///< an infill_model_info id; "" = the engine's default model
  std::string output_format;  ///< "template", "png", "tiff", "exr"; "" = png
  std::vector<EditAdapter> adapters;    ///< LoRAs applied in order (FLUX.2 models), at most 8
  std::vector<std::string> references;  ///< reference template ids (FLUX.2 models), at most 4
  /// Katz's K: the first step that applies `adapters` (0..1000, at most the edit's steps; 0 =
  /// from the first step)
  uint32_t adapters_from_step = 0;
  std::function<void(const infill_progress&)> on_progress;
  std::function<void(const infill_preview&)> on_preview;
  std::function<void(const DoneEvent&)> on_done;
};

/// A submitted edit (move-only). Destroying it releases the handle; the edit runs on.
class Job {
 public:
  Job() = default;
  explicit Job(infill_job* job) : job_(job, &infill_job_release) {}
  explicit operator bool() const noexcept { return job_ != nullptr; }
  uint64_t id() const noexcept { return infill_job_id(job_.get()); }
  infill_job_state state() const noexcept { return infill_job_get_state(job_.get()); }
  std::pair<uint32_t, uint32_t> progress() const noexcept {
    uint32_t done = 0, total = 0;
    infill_job_progress(job_.get(), &done, &total);
    return {done, total};
  }
  void cancel() { detail::check(infill_job_cancel(job_.get())); }
  /// True when on_done has returned; false on timeout.
  bool wait(uint32_t timeout_ms = UINT32_MAX) {
    infill_error* e = infill_job_wait(job_.get(), timeout_ms);
    if (e && infill_error_get_code(e) == INFILL_ERROR_TIMEOUT) {
      infill_error_delete(e);
      return false;
    }
    detail::check(e);
    return true;
  }
  /// The result file (a PNG unless output_format asked otherwise); throws the job's error
  /// when it did not finish DONE.
  std::string result_png() const {
    const void* png = nullptr;
    size_t size = 0;
    if (infill_error* e = infill_job_result(job_.get(), &png, &size)) {
      if (const infill_error* why = infill_job_error(job_.get())) {
        infill_error_delete(e);
        throw Error::copy_of(why);
      }
      throw Error(e);
    }
    return std::string(static_cast<const char*>(png), size);
  }
  /// The result file's media type ("image/png", ...); "" until DONE.
  std::string result_media_type() const { return infill_job_result_media_type(job_.get()); }
  /// The job's error once it ended other than DONE.
  std::optional<Error> error() const {
    const infill_error* e = infill_job_error(job_.get());
    return e ? std::optional<Error>(Error::copy_of(e)) : std::nullopt;
  }
  void write_result(const std::string& path) const { detail::check(infill_job_write_result(job_.get(), path.c_str())); }
  infill_job* get() const noexcept { return job_.get(); }

 private:
  std::unique_ptr<infill_job, void (*)(infill_job*)> job_{nullptr, &infill_job_release};
};

/// A client of one engine (move-only); see infill_client_create / infill_client_destroy.
class Client {
 public:
  explicit Client(const ClientOptions& o = {}) {
    infill_client_options c;
    infill_client_options_init(&c);
    auto opt = [](const std::string& s) { return s.empty() ? nullptr : s.c_str(); };
    c.endpoint = opt(o.endpoint);
    c.token = opt(o.token);
    c.token_file = opt(o.token_file);
    c.client_name = opt(o.client_name);
    if (o.connect_timeout_ms) c.connect_timeout_ms = o.connect_timeout_ms;
    if (o.request_timeout_ms) c.request_timeout_ms = o.request_timeout_ms;
    if (o.stream_idle_timeout_ms) c.stream_idle_timeout_ms = o.stream_idle_timeout_ms;
    if (o.reconnect_interval_ms) c.reconnect_interval_ms = o.reconnect_interval_ms;
    if (o.engine_lost_timeout_ms) c.engine_lost_timeout_ms = o.engine_lost_timeout_ms;
    c.cancel_on_destroy = o.cancel_on_destroy ? 1 : 0;
    infill_client* raw = nullptr;
    detail::check(infill_client_create(&c, &raw));
    client_.reset(raw);
  }

  std::string endpoint() const { return infill_client_endpoint(client_.get()); }
  std::string name() const { return infill_client_name(client_.get()); }

  Health health() {
    infill_health h;
    infill_health_init(&h);
    detail::check(infill_client_health(client_.get(), &h));
    return Health{h.ready != 0, h.live_edits, h.model_id};
  }
  void wait_ready(uint32_t timeout_ms) { detail::check(infill_client_wait_ready(client_.get(), timeout_ms)); }

  /// Cancels an edit by id, whoever submitted it (infill_client_cancel_edit).
  void cancel_edit(uint64_t edit_id) { detail::check(infill_client_cancel_edit(client_.get(), edit_id)); }

  std::vector<ModelInfo> models() {
    infill_model_list* raw = nullptr;
    detail::check(infill_client_list_models(client_.get(), &raw));
    std::unique_ptr<infill_model_list, void (*)(infill_model_list*)> list(raw, &infill_model_list_delete);
    std::vector<ModelInfo> out;
    for (size_t i = 0; i < infill_model_list_count(list.get()); ++i) {
      const infill_model_info* m = infill_model_list_get(list.get(), i);
      ModelInfo info;
      info.id = m->id;
      info.name = m->name;
      info.description = m->description;
      info.default_sampler = m->default_sampler;
      info.default_steps = m->default_steps;
      info.default_guidance = m->default_guidance;
      info.vocabulary.assign(m->vocabulary, m->vocabulary + m->vocabulary_count);
      info.max_image_pixels = m->max_image_pixels;
      info.grid_pixels = m->grid_pixels;
      if (m->struct_size >= offsetof(infill_model_info, family) + sizeof(m->family)) {  // a 1.1 library
        info.free_text = m->free_text != 0;
        info.family = m->family ? m->family : "";
      }
      out.push_back(std::move(info));
    }
    return out;
  }

  TemplateInfo upload_template(std::string_view bytes, const std::string& name = {}) {
    infill_template_info t;
    infill_template_info_init(&t);
    detail::check(infill_client_upload_template(client_.get(), bytes.data(), bytes.size(),
                                                name.empty() ? nullptr : name.c_str(), &t));
    return convert(t);
  }
  TemplateInfo upload_template_file(const std::string& path) {
    infill_template_info t;
    infill_template_info_init(&t);
    detail::check(infill_client_upload_template_file(client_.get(), path.c_str(), &t));
    return convert(t);
  }
  TemplateInfo get_template(const std::string& id) {
    infill_template_info t;
    infill_template_info_init(&t);
    detail::check(infill_client_get_template(client_.get(), id.c_str(), &t));
    return convert(t);
  }

  /// Uploads a LoRA (.safetensors) for `model` ("" = the engine's default model).
  AdapterInfo upload_adapter(std::string_view bytes, const std::string& name = {}, const std::string& model = {}) {
    infill_adapter_info a;
    infill_adapter_info_init(&a);
    detail::check(infill_client_upload_adapter(client_.get(), bytes.data(), bytes.size(),
                                               name.empty() ? nullptr : name.c_str(),
                                               model.empty() ? nullptr : model.c_str(), &a));
    return convert(a);
  }
  AdapterInfo upload_adapter_file(const std::string& path, const std::string& model = {}) {
    infill_adapter_info a;
    infill_adapter_info_init(&a);
    detail::check(infill_client_upload_adapter_file(client_.get(), path.c_str(), model.empty() ? nullptr : model.c_str(), &a));
    return convert(a);
  }
  AdapterInfo get_adapter(const std::string& id) {
    infill_adapter_info a;
    infill_adapter_info_init(&a);
    detail::check(infill_client_get_adapter(client_.get(), id.c_str(), &a));
    return convert(a);
  }
  std::vector<AdapterInfo> adapters() {
    infill_adapter_list* raw = nullptr;
    detail::check(infill_client_list_adapters(client_.get(), &raw));
    std::unique_ptr<infill_adapter_list, void (*)(infill_adapter_list*)> list(raw, &infill_adapter_list_delete);
    std::vector<AdapterInfo> out;
    for (size_t i = 0; i < infill_adapter_list_count(list.get()); ++i) out.push_back(convert(*infill_adapter_list_get(list.get(), i)));
    return out;
  }
  void delete_adapter(const std::string& id) { detail::check(infill_client_delete_adapter(client_.get(), id.c_str())); }

  /// Submits an edit; the callbacks live until on_done has run.
  Job submit(const EditRequest& r) {
    infill_edit_params p;
    infill_edit_params_init(&p);
    p.template_id = r.template_id.c_str();
    if (!r.mask_png.empty()) {
      p.mask_png = r.mask_png.data();
      p.mask_png_size = r.mask_png.size();
    }
    p.mask_pixels = r.mask_pixels;
    p.mask_width = r.mask_width;
    p.mask_height = r.mask_height;
    p.mask_stride = r.mask_stride;
    if (r.mask_rect)
      for (int i = 0; i < 4; ++i) p.mask_rect[i] = (*r.mask_rect)[static_cast<size_t>(i)];
    p.prompt = r.prompt.empty() ? nullptr : r.prompt.c_str();
    p.seed = r.seed;
    p.steps = r.steps;
    p.strength = r.strength;
    p.guidance = r.guidance;
    p.sampler = r.sampler.empty() ? nullptr : r.sampler.c_str();
    p.edit_class = r.edit_class;
    p.deadline_ms = r.deadline_ms;
    p.preview_every_steps = r.preview_every_steps;
    p.supersedes = r.supersedes;
    p.halo_tokens = r.halo_tokens;
    p.feather_px = r.feather_px;
    p.model = r.model.empty() ? nullptr : r.model.c_str();
    p.output_format = r.output_format.empty() ? nullptr : r.output_format.c_str();
    std::vector<infill_edit_adapter> adapters(r.adapters.size());
    for (size_t i = 0; i < adapters.size(); ++i) {
      infill_edit_adapter_init(&adapters[i]);
      adapters[i].id = r.adapters[i].id.c_str();
      adapters[i].strength = r.adapters[i].strength;
    }
    p.adapters = adapters.empty() ? nullptr : adapters.data();
    p.adapter_count = adapters.size();
    std::vector<const char*> references;
    for (const std::string& id : r.references) references.push_back(id.c_str());
    p.references = references.empty() ? nullptr : references.data();
    p.reference_count = references.size();
    p.adapters_from_step = r.adapters_from_step;
    // Owned by the C library's on_done call: freed there, which comes exactly once.
    auto* ctx = new Callbacks{r.on_progress, r.on_preview, r.on_done};
    p.on_progress = ctx->on_progress ? &Client::progress_trampoline : nullptr;
    p.on_preview = ctx->on_preview ? &Client::preview_trampoline : nullptr;
    p.on_done = &Client::done_trampoline;
    p.user_data = ctx;
    infill_job* job = nullptr;
    infill_error* e = infill_client_submit_edit(client_.get(), &p, &job);
    if (e) {
      delete ctx;  // not accepted: no callback will run
      throw Error(e);
    }
    return Job(job);
  }

  infill_client* get() const noexcept { return client_.get(); }

 private:
  struct Callbacks {
    std::function<void(const infill_progress&)> on_progress;
    std::function<void(const infill_preview&)> on_preview;
    std::function<void(const DoneEvent&)> on_done;
  };
  static void progress_trampoline(void* user, const infill_progress* p) {
    try {
      static_cast<Callbacks*>(user)->on_progress(*p);
    } catch (...) {
    }
  }
  static void preview_trampoline(void* user, const infill_preview* p) {
    try {
      static_cast<Callbacks*>(user)->on_preview(*p);
    } catch (...) {
    }
  }
  static void done_trampoline(void* user, const infill_done* d) {
    std::unique_ptr<Callbacks> ctx(static_cast<Callbacks*>(user));
    if (!ctx->on_done) return;
    try {
      DoneEvent e;
      e.edit_id = d->edit_id;
      e.state = d->state;
      if (d->error) e.error = Error::copy_of(d->error);
      e.png = std::string_view(static_cast<const char*>(d->png), d->png_size);
      if (d->media_type) e.media_type = d->media_type;
      e.steps_run = d->steps_run;
      e.total_ms = d->total_ms;
      if (d->struct_size >=
          offsetof(infill_done, adapters_from_step) + sizeof d->adapters_from_step)
        e.adapters_from_step = d->adapters_from_step;
      ctx->on_done(e);
    } catch (...) {
    }
  }
  static AdapterInfo convert(const infill_adapter_info& a) {
    AdapterInfo i;
    i.id = a.id;
    i.name = a.name;
    i.format = a.format;
    i.min_rank = a.min_rank;
    i.max_rank = a.max_rank;
    i.layers = a.layers;
    i.bytes = a.bytes;
    i.created = a.created != 0;
    return i;
  }
  static TemplateInfo convert(const infill_template_info& t) {
    TemplateInfo i;
    i.id = t.id;
    i.width = t.width;
    i.height = t.height;
    i.model_width = t.model_width;
    i.model_height = t.model_height;
    i.channels = t.channels;
    i.format = t.format;
    i.state = t.state;
    i.edits_waiting = t.edits_waiting;
    i.created = t.created != 0;
    return i;
  }

  struct Destroy {
    void operator()(infill_client* c) const noexcept { infill_client_destroy(c); }
  };
  std::unique_ptr<infill_client, Destroy> client_;
};

}  // namespace infill::client
