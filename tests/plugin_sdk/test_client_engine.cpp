// libinfill_client against a real engine (small random-weight model) behind a real server:
// a Unix socket and TCP with a bearer token. Uploads, edits, callbacks (progress increasing,
// previews that decode, done exactly once), results that differ from the template only inside
// the mask, cancel, supersede, rejected and failing edits, the engine going away and coming
// back, clients destroyed with edits in flight, and concurrent edits from several threads.
#include "support/catch.h"

#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "engine/server/server_fixture.h"
#include "support/random_image.h"
#include "support/step_gate.h"
#include "support/tiny_flux2.h"
#include "infill/infill_client.h"
#include "infill/infill_client.hpp"

using namespace infill;
using infill::test::ServerFixture;
using infill::test::StepGate;

namespace {

using Clock = std::chrono::steady_clock;

struct Err {
  bool failed = false;
  infill_error_code code{};
  std::string message, engine_code;
  int http = 0;
  Err() = default;
  explicit Err(infill_error* e) {
    if (!e) return;
    failed = true;
    code = infill_error_get_code(e);
    message = infill_error_message(e);
    engine_code = infill_error_engine_code(e);
    http = infill_error_http_status(e);
    infill_error_delete(e);
  }
  bool contains(const std::string& s) const { return message.find(s) != std::string::npos; }
};

#define REQUIRE_OK(call)                  \
  do {                                    \
    Err err_(call);                       \
    INFO(err_.message);                   \
    REQUIRE_FALSE(err_.failed);           \
  } while (false)

// Everything the callbacks of one edit saw, from the client's thread.
struct Recorder {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint32_t> progress;
  uint32_t steps_total = 0;
  std::vector<std::string> previews;  // PNG bytes
  int done_calls = 0;
  infill_job_state state{};
  infill_error_code error_code{};
  std::string error_message, engine_code;
  std::string png;
  std::string cache_mode;
  int prompt_truncated = -1;
  int64_t adapters_from_step = -1;  // -1: the library's infill_done has no such field
  std::thread::id done_thread;

  static void on_progress(void* user, const infill_progress* p) {
    auto* r = static_cast<Recorder*>(user);
    std::lock_guard lock(r->mu);
    r->progress.push_back(p->steps_done);
    r->steps_total = p->steps_total;
  }
  static void on_preview(void* user, const infill_preview* p) {
    auto* r = static_cast<Recorder*>(user);
    std::lock_guard lock(r->mu);
    r->previews.emplace_back(static_cast<const char*>(p->png), p->png_size);
  }
  static void on_done(void* user, const infill_done* d) {
    auto* r = static_cast<Recorder*>(user);
    std::lock_guard lock(r->mu);
    ++r->done_calls;
    r->state = d->state;
    r->done_thread = std::this_thread::get_id();
    if (d->error) {
      r->error_code = infill_error_get_code(d->error);
      r->error_message = infill_error_message(d->error);
      r->engine_code = infill_error_engine_code(d->error);
    }
    if (d->png) r->png.assign(static_cast<const char*>(d->png), d->png_size);
    if (d->struct_size >= offsetof(infill_done, prompt_truncated) + sizeof(d->prompt_truncated)) {
      r->cache_mode = d->cache_mode ? d->cache_mode : "";
      r->prompt_truncated = d->prompt_truncated;
    }
    if (d->struct_size >= offsetof(infill_done, adapters_from_step) + sizeof(d->adapters_from_step))
      r->adapters_from_step = d->adapters_from_step;
    r->cv.notify_all();
  }
  void attach(infill_edit_params& p) {
    p.on_progress = &Recorder::on_progress;
    p.on_preview = &Recorder::on_preview;
    p.on_done = &Recorder::on_done;
    p.user_data = this;
  }
  bool wait_done(int timeout_ms = 60000) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return done_calls > 0; });
  }
  bool wait_progress(int timeout_ms = 30000) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    while (Clock::now() < deadline) {
      {
        std::lock_guard lock(mu);
        if (!progress.empty() || done_calls > 0) return !progress.empty();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

struct ClientConfig {
  ClientConfig(std::string ep, std::string tok = {}, uint32_t lost_ms = 0, uint32_t reconnect_ms = 0)
      : endpoint(std::move(ep)), token(std::move(tok)), engine_lost_timeout_ms(lost_ms), reconnect_interval_ms(reconnect_ms) {}
  std::string endpoint;
  std::string token;
  uint32_t engine_lost_timeout_ms = 0;
  uint32_t reconnect_interval_ms = 0;
  bool cancel_on_destroy = true;
};

infill_client* make_client(const ClientConfig& cfg) {
  infill_client_options o;
  infill_client_options_init(&o);
  o.endpoint = cfg.endpoint.c_str();
  o.token = cfg.token.empty() ? nullptr : cfg.token.c_str();
  o.engine_lost_timeout_ms = cfg.engine_lost_timeout_ms;
  o.reconnect_interval_ms = cfg.reconnect_interval_ms;
  o.stream_idle_timeout_ms = 5000;  // the fixture's heartbeat is 500 ms
  o.cancel_on_destroy = cfg.cancel_on_destroy ? 1 : 0;
  infill_client* c = nullptr;
  Err e(infill_client_create(&o, &c));
  INFO(e.message);
  REQUIRE_FALSE(e.failed);
  return c;
}

std::string unix_endpoint(const ServerFixture& f) { return "unix:" + f.unix_ep.unix_path; }
std::string tcp_endpoint(const ServerFixture& f) { return "http://127.0.0.1:" + std::to_string(f.tcp_ep.port); }

infill_template_info upload(infill_client* c, const ServerFixture& f) {
  infill_template_info t;
  infill_template_info_init(&t);
  REQUIRE_OK(infill_client_upload_template(c, f.template_png.data(), f.template_png.size(), "picture.png", &t));
  return t;
}

PixelImage decode(const std::string& png) {
  auto img = decode_image(std::as_bytes(std::span<const char>(png.data(), png.size())), "png", 1 << 22);
  INFO((img.ok() ? std::string() : img.status().to_string()));
  REQUIRE(img.ok());
  return std::move(*img);
}

// Every pixel outside the mask equals the template's; some inside differ.
void check_only_mask_changed(const ServerFixture& f, const std::string& png, const PixelImage& mask) {
  const PixelImage out = decode(png);
  REQUIRE(out.width == 64);
  REQUIRE(out.height == 48);
  REQUIRE(out.channels == 3);
  const auto* a = reinterpret_cast<const uint8_t*>(out.data.data());
  const auto* b = reinterpret_cast<const uint8_t*>(f.picture.data.data());
  const auto* m = reinterpret_cast<const uint8_t*>(mask.data.data());
  int64_t changed_outside = 0, changed_inside = 0;
  for (int i = 0; i < 64 * 48; ++i)
    for (int c = 0; c < 3; ++c) (m[i] == 0 ? changed_outside : changed_inside) += a[i * 3 + c] != b[i * 3 + c];
  CHECK(changed_outside == 0);
  CHECK(changed_inside > 0);
}

infill_edit_params rect_params(const char* template_id, uint32_t steps, uint64_t seed = 1) {
  infill_edit_params p;
  infill_edit_params_init(&p);
  p.template_id = template_id;
  p.mask_rect[0] = 16;
  p.mask_rect[1] = 16;
  p.mask_rect[2] = 24;
  p.mask_rect[3] = 16;
  p.steps = steps;
  p.seed = seed;
  return p;
}

// Waits until `pred` or the timeout.
template <class Pred>
bool eventually(Pred pred, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

// A new HTTP server for the fixture's service on its Unix socket (the old one gone).
void start_server(ServerFixture& f) {
  HttpServerOptions h;
  h.socket_path = f.unix_ep.unix_path;
  h.limits = infill::test::test_limits();
  auto started = HttpServer::start(*f.service, h);
  REQUIRE(started.ok());
  f.server = std::move(*started);
}

// The transport goes away (every connection closed) and comes back; the engine behind it
// carries on.
void restart_server(ServerFixture& f) {
  f.server->stop();
  f.server.reset();
  start_server(f);
}

}  // namespace

TEST_CASE("sdk over the Unix socket: health, models, upload, edit with previews, result", "[sdk][engine]") {
  ServerFixture f;
  infill_client* c = make_client({unix_endpoint(f)});

  infill_health h;
  infill_health_init(&h);
  REQUIRE_OK(infill_client_health(c, &h));
  CHECK(h.ready == 1);
  CHECK(std::string(h.model_id).rfind("infill-", 0) == 0);
  REQUIRE_OK(infill_client_wait_ready(c, 1000));

  infill_model_list* models = nullptr;
  REQUIRE_OK(infill_client_list_models(c, &models));
  REQUIRE(infill_model_list_count(models) == 1);
  const infill_model_info* m = infill_model_list_get(models, 0);
  REQUIRE(m != nullptr);
  CHECK(m->struct_size == sizeof(infill_model_info));
  CHECK(std::string(m->id) == h.model_id);
  CHECK(m->default_steps > 0);
  CHECK(m->grid_pixels == 16);
  CHECK(m->vocabulary_count == 0);  // the random model takes no prompt
  CHECK(infill_model_list_get(models, 1) == nullptr);
  infill_model_list_delete(models);

  const infill_template_info t = upload(c, f);
  CHECK(std::strlen(t.id) == 64);
  CHECK(t.width == 64);
  CHECK(t.height == 48);
  CHECK(t.channels == 3);
  CHECK(std::string(t.format) == "u8");
  CHECK(t.state == INFILL_TEMPLATE_READY);
  CHECK(t.created == 1);
  const infill_template_info again = upload(c, f);
  CHECK(std::string(again.id) == t.id);
  CHECK(again.created == 0);

  // A grey mask given as pixels; the library encodes it.
  const PixelImage mask = infill::test::rect_mask_image(64, 48, 8, 8, 24, 20);
  infill_edit_params p;
  infill_edit_params_init(&p);
  p.template_id = t.id;
  p.mask_pixels = reinterpret_cast<const uint8_t*>(mask.data.data());
  p.mask_width = 64;
  p.mask_height = 48;
  p.steps = 4;
  p.seed = 7;
  p.preview_every_steps = 2;
  p.edit_class = INFILL_CLASS_INTERACTIVE;
  Recorder rec;
  rec.attach(p);
  infill_job* job = nullptr;
  REQUIRE_OK(infill_client_submit_edit(c, &p, &job));
  REQUIRE(job != nullptr);
  CHECK(infill_job_id(job) > 0);
  REQUIRE_OK(infill_job_wait(job, 60000));
  CHECK(infill_job_get_state(job) == INFILL_JOB_DONE);
  {
    std::lock_guard lock(rec.mu);
    CHECK(rec.done_calls == 1);
    CHECK(rec.state == INFILL_JOB_DONE);
    CHECK(rec.done_thread != std::this_thread::get_id());  // the client's own thread
    REQUIRE(rec.progress.size() == 4);
    for (size_t i = 1; i < rec.progress.size(); ++i) CHECK(rec.progress[i] > rec.progress[i - 1]);
    CHECK(rec.progress.back() == 4);
    CHECK(rec.steps_total == 4);
    REQUIRE_FALSE(rec.previews.empty());
    for (const auto& png : rec.previews) {
      const PixelImage preview = decode(png);
      CHECK(preview.width > 0);
      CHECK(preview.width <= 64);
    }
    check_only_mask_changed(f, rec.png, mask);
  }
  uint32_t done = 0, total = 0;
  infill_job_progress(job, &done, &total);
  CHECK(done == 4);
  CHECK(total == 4);
  const void* png = nullptr;
  size_t size = 0;
  REQUIRE_OK(infill_job_result(job, &png, &size));
  CHECK(std::string(static_cast<const char*>(png), size) == rec.png);
  CHECK(infill_job_error(job) == nullptr);
  REQUIRE_OK(infill_job_write_result(job, f.dir.file("result.png").c_str()));
  CHECK(std::filesystem::file_size(f.dir.file("result.png")) == size);
  // Cancelling an edit that ended is not an error.
  CHECK_FALSE(Err(infill_job_cancel(job)).failed);

  // The template is prepared now.
  infill_template_info now;
  infill_template_info_init(&now);
  REQUIRE_OK(infill_client_get_template(c, t.id, &now));
  CHECK(now.state == INFILL_TEMPLATE_PREPARED);
  infill_job_release(job);
  infill_client_destroy(c);
  CHECK(rec.done_calls == 1);
}

TEST_CASE("sdk over TCP needs the token, a wrong or missing one is a clear error", "[sdk][engine][auth]") {
  ServerFixture f;
  // No token anywhere: not in the options, not in $INFILL_TOKEN, not in the config folder.
  infill::test::TempDir config("infill-sdk-config");
  const char* old_config = std::getenv("XDG_CONFIG_HOME");
  const std::string saved_config = old_config ? old_config : "";
  ::setenv("XDG_CONFIG_HOME", config.path().c_str(), 1);
  ::unsetenv("INFILL_TOKEN");

  infill_client* none = make_client({tcp_endpoint(f)});
  infill_health h;
  infill_health_init(&h);
  REQUIRE_OK(infill_client_health(none, &h));  // /health needs no token
  Err missing(infill_client_upload_template(none, f.template_png.data(), f.template_png.size(), "p.png", nullptr));
  CHECK(missing.code == INFILL_ERROR_UNAUTHORIZED);
  CHECK(missing.http == 401);
  CHECK(missing.contains("no token was given"));
  infill_client_destroy(none);

  infill_client* wrong = make_client({tcp_endpoint(f), std::string(64, 'f')});
  Err refused(infill_client_upload_template(wrong, f.template_png.data(), f.template_png.size(), "p.png", nullptr));
  CHECK(refused.code == INFILL_ERROR_UNAUTHORIZED);
  CHECK(refused.http == 401);
  CHECK(refused.engine_code == "unauthorized");
  CHECK(refused.contains("token"));
  infill_edit_params bad = rect_params("0123", 2);
  Recorder never;
  never.attach(bad);
  Err sub(infill_client_submit_edit(wrong, &bad, nullptr));
  CHECK(sub.code == INFILL_ERROR_UNAUTHORIZED);
  infill_client_destroy(wrong);
  CHECK(never.done_calls == 0);

  // The token from a file, as the engine keeps it.
  std::filesystem::create_directories(config.file("infill"));
  { std::ofstream(config.file("infill/token")) << f.token << "\n"; }
  infill_client* good = make_client({tcp_endpoint(f)});
  const infill_template_info t = upload(good, f);
  infill_edit_params p = rect_params(t.id, 3);
  Recorder rec;
  rec.attach(p);
  infill_job* job = nullptr;
  REQUIRE_OK(infill_client_submit_edit(good, &p, &job));
  REQUIRE_OK(infill_job_wait(job, 60000));
  CHECK(rec.done_calls == 1);
  CHECK(rec.state == INFILL_JOB_DONE);
  check_only_mask_changed(f, rec.png, infill::test::rect_mask_image(64, 48, 16, 16, 24, 16));
  infill_job_release(job);
  infill_client_destroy(good);
  if (old_config) ::setenv("XDG_CONFIG_HOME", saved_config.c_str(), 1);
  else ::unsetenv("XDG_CONFIG_HOME");
}

TEST_CASE("sdk: cancel ends an edit as cancelled, with done exactly once", "[sdk][engine]") {
  StepGate gate(1);  // held before its second step: running when the cancel arrives
  ServerFixture f(true, infill::test::test_limits(), false, gate.hook());
  const auto opener = gate.open_on_exit();
  infill_client* c = make_client({unix_endpoint(f)});
  const infill_template_info t = upload(c, f);

  infill_edit_params p = rect_params(t.id, 8);
  Recorder long_edit;
  long_edit.attach(p);
  infill_job* job = nullptr;
  REQUIRE_OK(infill_client_submit_edit(c, &p, &job));
  REQUIRE(gate.wait_held(60000));
  REQUIRE(long_edit.wait_progress());
  REQUIRE_OK(infill_job_cancel(job));
  gate.open();
  REQUIRE_OK(infill_job_wait(job, 30000));
  CHECK(infill_job_get_state(job) == INFILL_JOB_CANCELLED);
  CHECK(long_edit.done_calls == 1);
  CHECK(long_edit.state == INFILL_JOB_CANCELLED);
  CHECK(long_edit.error_code == INFILL_ERROR_CANCELLED);
  REQUIRE(infill_job_error(job) != nullptr);
  CHECK(infill_error_get_code(infill_job_error(job)) == INFILL_ERROR_CANCELLED);
  const void* png = nullptr;
  size_t size = 0;
  Err no_result(infill_job_result(job, &png, &size));
  CHECK(no_result.code == INFILL_ERROR_CONFLICT);
  CHECK(no_result.contains("cancelled"));
  CHECK_FALSE(Err(infill_job_cancel(job)).failed);  // again: a no-op
  infill_job_release(job);
  infill_client_destroy(c);
}

TEST_CASE("sdk: a stroke that supersedes a running one ends it as cancelled, with done exactly once", "[sdk][engine]") {
  StepGate gate(1);  // the first stroke is held before its second step until the next is queued
  ServerFixture f(true, infill::test::test_limits(), false, gate.hook());
  const auto opener = gate.open_on_exit();
  infill_client* c = make_client({unix_endpoint(f)});
  const infill_template_info t = upload(c, f);
  infill_edit_params first = rect_params(t.id, 8, 1);
  Recorder a;
  a.attach(first);
  infill_job* job_a = nullptr;
  REQUIRE_OK(infill_client_submit_edit(c, &first, &job_a));
  REQUIRE(gate.wait_held(60000));
  infill_edit_params second = rect_params(t.id, 3, 2);
  second.supersedes = infill_job_id(job_a);
  second.edit_class = INFILL_CLASS_LIVE;
  Recorder b;
  b.attach(second);
  infill_job* job_b = nullptr;
  REQUIRE_OK(infill_client_submit_edit(c, &second, &job_b));  // answered once queued
  gate.open();
  REQUIRE_OK(infill_job_wait(job_a, 30000));
  REQUIRE_OK(infill_job_wait(job_b, 60000));
  CHECK(a.done_calls == 1);
  CHECK(a.state == INFILL_JOB_CANCELLED);
  CHECK(a.error_message.find("superseded") != std::string::npos);
  CHECK(b.done_calls == 1);
  CHECK(b.state == INFILL_JOB_DONE);
  infill_job_release(job_a);
  infill_job_release(job_b);
  infill_client_destroy(c);
}

TEST_CASE("sdk: edits the engine refuses are submit errors with its message, and no callback", "[sdk][engine][errors]") {
  ServerFixture f;
  infill_client* c = make_client({unix_endpoint(f)});
  const infill_template_info t = upload(c, f);
  Recorder rec;

  // A mask of the wrong size.
  std::vector<uint8_t> pixels(63 * 48, 255);
  infill_edit_params p;
  infill_edit_params_init(&p);
  p.template_id = t.id;
  p.mask_pixels = pixels.data();
  p.mask_width = 63;
  p.mask_height = 48;
  rec.attach(p);
  Err size(infill_client_submit_edit(c, &p, nullptr));
  CHECK(size.code == INFILL_ERROR_REJECTED);
  CHECK(size.http == 400);
  CHECK(size.engine_code == "invalid_mask");
  CHECK(size.contains("mask is 63x48, template is 64x48"));

  // A mask that is no image.
  const std::string junk = "this is not a PNG";
  infill_edit_params q;
  infill_edit_params_init(&q);
  q.template_id = t.id;
  q.mask_png = junk.data();
  q.mask_png_size = junk.size();
  rec.attach(q);
  Err corrupt(infill_client_submit_edit(c, &q, nullptr));
  CHECK(corrupt.code == INFILL_ERROR_REJECTED);
  CHECK(corrupt.http == 400);

  // An unknown template, an unknown sampler, a prompt the model cannot take.
  infill_edit_params r = rect_params("feedbeef", 2);
  rec.attach(r);
  Err unknown(infill_client_submit_edit(c, &r, nullptr));
  CHECK(unknown.code == INFILL_ERROR_NOT_FOUND);
  CHECK(unknown.engine_code == "template_not_found");
  infill_edit_params s = rect_params(t.id, 2);
  s.sampler = "warp_drive";
  rec.attach(s);
  // Not in the parameter table's choices: refused by the SDK before anything is sent.
  Err bad_sampler(infill_client_submit_edit(c, &s, nullptr));
  CHECK(bad_sampler.code == INFILL_ERROR_INVALID_ARGUMENT);
  CHECK(bad_sampler.contains("expected one of euler_rf|ddim"));
  infill_template_info missing;
  infill_template_info_init(&missing);
  Err gone(infill_client_get_template(c, "feedbeef", &missing));
  CHECK(gone.code == INFILL_ERROR_NOT_FOUND);
  CHECK(gone.contains("feedbeef"));

  // A corrupt upload.
  Err upload_err(infill_client_upload_template(c, junk.data(), junk.size(), "junk.png", nullptr));
  CHECK(upload_err.code == INFILL_ERROR_REJECTED);
  CHECK(upload_err.engine_code == "corrupt_data");
  CHECK(upload_err.contains("junk.png"));

  // Over the per-client limit (3 in the fixture): 429 with Retry-After.
  std::vector<infill_job*> jobs;
  Err limited;
  for (int i = 0; i < 5 && !limited.failed; ++i) {
    infill_edit_params e = rect_params(t.id, 1000, uint64_t(i));
    infill_job* j = nullptr;
    limited = Err(infill_client_submit_edit(c, &e, &j));
    if (j) jobs.push_back(j);
  }
  CHECK(limited.code == INFILL_ERROR_RATE_LIMITED);
  CHECK(limited.engine_code == "too_many_edits");
  for (infill_job* j : jobs) {
    CHECK_FALSE(Err(infill_job_cancel(j)).failed);
    CHECK_FALSE(Err(infill_job_wait(j, 30000)).failed);
    infill_job_release(j);
  }
  infill_client_destroy(c);
  CHECK(rec.done_calls == 0);
}

TEST_CASE("sdk: when the engine goes away, edits in flight end as engine_lost, once", "[sdk][engine][failure]") {
  StepGate gate(1);  // the edit is held before its second step: in flight when the engine goes
  ServerFixture f(true, infill::test::test_limits(), false, gate.hook());
  const auto opener = gate.open_on_exit();
  infill_client* c = make_client({unix_endpoint(f), "", /*engine_lost_timeout_ms=*/1500, /*reconnect=*/200});
  const infill_template_info t = upload(c, f);
  infill_edit_params p = rect_params(t.id, 8);
  Recorder rec;
  rec.attach(p);
  infill_job* job = nullptr;
  REQUIRE_OK(infill_client_submit_edit(c, &p, &job));
  REQUIRE(gate.wait_held(60000));
  REQUIRE(rec.wait_progress());
  const auto t0 = Clock::now();
  f.server->stop();  // the socket closes: no events, no reconnect
  REQUIRE(rec.wait_done(20000));
  CHECK(Clock::now() - t0 < std::chrono::seconds(10));
  CHECK(rec.done_calls == 1);
  CHECK(rec.state == INFILL_JOB_FAILED);
  CHECK(rec.error_code == INFILL_ERROR_ENGINE_LOST);
  CHECK(rec.error_message.find("unreachable") != std::string::npos);
  CHECK(infill_job_get_state(job) == INFILL_JOB_FAILED);
  // A new submit says why at once.
  infill_edit_params q = rect_params(t.id, 2);
  Err down(infill_client_submit_edit(c, &q, nullptr));
  CHECK(down.code == INFILL_ERROR_CONNECTION);
  infill_job_release(job);
  infill_client_destroy(c);
  CHECK(rec.done_calls == 1);
  gate.open();
  f.service->drain(0, 5000);
}

TEST_CASE("sdk: after the event stream drops, the client reconnects and reconciles by polling", "[sdk][engine][failure]") {
  // The worker runs the edit's first step, then waits at the gate until the transport is down:
  // the edit is still running when the stream drops, however fast the machine is.
  StepGate gate(1);
  ServerFixture f(true, infill::test::test_limits(), false, gate.hook());
  const auto opener = gate.open_on_exit();
  infill_client* c = make_client({unix_endpoint(f), "", /*engine_lost_timeout_ms=*/60000, /*reconnect=*/200});
  const infill_template_info t = upload(c, f);
  infill_edit_params p = rect_params(t.id, 30);
  Recorder finished_while_down;
  finished_while_down.attach(p);
  infill_job* job = nullptr;
  REQUIRE_OK(infill_client_submit_edit(c, &p, &job));
  REQUIRE(finished_while_down.wait_progress());
  REQUIRE(gate.wait_held(60000));
  // The transport goes away; the engine behind it finishes the edit meanwhile.
  f.server->stop();
  f.server.reset();
  gate.open();
  REQUIRE(eventually([&] { return f.service->live_edits() == 0; }, 60000));
  CHECK(finished_while_down.done_calls == 0);
  start_server(f);
  REQUIRE(finished_while_down.wait_done(20000));
  CHECK(finished_while_down.done_calls == 1);
  CHECK(finished_while_down.state == INFILL_JOB_DONE);
  check_only_mask_changed(f, finished_while_down.png, infill::test::rect_mask_image(64, 48, 16, 16, 24, 16));
  infill_job_release(job);

  // Events flow again on the new stream.
  infill_edit_params q = rect_params(t.id, 3, 9);
  Recorder after;
  after.attach(q);
  REQUIRE_OK(infill_client_submit_edit(c, &q, nullptr));
  REQUIRE(after.wait_done(60000));
  CHECK(after.state == INFILL_JOB_DONE);
  CHECK(after.progress.size() == 3);
  infill_client_destroy(c);
}

TEST_CASE("sdk: an edit the engine reported done is not failed when fetching its result fails on the transport",
          "[sdk][engine][failure]") {
  // The worker holds the edit's last step while the server stops accepting connections: the
  // open event stream still delivers "done", but the GET of the result cannot connect.
  const int steps = 4;
  StepGate gate(steps - 1);
  ServerFixture f(true, infill::test::test_limits(), false, gate.hook());
  const auto opener = gate.open_on_exit();
  infill_client* c = make_client({unix_endpoint(f), "", /*engine_lost_timeout_ms=*/60000, /*reconnect=*/100});
  const infill_template_info t = upload(c, f);
  infill_edit_params p = rect_params(t.id, steps);
  Recorder rec;
  rec.attach(p);
  infill_job* job = nullptr;
  REQUIRE_OK(infill_client_submit_edit(c, &p, &job));
  REQUIRE(gate.wait_held(60000));
  // The client's kept-alive connection from the submit is closed by the engine when idle
  // (limits.header_timeout_ms): then the event stream is the only connection left, and the
  // fetch has to connect anew.
  REQUIRE(eventually([&] { return f.server->connections() == 1; }, 60000));
  f.server->stop_accepting();  // the socket file goes; the stream's connection stays
  // In its place a listener that hangs up on whoever connects: the only connection made now is
  // the client's GET of the result, after the stream delivered "done".
  const int hangup = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(hangup >= 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, f.unix_ep.unix_path.c_str(), sizeof addr.sun_path - 1);
  REQUIRE(::bind(hangup, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  REQUIRE(::listen(hangup, 8) == 0);
  gate.open();
  pollfd pfd{hangup, POLLIN, 0};
  REQUIRE(::poll(&pfd, 1, 60000) == 1);  // the client is fetching the result
  const int fetch = ::accept(hangup, nullptr, nullptr);
  REQUIRE(fetch >= 0);
  ::close(fetch);
  ::close(hangup);
  ::unlink(f.unix_ep.unix_path.c_str());
  // The fetch failed on the transport; the edit is not failed for it.
  CHECK(rec.done_calls == 0);
  CHECK(infill_job_get_state(job) != INFILL_JOB_FAILED);
  // A new listener on the same socket: the next retry fetches the result.
  restart_server(f);
  REQUIRE(rec.wait_done(30000));
  CHECK(rec.done_calls == 1);
  CHECK(rec.state == INFILL_JOB_DONE);
  check_only_mask_changed(f, rec.png, infill::test::rect_mask_image(64, 48, 16, 16, 24, 16));
  infill_job_release(job);
  infill_client_destroy(c);
}

TEST_CASE("sdk: calls reuse a kept-alive connection, and one the engine closed is replaced without an error",
          "[sdk][engine][keepalive]") {
  ServerFixture f;
  infill_client* c = make_client({unix_endpoint(f)});
  const infill_template_info t = upload(c, f);
  // The client's pool drops a connection idle for 1 s (http.cpp's kMaxIdle, below the engine's
  // 1.5 s here): a busy machine that stalls this thread that long between two calls makes the
  // second connect anew. Such a pair is timed from the first call's start to the second's end
  // (longer than the connection's idle time), and allowed one connection more.
  constexpr auto kPoolIdle = std::chrono::milliseconds(1000);
  const uint64_t before = f.server->accepted_connections();
  int stalled_pairs = 0;
  Clock::time_point previous_start{};
  for (int i = 0; i < 20; ++i) {
    const auto start = Clock::now();
    infill_template_info info;
    infill_template_info_init(&info);
    REQUIRE_OK(infill_client_get_template(c, t.id, &info));
    CHECK(info.width == 64);
    if (i > 0 && Clock::now() - previous_start >= kPoolIdle) ++stalled_pairs;
    previous_start = start;
  }
  // Twenty calls, one after the other: at most one new connection (the first may reuse the
  // upload's, unless it outlived the pool's idle limit on a busy machine), and one per stall.
  INFO("pairs of calls a stall kept 1 s or more apart: " << stalled_pairs);
  CHECK(f.server->accepted_connections() - before <= uint64_t(1 + stalled_pairs));

  // The engine goes away and comes back: the pooled connection is closed; the next call
  // notices and connects anew, and the one after reuses that connection (unless a stall kept
  // them 1 s apart).
  restart_server(f);
  const auto t0 = Clock::now();
  infill_template_info info;
  infill_template_info_init(&info);
  REQUIRE_OK(infill_client_get_template(c, t.id, &info));
  infill_health health;
  infill_health_init(&health);
  REQUIRE_OK(infill_client_health(c, &health));
  const bool stalled = Clock::now() - t0 >= kPoolIdle;
  CHECK(f.server->accepted_connections() >= 1);
  CHECK(f.server->accepted_connections() <= (stalled ? 2u : 1u));
  infill_client_destroy(c);
}

TEST_CASE("sdk: destroying a client with edits in flight ends each once and cancels them on the engine", "[sdk][engine]") {
  // Both edits step together from the first step (no step until both are ready: the pool may
  // prepare either first), and the second step waits at the gate: both are in flight at the
  // destroy.
  StepGate gate(1);
  ServerFixture f(true, infill::test::test_limits(), false, gate.hook(), {},
                  [](ServiceOptions& o) { o.may_step = infill::test::step_when_ready(2); });
  const auto opener = gate.open_on_exit();
  infill_client* c = make_client({unix_endpoint(f)});
  const infill_template_info t = upload(c, f);
  Recorder r1, r2;
  infill_edit_params p1 = rect_params(t.id, 8, 1), p2 = rect_params(t.id, 8, 2);
  r1.attach(p1);
  r2.attach(p2);
  infill_job* j1 = nullptr;
  REQUIRE_OK(infill_client_submit_edit(c, &p1, &j1));
  REQUIRE_OK(infill_client_submit_edit(c, &p2, nullptr));
  REQUIRE(gate.wait_held(60000));
  // Both were in the first step; their progress events are on the way.
  REQUIRE(r1.wait_progress());
  REQUIRE(r2.wait_progress());
  const uint64_t id1 = infill_job_id(j1);
  infill_client_destroy(c);  // its DELETEs were answered before it returns
  gate.open();
  // Before destroy returned, on the destroying thread.
  CHECK(r1.done_calls == 1);
  CHECK(r2.done_calls == 1);
  CHECK(r1.error_code == INFILL_ERROR_CLIENT_CLOSED);
  CHECK(r2.error_code == INFILL_ERROR_CLIENT_CLOSED);
  CHECK(r1.done_thread == std::this_thread::get_id());
  // The job handle outlives its client.
  CHECK(infill_job_get_state(j1) == INFILL_JOB_FAILED);
  REQUIRE(infill_job_error(j1) != nullptr);
  CHECK(infill_error_get_code(infill_job_error(j1)) == INFILL_ERROR_CLIENT_CLOSED);
  CHECK_FALSE(Err(infill_job_wait(j1, 0)).failed);
  CHECK_FALSE(Err(infill_job_cancel(j1)).failed);
  infill_job_release(j1);
  // The engine was asked to cancel them.
  REQUIRE(eventually([&] { return f.service->live_edits() == 0; }, 30000));
  auto st = infill::test::request(f.unix_ep, "GET", "/v1/edits/" + std::to_string(id1));
  CHECK(st.json()["state"] == "cancelled");
}

TEST_CASE("sdk: a client may be destroyed from inside a callback", "[sdk][engine]") {
  // Both edits step together from the first step (no step until both are ready), and the
  // second step waits at the gate: the slow edit is still in flight at the destroy.
  StepGate gate(1);
  auto both_ready = std::make_shared<std::atomic<bool>>(false);  // once seen, steps stay allowed
  ServerFixture f(true, infill::test::test_limits(), false, gate.hook(), {}, [both_ready](ServiceOptions& o) {
    o.may_step = [both_ready](size_t ready) {
      if (ready >= 2) *both_ready = true;
      return both_ready->load();
    };
  });
  const auto opener = gate.open_on_exit();
  infill_client* c = make_client({unix_endpoint(f)});
  const infill_template_info t = upload(c, f);
  struct Ctx {
    infill_client* client;
    std::atomic<int> progress_calls{0};
    std::atomic<bool> destroyed{false};
  } ctx{c};
  Recorder other;
  infill_edit_params slow = rect_params(t.id, 8, 3);
  other.attach(slow);
  REQUIRE_OK(infill_client_submit_edit(c, &slow, nullptr));
  infill_edit_params p = rect_params(t.id, 8, 4);
  p.user_data = &ctx;
  p.on_progress = [](void* user, const infill_progress*) {
    auto* x = static_cast<Ctx*>(user);
    if (x->progress_calls++ == 0) {
      // infill_job_wait on an unfinished job from a callback would deadlock: refused.
      infill_client_destroy(x->client);
      x->destroyed = true;
    }
  };
  REQUIRE_OK(infill_client_submit_edit(c, &p, nullptr));
  REQUIRE(eventually([&] { return ctx.destroyed.load(); }, 30000));
  REQUIRE(other.wait_done(30000));
  CHECK(other.done_calls == 1);
  CHECK(other.error_code == INFILL_ERROR_CLIENT_CLOSED);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(ctx.progress_calls.load() == 1);  // none after destroy
  CHECK(other.done_calls == 1);
  gate.open();
  REQUIRE(eventually([&] { return f.service->live_edits() == 0; }, 30000));
}

TEST_CASE("sdk: infill_job_wait from a callback of that unfinished job is refused", "[sdk][engine]") {
  ServerFixture f;
  infill_client* c = make_client({unix_endpoint(f)});
  const infill_template_info t = upload(c, f);
  struct Ctx {
    infill_job* job = nullptr;
    std::mutex mu;
    std::string wait_error;
  } ctx;
  infill_edit_params p = rect_params(t.id, 3);
  p.user_data = &ctx;
  p.on_progress = [](void* user, const infill_progress*) {
    auto* x = static_cast<Ctx*>(user);
    std::lock_guard lock(x->mu);
    if (!x->job || !x->wait_error.empty()) return;
    Err e(infill_job_wait(x->job, 1000));
    x->wait_error = e.failed ? e.message : "no error";
  };
  std::unique_lock lock(ctx.mu);  // the callbacks see the handle only once it is set
  REQUIRE_OK(infill_client_submit_edit(c, &p, &ctx.job));
  lock.unlock();
  REQUIRE_OK(infill_job_wait(ctx.job, 60000));
  {
    std::lock_guard l(ctx.mu);
    CHECK(ctx.wait_error.find("would wait forever") != std::string::npos);
  }
  infill_job_release(ctx.job);
  infill_client_destroy(c);
}

TEST_CASE("sdk: one client, edits from several threads, each gets exactly its own result", "[sdk][engine][concurrency]") {
  ServerLimits limits = infill::test::test_limits();
  limits.max_queued_per_client = 64;
  ServerFixture f(true, limits);
  infill_client* c = make_client({unix_endpoint(f)});
  const infill_template_info t = upload(c, f);
  constexpr int kThreads = 4, kEdits = 3;
  std::vector<std::vector<std::unique_ptr<Recorder>>> recs(kThreads);
  std::vector<std::vector<uint64_t>> ids(kThreads);
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int th = 0; th < kThreads; ++th) {
    threads.emplace_back([&, th] {
      std::vector<infill_job*> jobs;
      for (int e = 0; e < kEdits; ++e) {
        recs[th].push_back(std::make_unique<Recorder>());
        infill_edit_params p = rect_params(t.id, 3, uint64_t(th * 10 + e));
        p.mask_rect[0] = 8 * th;
        p.preview_every_steps = 1;
        recs[th].back()->attach(p);
        infill_job* j = nullptr;
        Err err(infill_client_submit_edit(c, &p, &j));
        if (err.failed) {
          errors[th] += err.message + "; ";
          continue;
        }
        ids[th].push_back(infill_job_id(j));
        jobs.push_back(j);
      }
      for (infill_job* j : jobs) {
        Err w(infill_job_wait(j, 120000));
        if (w.failed) errors[th] += w.message + "; ";
        infill_job_release(j);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<uint64_t> all;
  for (int th = 0; th < kThreads; ++th) {
    INFO("thread " << th << ": " << errors[th]);
    CHECK(errors[th].empty());
    REQUIRE(ids[th].size() == size_t(kEdits));
    for (int e = 0; e < kEdits; ++e) {
      Recorder& r = *recs[th][size_t(e)];
      CHECK(r.done_calls == 1);
      CHECK(r.state == INFILL_JOB_DONE);
      REQUIRE_FALSE(r.progress.empty());
      for (size_t i = 1; i < r.progress.size(); ++i) CHECK(r.progress[i] > r.progress[i - 1]);
      CHECK(r.previews.size() >= 1);
      check_only_mask_changed(f, r.png, infill::test::rect_mask_image(64, 48, 8 * th, 16, 24, 16));
      all.insert(ids[th][size_t(e)]);
    }
  }
  CHECK(all.size() == size_t(kThreads * kEdits));
  infill_client_destroy(c);
}

TEST_CASE("sdk C++ wrapper: RAII handles, exceptions, std::function callbacks", "[sdk][engine][cpp]") {
  ServerFixture f;
  namespace ic = infill::client;
  ic::ClientOptions o;
  o.endpoint = unix_endpoint(f);
  o.client_name = "cpp-wrapper";
  ic::Client client(o);
  CHECK(client.name() == "cpp-wrapper");
  CHECK(client.health().ready);
  const auto models = client.models();
  REQUIRE(models.size() == 1);
  CHECK(models[0].default_steps > 0);
  const ic::TemplateInfo t = client.upload_template(f.template_png, "picture.png");
  CHECK(t.width == 64);

  std::mutex mu;
  std::vector<uint32_t> progress;
  int done_calls = 0;
  std::string result;
  ic::EditRequest req;
  req.template_id = t.id;
  req.mask_rect = {{16, 16, 24, 16}};
  req.steps = 3;
  req.on_progress = [&](const infill_progress& p) {
    std::lock_guard lock(mu);
    progress.push_back(p.steps_done);
  };
  req.on_done = [&](const ic::DoneEvent& e) {
    std::lock_guard lock(mu);
    ++done_calls;
    result.assign(e.png);
    CHECK(!e.error);
  };
  ic::Job job = client.submit(req);
  CHECK(job.wait(60000));
  CHECK(job.state() == INFILL_JOB_DONE);
  CHECK(job.result_png() == result);
  CHECK(done_calls == 1);
  CHECK_FALSE(progress.empty());
  CHECK(std::is_sorted(progress.begin(), progress.end()));
  CHECK_FALSE(job.error());

  // Errors are exceptions with the C error's code and the engine's.
  ic::EditRequest bad = req;
  bad.template_id = "feedbeef";
  try {
    client.submit(bad);
    FAIL("no exception");
  } catch (const ic::Error& e) {
    CHECK(e.code() == INFILL_ERROR_NOT_FOUND);
    CHECK(e.http_status() == 404);
    CHECK(e.engine_code() == "template_not_found");
    CHECK(std::string(e.code_name()) == "not_found");
  }
  ic::ClientOptions wrong;
  wrong.endpoint = "gopher://x";
  CHECK_THROWS_AS(ic::Client(wrong), ic::Error);

  // A cancelled job: result_png throws the job's own error.
  ic::EditRequest slow = req;
  slow.steps = 1000;
  slow.on_progress = nullptr;
  slow.on_done = nullptr;
  ic::Job cancelled = client.submit(slow);
  cancelled.cancel();
  CHECK(cancelled.wait(30000));
  CHECK(cancelled.state() == INFILL_JOB_CANCELLED);
  try {
    (void)cancelled.result_png();
    FAIL("no exception");
  } catch (const ic::Error& e) {
    CHECK(e.code() == INFILL_ERROR_CANCELLED);
  }
}

TEST_CASE("sdk: an engine that is loading answers health with ready = 0 and other calls with unavailable", "[sdk][engine]") {
  ServerFixture f(/*load=*/false);
  infill_client* c = make_client({unix_endpoint(f)});
  infill_health h;
  infill_health_init(&h);
  REQUIRE_OK(infill_client_health(c, &h));
  CHECK(h.ready == 0);
  CHECK(std::string(h.model_id).empty());
  Err waiting(infill_client_wait_ready(c, 300));
  CHECK(waiting.code == INFILL_ERROR_TIMEOUT);
  CHECK(waiting.contains("loading"));
  infill_model_list* list = nullptr;
  infill_error* raw = infill_client_list_models(c, &list);
  REQUIRE(raw != nullptr);
  CHECK(infill_error_retry_after_s(raw) == 1);
  Err loading(raw);
  CHECK(loading.code == INFILL_ERROR_UNAVAILABLE);
  CHECK(loading.http == 503);
  CHECK(loading.engine_code == "not_ready");
  std::atomic<bool> loaded{false};
  std::thread loader([&] { loaded = f.service->load().ok(); });  // no Catch macros off the test thread
  Err ready(infill_client_wait_ready(c, 60000));
  loader.join();
  REQUIRE(loaded);
  INFO(ready.message);
  REQUIRE_FALSE(ready.failed);
  REQUIRE_OK(infill_client_health(c, &h));
  CHECK(h.ready == 1);
  infill_client_destroy(c);
}

TEST_CASE("sdk: infill_edit_params.model picks the engine's model, unknown ids are rejected, API 1.0 callers get the default",
          "[sdk][engine][models]") {
  ServerFixture f(true, infill::test::test_limits(), /*second_model=*/true);
  infill_client* c = make_client({unix_endpoint(f)});
  infill_model_list* models = nullptr;
  REQUIRE_OK(infill_client_list_models(c, &models));
  REQUIRE(infill_model_list_count(models) == 2);
  const std::string first = infill_model_list_get(models, 0)->id;
  const std::string second = infill_model_list_get(models, 1)->id;
  infill_model_list_delete(models);
  CHECK(first != second);
  const infill_template_info t = upload(c, f);
  auto model_of = [&](infill_job* job) {
    infill::test::Response r = infill::test::request(f.unix_ep, "GET", "/v1/edits/" + std::to_string(infill_job_id(job)));
    return r.json()["model"].get<std::string>();
  };

  infill_edit_params p = rect_params(t.id, 3);
  p.model = second.c_str();
  infill_job* job = nullptr;
  REQUIRE_OK(infill_client_submit_edit(c, &p, &job));
  REQUIRE_OK(infill_job_wait(job, 60000));
  CHECK(infill_job_get_state(job) == INFILL_JOB_DONE);
  CHECK(model_of(job) == second);
  infill_job_release(job);

  p.model = "";  // the default
  REQUIRE_OK(infill_client_submit_edit(c, &p, &job));
  REQUIRE_OK(infill_job_wait(job, 60000));
  CHECK(model_of(job) == first);
  infill_job_release(job);

  p.model = "no-such-model";
  Err unknown(infill_client_submit_edit(c, &p, &job));
  CHECK(unknown.code == INFILL_ERROR_REJECTED);
  CHECK(unknown.http == 400);
  CHECK(unknown.engine_code == "unknown_model");
  CHECK(unknown.contains("no-such-model"));
  CHECK(unknown.contains(second));
  CHECK(job == nullptr);

  // A caller compiled against API 1.0: its struct ends before `model`, which is not read.
  p.struct_size = offsetof(infill_edit_params, model);
  REQUIRE_OK(infill_client_submit_edit(c, &p, &job));
  REQUIRE_OK(infill_job_wait(job, 60000));
  CHECK(infill_job_get_state(job) == INFILL_JOB_DONE);
  CHECK(model_of(job) == first);
  infill_job_release(job);

  // The C++ wrapper.
  {
    client::Client cc([&] {
      client::ClientOptions o;
      o.endpoint = unix_endpoint(f);
      return o;
    }());
    client::EditRequest r;
    r.template_id = t.id;
    r.mask_rect = std::array<int32_t, 4>{8, 8, 16, 16};
    r.steps = 2;
    r.model = second;
    client::Job j = cc.submit(r);
    CHECK(j.wait(60000));
    CHECK(j.state() == INFILL_JOB_DONE);
    infill::test::Response s = infill::test::request(f.unix_ep, "GET", "/v1/edits/" + std::to_string(j.id()));
    CHECK(s.json()["model"] == second);
  }
  infill_client_destroy(c);
}

TEST_CASE("sdk with a FLUX.2 model: free-text prompts, the model says so, the result says its cache mode",
          "[sdk][engine][flux2]") {
  ServerFixture f(true, infill::test::test_limits(), false, {}, [](const infill::test::TempDir& dir) {
    infill::test::write_tiny_flux2_folder(dir.file("flux2"));
    return dir.file("flux2");
  });
  infill_client* c = make_client({unix_endpoint(f)});
  infill_model_list* models = nullptr;
  REQUIRE_OK(infill_client_list_models(c, &models));
  const infill_model_info* m = infill_model_list_get(models, 0);
  REQUIRE(m != nullptr);
  CHECK(m->free_text == 1);
  CHECK(std::string(m->family) == "flux2");
  CHECK(m->vocabulary_count == 0);
  infill_model_list_delete(models);
  infill::client::ClientOptions cpp_options;
  cpp_options.endpoint = unix_endpoint(f);
  infill::client::Client cpp(cpp_options);
  const auto infos = cpp.models();
  REQUIRE(infos.size() == 1);
  CHECK(infos[0].free_text);
  CHECK(infos[0].family == "flux2");

  const infill_template_info t = upload(c, f);
  infill_edit_params p = rect_params(t.id, 0, 5);
  p.prompt = "make the cup red, with a soft highlight";
  Recorder rec;
  rec.attach(p);
  infill_job* job = nullptr;
  REQUIRE_OK(infill_client_submit_edit(c, &p, &job));
  REQUIRE_OK(infill_job_wait(job, 120000));
  {
    std::lock_guard lock(rec.mu);
    CHECK(rec.done_calls == 1);
    CHECK(rec.state == INFILL_JOB_DONE);
    CHECK(rec.cache_mode == "template_keyed");
    CHECK(rec.prompt_truncated == 0);
  }
  const PixelImage mask = infill::test::rect_mask_image(64, 48, 16, 16, 24, 16);
  check_only_mask_changed(f, rec.png, mask);
  infill_job_release(job);
  infill_client_destroy(c);
}

TEST_CASE("sdk: infill_client_cancel_edit cancels an edit by id from another client, as the GIMP watcher does",
          "[sdk][engine]") {
  // The worker holds the edit before its second step: it is still running when the other
  // client cancels it, however fast the machine is.
  StepGate gate(1);
  ServerFixture f(true, infill::test::test_limits(), false, gate.hook());
  const auto opener = gate.open_on_exit();
  infill_client* c = make_client({unix_endpoint(f)});
  infill_client* watcher = make_client({unix_endpoint(f)});
  const infill_template_info t = upload(c, f);
  infill_edit_params p = rect_params(t.id, 30);
  Recorder rec;
  rec.attach(p);
  infill_job* job = nullptr;
  REQUIRE_OK(infill_client_submit_edit(c, &p, &job));
  REQUIRE(gate.wait_held(60000));
  REQUIRE_OK(infill_client_cancel_edit(watcher, infill_job_id(job)));
  gate.open();
  REQUIRE(rec.wait_done(60000));
  CHECK(rec.done_calls == 1);
  CHECK(rec.state == INFILL_JOB_CANCELLED);
  // Cancelling it again (it has ended) is not an error; an unknown id and id 0 are.
  CHECK_FALSE(Err(infill_client_cancel_edit(watcher, infill_job_id(job))).failed);
  const Err unknown(infill_client_cancel_edit(watcher, 987654321));
  CHECK(unknown.failed);
  CHECK(unknown.contains("987654321"));
  const Err zero(infill_client_cancel_edit(watcher, 0));
  CHECK(zero.code == INFILL_ERROR_INVALID_ARGUMENT);
  infill_job_release(job);
  infill_client_destroy(watcher);
  infill_client_destroy(c);
}

TEST_CASE("sdk: output_format brings a 16-bit template back at its depth, callers older than 1.2 get PNG", "[sdk][engine][depth]") {
  ServerFixture f;
  namespace ic = infill::client;
  ic::ClientOptions o;
  o.endpoint = unix_endpoint(f);
  o.client_name = "depth";
  ic::Client client(o);
  const PixelImage deep = infill::test::random_image(64, 48, 3, PixelFormat::kU16, 77);
  auto tiff = encode_image(deep, ImageFileFormat::kTiff);
  REQUIRE(tiff.ok());
  const ic::TemplateInfo t = client.upload_template(infill::test::to_string(*tiff), "plate.tif");
  CHECK(t.format == "u16");

  auto run = [&](const std::string& format) {
    ic::EditRequest req;
    req.template_id = t.id;
    req.mask_rect = {{16, 16, 24, 16}};
    req.steps = 2;
    req.output_format = format;
    std::string media_type;
    req.on_done = [&](const ic::DoneEvent& e) { media_type.assign(e.media_type); };
    ic::Job job = client.submit(req);
    REQUIRE(job.wait(60000));
    REQUIRE(job.state() == INFILL_JOB_DONE);
    CHECK(job.result_media_type() == media_type);
    return std::make_pair(media_type, job.result_png());
  };
  const auto [tiff_type, tiff_file] = run("template");
  CHECK(tiff_type == "image/tiff");
  auto back = decode_image(infill::test::bytes_of(tiff_file), "result", 1 << 20);
  REQUIRE(back.ok());
  REQUIRE(back->format == PixelFormat::kU16);
  // Outside the mask rectangle: the upload's 16-bit samples, bit for bit.
  const auto* a = reinterpret_cast<const uint16_t*>(deep.data.data());
  const auto* b = reinterpret_cast<const uint16_t*>(back->data.data());
  int64_t kept_bad = 0;
  for (int y = 0; y < 48; ++y)
    for (int x = 0; x < 64; ++x)
      if (!(x >= 16 && x < 40 && y >= 16 && y < 32))
        for (int c = 0; c < 3; ++c) kept_bad += a[(y * 64 + x) * 3 + c] != b[(y * 64 + x) * 3 + c];
  CHECK(kept_bad == 0);
  CHECK(run("").first == "image/png");  // the SDK's default
  CHECK(run("exr").first == "image/x-exr");

  // A caller compiled against API 1.1 (its struct ends before output_format): a PNG.
  infill_client_options co;
  infill_client_options_init(&co);
  const std::string endpoint = unix_endpoint(f);
  co.endpoint = endpoint.c_str();
  infill_client* c = nullptr;
  REQUIRE(infill_client_create(&co, &c) == nullptr);
  infill_edit_params p;
  infill_edit_params_init(&p);
  p.struct_size = offsetof(infill_edit_params, output_format);
  p.output_format = "exr";  // beyond the caller's struct: never read
  p.template_id = t.id.c_str();
  p.mask_rect[0] = 8;
  p.mask_rect[1] = 8;
  p.mask_rect[2] = 8;
  p.mask_rect[3] = 8;
  p.steps = 1;
  infill_job* job = nullptr;
  REQUIRE(infill_client_submit_edit(c, &p, &job) == nullptr);
  REQUIRE(infill_job_wait(job, 60000) == nullptr);
  CHECK(std::string(infill_job_result_media_type(job)) == "image/png");
  infill_job_release(job);

  p.struct_size = sizeof p;
  p.output_format = "jpeg";
  Err bad(infill_client_submit_edit(c, &p, nullptr));
  CHECK(bad.code == INFILL_ERROR_INVALID_ARGUMENT);
  CHECK(bad.contains("output_format is \"jpeg\""));
  CHECK(bad.contains("template|png|tiff|exr"));
  infill_client_destroy(c);
}

TEST_CASE("sdk with a FLUX.2 model: a LoRA uploaded once, listed, changing the edits that name it, refused when unknown, deleted",
          "[sdk][engine][flux2][lora]") {
  ServerFixture f(true, infill::test::test_limits(), false, {}, [](const infill::test::TempDir& dir) {
    infill::test::write_tiny_flux2_folder(dir.file("flux2"));
    return dir.file("flux2");
  });
  const Flux2Config config = infill::test::tiny_flux2_config(3 * infill::test::tiny_qwen3_config().hidden_size);
  const std::string lora_path = f.dir.file("style.safetensors");
  {
    c10::InferenceMode guard;
    infill::test::write_random_lora(lora_path, config, 11);
  }
  std::ifstream in(lora_path, std::ios::binary);
  const std::string lora((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  infill_client* c = make_client({unix_endpoint(f)});

  infill_adapter_info a;
  infill_adapter_info_init(&a);
  REQUIRE_OK(infill_client_upload_adapter_file(c, lora_path.c_str(), nullptr, &a));
  const std::string id = a.id;
  CHECK(id.size() == 64);
  CHECK(a.created == 1);
  CHECK(std::string(a.name) == "style.safetensors");
  CHECK(std::string(a.format) == "upstream");
  CHECK(a.min_rank == 4);
  CHECK(a.max_rank == 4);
  CHECK(a.layers == flux2_linear_layers(config).size());
  CHECK(a.bytes == lora.size());
  // The same bytes again (from memory, through the C++ wrapper): the same adapter, not new.
  infill::client::Client cpp([&] {
    infill::client::ClientOptions o;
    o.endpoint = unix_endpoint(f);
    return o;
  }());
  const infill::client::AdapterInfo again = cpp.upload_adapter(lora, "again.safetensors");
  CHECK(again.id == id);
  CHECK_FALSE(again.created);
  infill_adapter_list* list = nullptr;
  REQUIRE_OK(infill_client_list_adapters(c, &list));
  REQUIRE(infill_adapter_list_count(list) == 1);
  CHECK(std::string(infill_adapter_list_get(list, 0)->id) == id);
  infill_adapter_list_delete(list);
  REQUIRE(cpp.adapters().size() == 1);
  CHECK(cpp.get_adapter(id).layers == a.layers);

  // A file the model cannot use: refused with the engine's message naming the upload.
  const Err cut(infill_client_upload_adapter(c, lora.data(), lora.size() / 2, "cut.safetensors", nullptr, nullptr));
  CHECK(cut.code == INFILL_ERROR_REJECTED);
  CHECK(cut.http == 400);
  CHECK(cut.engine_code == "invalid_adapter");
  CHECK(cut.contains("cut.safetensors"));

  // Edits: without the LoRA, with it, with it again. Inside the mask the LoRA changes the
  // result, and the same request comes out the same; outside every pixel is the template's.
  const infill_template_info t = upload(c, f);
  const PixelImage mask = infill::test::rect_mask_image(64, 48, 16, 16, 24, 16);
  auto run = [&](const infill_edit_adapter* adapters, size_t count) {
    infill_edit_params p = rect_params(t.id, 0, 5);
    p.prompt = "make the cup red";
    p.adapters = adapters;
    p.adapter_count = count;
    infill_job* job = nullptr;
    REQUIRE_OK(infill_client_submit_edit(c, &p, &job));
    REQUIRE_OK(infill_job_wait(job, 120000));
    REQUIRE(infill_job_get_state(job) == INFILL_JOB_DONE);
    const void* png = nullptr;
    size_t size = 0;
    REQUIRE_OK(infill_job_result(job, &png, &size));
    const std::string out(static_cast<const char*>(png), size);
    infill_job_release(job);
    check_only_mask_changed(f, out, mask);
    return decode(out).data;
  };
  infill_edit_adapter with;
  infill_edit_adapter_init(&with);
  with.id = id.c_str();
  with.strength = 1.5;
  const auto plain = run(nullptr, 0);
  const auto adapted = run(&with, 1);
  CHECK((adapted != plain));
  CHECK((run(&with, 1) == adapted));
  // The C++ wrapper's adapter list makes the same request.
  {
    infill::client::EditRequest r;
    r.template_id = t.id;
    r.mask_rect = std::array<int32_t, 4>{16, 16, 24, 16};
    r.seed = 5;
    r.prompt = "make the cup red";
    r.adapters = {{id, 1.5}};
    infill::client::Job j = cpp.submit(r);
    REQUIRE(j.wait(120000));
    CHECK((decode(j.result_png()).data == adapted));
  }

  // The done event states the K each edit ran with (Katz's K): the one asked for with adapters,
  // 0 without them, in the C struct and in the C++ wrapper's DoneEvent.
  auto done_k = [&](const infill_edit_adapter* adapters, size_t count, uint32_t k) {
    infill_edit_params q = rect_params(t.id, 4, 5);
    q.adapters = adapters;
    q.adapter_count = count;
    q.adapters_from_step = k;
    Recorder rec;
    rec.attach(q);
    infill_job* job = nullptr;
    REQUIRE_OK(infill_client_submit_edit(c, &q, &job));
    REQUIRE_OK(infill_job_wait(job, 120000));
    infill_job_release(job);
    std::lock_guard lock(rec.mu);
    CHECK(rec.state == INFILL_JOB_DONE);
    return rec.adapters_from_step;
  };
  CHECK(done_k(&with, 1, 2) == 2);
  CHECK(done_k(&with, 1, 4) == 4);
  CHECK(done_k(nullptr, 0, 0) == 0);
  {
    infill::client::EditRequest r;
    r.template_id = t.id;
    r.mask_rect = std::array<int32_t, 4>{16, 16, 24, 16};
    r.steps = 4;
    r.adapters = {{id, 1.5}};
    r.adapters_from_step = 3;
    std::optional<uint32_t> k;
    r.on_done = [&](const infill::client::DoneEvent& e) { k = e.adapters_from_step; };
    infill::client::Job j = cpp.submit(r);
    REQUIRE(j.wait(120000));
    REQUIRE(j.state() == INFILL_JOB_DONE);
    CHECK(k == 3u);
  }

  // An id the store does not hold: refused by the engine, its code and message surfaced.
  const std::string unknown_id(64, 'a');
  infill_edit_adapter unknown;
  infill_edit_adapter_init(&unknown);
  unknown.id = unknown_id.c_str();
  infill_edit_params p = rect_params(t.id, 0, 5);
  p.adapters = &unknown;
  p.adapter_count = 1;
  infill_job* job = nullptr;
  const Err refused(infill_client_submit_edit(c, &p, &job));
  CHECK(refused.code == INFILL_ERROR_NOT_FOUND);
  CHECK(refused.http == 404);
  CHECK(refused.engine_code == "unknown_adapter");
  CHECK(refused.contains(unknown_id));
  CHECK(job == nullptr);

  // Deleted: gone from the list, and edits naming it are refused.
  REQUIRE_OK(infill_client_delete_adapter(c, id.c_str()));
  REQUIRE_OK(infill_client_list_adapters(c, &list));
  CHECK(infill_adapter_list_count(list) == 0);
  infill_adapter_list_delete(list);
  infill_adapter_info_init(&a);
  const Err gone(infill_client_get_adapter(c, id.c_str(), &a));
  CHECK(gone.code == INFILL_ERROR_NOT_FOUND);
  CHECK(gone.engine_code == "unknown_adapter");
  CHECK(Err(infill_client_delete_adapter(c, id.c_str())).code == INFILL_ERROR_NOT_FOUND);
  p.adapters = &with;
  const Err after_delete(infill_client_submit_edit(c, &p, nullptr));
  CHECK(after_delete.engine_code == "unknown_adapter");
  infill_client_destroy(c);
}

TEST_CASE("sdk with a FLUX.2 model: reference images change the edit inside the mask, repeat exactly, and bad ones are refused",
          "[sdk][engine][flux2][references]") {
  ServerFixture f(true, infill::test::test_limits(), false, {}, [](const infill::test::TempDir& dir) {
    infill::test::write_tiny_flux2_folder(dir.file("flux2"));
    return dir.file("flux2");
  });
  infill_client* c = make_client({unix_endpoint(f)});
  const infill_template_info t = upload(c, f);
  auto upload_image = [&](int width, int height, uint64_t seed, const char* name) {
    auto png = encode_image(infill::test::random_image(width, height, 3, PixelFormat::kU8, seed), ImageFileFormat::kPng);
    REQUIRE(png.ok());
    const std::string bytes = infill::test::to_string(*png);
    infill_template_info r;
    infill_template_info_init(&r);
    REQUIRE_OK(infill_client_upload_template(c, bytes.data(), bytes.size(), name, &r));
    return std::string(r.id);
  };
  const std::string ref_a = upload_image(64, 96, 1, "a.png"), ref_b = upload_image(80, 64, 2, "b.png");
  const std::string tiny = upload_image(48, 48, 3, "tiny.png");
  const PixelImage mask = infill::test::rect_mask_image(64, 48, 16, 16, 24, 16);
  auto params = [&](const char* const* refs, size_t count) {
    infill_edit_params p = rect_params(t.id, 0, 3);
    p.prompt = "make the cup red";
    p.references = refs;
    p.reference_count = count;
    return p;
  };
  auto run = [&](const char* const* refs, size_t count) {
    const infill_edit_params p = params(refs, count);
    infill_job* job = nullptr;
    REQUIRE_OK(infill_client_submit_edit(c, &p, &job));
    REQUIRE_OK(infill_job_wait(job, 120000));
    REQUIRE(infill_job_get_state(job) == INFILL_JOB_DONE);
    const void* png = nullptr;
    size_t size = 0;
    REQUIRE_OK(infill_job_result(job, &png, &size));
    const std::string out(static_cast<const char*>(png), size);
    infill_job_release(job);
    check_only_mask_changed(f, out, mask);
    return decode(out).data;
  };
  const char* refs[] = {ref_a.c_str(), ref_b.c_str()};
  const auto plain = run(nullptr, 0);
  const auto referenced = run(refs, 2);
  CHECK((referenced != plain));
  CHECK((run(refs, 2) == referenced));
  {
    infill::client::Client cpp([&] {
      infill::client::ClientOptions o;
      o.endpoint = unix_endpoint(f);
      return o;
    }());
    infill::client::EditRequest r;
    r.template_id = t.id;
    r.mask_rect = std::array<int32_t, 4>{16, 16, 24, 16};
    r.seed = 3;
    r.prompt = "make the cup red";
    r.references = {ref_a, ref_b};
    infill::client::Job j = cpp.submit(r);
    REQUIRE(j.wait(120000));
    CHECK((decode(j.result_png()).data == referenced));
  }

  // What only the engine knows comes back with its code and message.
  const std::string unknown_id(64, 'f');
  const char* unknown[] = {ref_a.c_str(), unknown_id.c_str()};
  infill_edit_params p = params(unknown, 2);
  const Err not_found(infill_client_submit_edit(c, &p, nullptr));
  CHECK(not_found.code == INFILL_ERROR_NOT_FOUND);
  CHECK(not_found.engine_code == "template_not_found");
  CHECK(not_found.contains("references[1]"));
  const char* small[] = {tiny.c_str()};
  p = params(small, 1);
  const Err too_small(infill_client_submit_edit(c, &p, nullptr));
  CHECK(too_small.code == INFILL_ERROR_REJECTED);
  CHECK(too_small.engine_code == "invalid_reference");
  CHECK(too_small.contains("48x48"));
  infill_client_destroy(c);
}
