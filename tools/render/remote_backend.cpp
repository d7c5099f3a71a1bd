#include "remote_backend.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include <infill/infill_client.hpp>

namespace infill::render {
namespace {

namespace ic = infill::client;

// Batch edits wait behind each other on a busy engine; the run's own deadline is the
// runner's, so the engine's is only a backstop (its maximum is a week).
constexpr double kEditDeadlineMs = 24.0 * 3600 * 1000;

RenderFailure failure_of(infill_error_code code) {
  switch (code) {
    case INFILL_ERROR_CONNECTION:
    case INFILL_ERROR_TIMEOUT:
    case INFILL_ERROR_UNAUTHORIZED:
    case INFILL_ERROR_UNAVAILABLE:
    case INFILL_ERROR_RATE_LIMITED:
    case INFILL_ERROR_ENGINE_LOST:
    case INFILL_ERROR_VERSION_MISMATCH:
    case INFILL_ERROR_PROTOCOL: return RenderFailure::kEngine;
    case INFILL_ERROR_REJECTED:
    case INFILL_ERROR_TOO_LARGE:
    case INFILL_ERROR_INVALID_ARGUMENT: return RenderFailure::kBadInput;
    case INFILL_ERROR_CANCELLED:
    case INFILL_ERROR_CLIENT_CLOSED: return RenderFailure::kCancelled;
    case INFILL_ERROR_EXPIRED: return RenderFailure::kDeadline;
    default: return RenderFailure::kInternal;  // server, edit failed, not found, io, internal
  }
}

std::string describe(const ic::Error& e) {
  std::string s = e.what();
  s += " (";
  s += e.code_name();
  if (e.http_status() > 0) s += ", HTTP " + std::to_string(e.http_status());
  if (!e.engine_code().empty()) s += ", " + e.engine_code();
  return s + ")";
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return io_error("cannot read " + path);
  return ss.str();
}

class RemoteBackend final : public RenderBackend {
 public:
  RemoteBackend(std::unique_ptr<ic::Client> client, BackendInfo info)
      : client_(std::move(client)), info_(std::move(info)) {}
  ~RemoteBackend() override {
    // Cancels what is still in flight on the engine; the last on_done calls run here.
    jobs_.clear();
    client_.reset();
  }

  const BackendInfo& info() const override { return info_; }

  Status load_adapter(const std::string& path, RenderFailure& failure) override {
    return adapter_id(path, failure).status();
  }

  Status load_reference(const std::string& path, RenderFailure& failure) override {
    return template_id(path, failure).status();
  }

  Status submit(const RenderEdit& edit, RenderEvents events, RenderFailure& failure) override {
    release_finished();
    failure = RenderFailure::kBadInput;
    auto mask = cached(masks_, edit.mask_path, [&]() -> Result<std::string> { return read_file(edit.mask_path); });
    if (!mask.ok()) return mask.status();
    auto tid = template_id(edit.template_path, failure);
    if (!tid.ok()) return tid.status();
    ic::EditRequest r;
    for (const RenderAdapter& a : edit.adapters) {
      auto id = adapter_id(a.path, failure);
      if (!id.ok()) return id.status();
      r.adapters.push_back({*id, a.strength});
    }
    for (const RenderReference& ref : edit.references) {
      auto id = template_id(ref.path, failure);
      if (!id.ok()) return id.status();
      r.references.push_back(*id);
    }
    failure = RenderFailure::kBadInput;
    try {
      r.template_id = *tid;
      r.mask_png = *mask;
      r.prompt = edit.prompt;
      r.seed = edit.seed;
      r.steps = static_cast<uint32_t>(edit.steps);
      r.strength = edit.strength;
      r.guidance = edit.guidance;
      r.sampler = edit.sampler;
      r.edit_class = INFILL_CLASS_BATCH;
      r.deadline_ms = kEditDeadlineMs;
      r.halo_tokens = edit.halo;
      r.feather_px = edit.feather;
      r.output_format = edit.output_format;
      // Full recompute is a property of the embedded engine; a remote engine always caches.
      const uint64_t id = edit.id;
      r.on_progress = [cb = events.on_progress, id](const infill_progress& p) {
        if (cb) cb(id, static_cast<int>(p.steps_done), static_cast<int>(p.steps_total));
      };
      r.on_done = [this, cb = events.on_complete, id](const ic::DoneEvent& e) {
        RenderOutcome o;
        o.id = id;
        o.steps_run = static_cast<int>(e.steps_run);
        if (e.state == INFILL_JOB_DONE) {
          o.file.resize(e.png.size());
          std::memcpy(o.file.data(), e.png.data(), e.png.size());
          o.used_cache = true;
        } else {
          const infill_error_code code = e.error ? e.error->code() : INFILL_ERROR_EDIT_FAILED;
          o.failure = e.state == INFILL_JOB_CANCELLED ? RenderFailure::kCancelled
                      : e.state == INFILL_JOB_EXPIRED ? RenderFailure::kDeadline
                                                      : failure_of(code);
          o.status = Status(o.failure == RenderFailure::kCancelled ? ErrorCode::kCancelled : ErrorCode::kInternal,
                            "engine " + info_.where + ": " +
                                (e.error ? describe(*e.error) : std::string(infill_job_state_name(e.state))));
        }
        {
          std::lock_guard lock(mu_);
          finished_.insert(id);
        }
        if (cb) cb(std::move(o));
      };
      ic::Job job = client_->submit(r);
      std::lock_guard lock(mu_);
      if (!finished_.erase(id)) jobs_.emplace(id, std::move(job));
      return {};
    } catch (const ic::Error& e) {
      failure = failure_of(e.code());
      return Status(failure == RenderFailure::kBadInput ? ErrorCode::kInvalidArgument : ErrorCode::kInternal,
                    "engine " + info_.where + " refused the edit: " + describe(e));
    }
  }

  void cancel(uint64_t id) override {
    std::unique_lock lock(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    infill_job* job = it->second.get();
    lock.unlock();  // on_done may run inside cancel, and it takes mu_
    // Already finished or the engine is gone: on_done reports it either way.
    if (infill_error* e = infill_job_cancel(job)) infill_error_delete(e);
  }

 private:
  // The engine's id of an uploaded file, by path: uploaded once per run (the engine keeps the
  // same bytes once anyway). `failure` says why an upload failed.
  template <class Upload>
  Result<std::string> upload_once(std::map<std::string, std::string>& ids, const std::string& path, const char* what,
                                  RenderFailure& failure, Upload upload) {
    failure = RenderFailure::kBadInput;
    try {
      return cached(ids, path, [&]() -> Result<std::string> { return upload(); });
    } catch (const ic::Error& e) {
      failure = failure_of(e.code());
      return Status(failure == RenderFailure::kBadInput ? ErrorCode::kInvalidArgument : ErrorCode::kInternal,
                    "engine " + info_.where + " refused " + what + " " + path + ": " + describe(e));
    }
  }
  Result<std::string> template_id(const std::string& path, RenderFailure& failure) {
    return upload_once(templates_, path, "the image", failure, [&] { return client_->upload_template_file(path).id; });
  }
  Result<std::string> adapter_id(const std::string& path, RenderFailure& failure) {
    // Read by the engine for the model the edits run on, so a LoRA for another model fails here.
    return upload_once(adapters_, path, "the LoRA", failure,
                       [&] { return client_->upload_adapter_file(path, info_.model_id).id; });
  }

  // Values by path, computed once (on the runner's thread).
  template <class Make>
  Result<std::string> cached(std::map<std::string, std::string>& map, const std::string& key, Make make) {
    auto it = map.find(key);
    if (it != map.end()) return it->second;
    auto v = make();
    if (!v.ok()) return v.status();
    map.emplace(key, *v);
    return *v;
  }
  // Releases the handles (and with them the kept results) of finished edits.
  void release_finished() {
    std::vector<ic::Job> done;
    std::lock_guard lock(mu_);
    for (auto it = finished_.begin(); it != finished_.end();) {
      auto job = jobs_.find(*it);
      if (job == jobs_.end()) {
        ++it;
        continue;
      }
      done.push_back(std::move(job->second));
      jobs_.erase(job);
      it = finished_.erase(it);
    }
  }

  std::unique_ptr<ic::Client> client_;
  BackendInfo info_;
  std::map<std::string, std::string> templates_, masks_, adapters_;  // runner thread only
  std::mutex mu_;  // guards jobs_ and finished_ (on_done runs on the client's thread)
  std::map<uint64_t, ic::Job> jobs_;
  std::set<uint64_t> finished_;
};

}  // namespace

Result<EngineAddress> parse_engine_address(const std::string& text) {
  const std::string expected = "; expected unix:PATH or http://HOST:PORT";
  EngineAddress a;
  a.text = text;
  if (text.rfind("unix:", 0) == 0) {
    a.unix_path = text.substr(5);
    if (a.unix_path.empty()) return invalid_argument("--engine " + text + ": the socket path is empty" + expected);
    return a;
  }
  if (text.rfind("http://", 0) == 0) {
    std::string rest = text.substr(7);
    if (!rest.empty() && rest.back() == '/') rest.pop_back();
    const size_t colon = rest.rfind(':');
    if (colon == std::string::npos || colon == 0)
      return invalid_argument("--engine " + text + ": no host or port" + expected);
    a.host = rest.substr(0, colon);
    const std::string port = rest.substr(colon + 1);
    if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
        std::stoi(port) < 1 || std::stoi(port) > 65535)
      return invalid_argument("--engine " + text + ": port '" + port + "' is not in 1..65535" + expected);
    a.port = static_cast<uint16_t>(std::stoi(port));
    return a;
  }
  return invalid_argument("--engine " + text + ": unknown scheme" + expected);
}

Result<std::unique_ptr<RenderBackend>> open_remote_backend(const RemoteOptions& options) {
  const std::string where = options.address.text;
  if (!options.address.host.empty() && options.token_file.empty())
    return invalid_argument("--engine " + where + " needs --token-file (TCP engines require a token)");
  ic::ClientOptions co;
  co.endpoint = options.address.unix_path.empty()
                    ? "http://" + options.address.host + ":" + std::to_string(options.address.port)
                    : "unix:" + options.address.unix_path;
  co.token_file = options.token_file;
  co.client_name = "infill-render-" + std::to_string(::getpid());
  try {
    auto client = std::make_unique<ic::Client>(co);
    ic::Health health = client->health();
    if (!health.ready) {
      client->wait_ready(options.ready_timeout_ms);
      health = client->health();
    }
    // /health needs no token; the model list does, so a wrong token fails here.
    const std::vector<ic::ModelInfo> models = client->models();
    const ic::ModelInfo* model = nullptr;
    for (const auto& m : models)
      if (m.id == health.model_id) model = &m;
    if (!model && !models.empty()) model = &models.front();
    if (!model) return Status(ErrorCode::kNotFound, "engine " + where + " serves no model");
    BackendInfo info;
    info.model_id = model->id;
    info.where = where;
    info.default_steps = static_cast<int>(model->default_steps);
    info.default_sampler = model->default_sampler;
    info.default_guidance = model->default_guidance;
    info.max_image_pixels = static_cast<int64_t>(model->max_image_pixels);
    info.free_text = model->free_text;
    if (!model->vocabulary.empty() && !info.free_text) info.vocabulary = model->vocabulary;
    return std::unique_ptr<RenderBackend>(new RemoteBackend(std::move(client), std::move(info)));
  } catch (const ic::Error& e) {
    std::string why = e.code() == INFILL_ERROR_UNAUTHORIZED ? "refused the token"
                      : e.code() == INFILL_ERROR_CONNECTION  ? "is unreachable"
                                                              : "cannot be used";
    if (e.code() == INFILL_ERROR_UNAUTHORIZED && !options.token_file.empty()) why += " in " + options.token_file;
    return Status(ErrorCode::kIoError, "engine " + where + " " + why + ": " + describe(e));
  }
}

}  // namespace infill::render
