// libinfill_client against a scripted fake engine on a Unix socket: the cases a real engine
// does not produce on demand. An edit that fails inside the engine, expired edits, duplicate,
// late, malformed and foreign events, events that beat the POST's answer, a result that cannot
// be fetched: on_done still comes exactly once, with the right state and error.
#include "support/catch.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "infill/infill_client.h"
#include "support/temp_dir.h"

namespace {

struct Reply {
  int status = 404;
  std::string body = R"({"error":{"code":"no_such_route","message":"fake engine","type":"not_found"}})";
  std::string content_type = "application/json";
};

// One thread accepts; each request is served on its own thread. /v1/events connections stay
// open and receive what push() sends.
class FakeEngine {
 public:
  using Handler = std::function<Reply(const std::string& method, const std::string& target, const std::string& body)>;

  FakeEngine(std::string path, Handler handler) : path_(std::move(path)), handler_(std::move(handler)) {
    listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    REQUIRE(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listen_fd_, 16) == 0);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~FakeEngine() {
    stop_ = true;
    acceptor_.join();
    for (auto& t : workers_) t.join();
    std::lock_guard lock(mu_);
    for (int fd : streams_) ::close(fd);
    ::close(listen_fd_);
    ::unlink(path_.c_str());
  }

  /// Sends one SSE event to every open stream.
  void push(const std::string& type, const std::string& data) {
    const std::string text = "event: " + type + "\ndata: " + data + "\n\n";
    std::lock_guard lock(mu_);
    for (int fd : streams_) (void)::send(fd, text.data(), text.size(), MSG_NOSIGNAL);
  }
  /// Closes every open event stream (the engine restarting, a proxy dropping it).
  void drop_streams() {
    std::lock_guard lock(mu_);
    for (int fd : streams_) {
      ::shutdown(fd, SHUT_RDWR);
      ::close(fd);
    }
    streams_.clear();
  }
  int streams_opened() const { return opened_.load(); }
  bool wait_for_stream(int timeout_ms = 5000) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return !streams_.empty(); });
  }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      workers_.emplace_back([this, fd] { serve(fd); });
    }
  }
  void serve(int fd) {
    std::string in;
    char buf[4096];
    size_t head_end;
    while ((head_end = in.find("\r\n\r\n")) == std::string::npos) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) {
        ::close(fd);
        return;
      }
      in.append(buf, size_t(n));
    }
    const std::string head = in.substr(0, head_end);
    const std::string method = head.substr(0, head.find(' '));
    const size_t t0 = head.find(' ') + 1;
    const std::string target = head.substr(t0, head.find(' ', t0) - t0);
    size_t length = 0;
    for (const char* key : {"Content-Length: ", "content-length: "})
      if (auto k = head.find(key); k != std::string::npos) length = std::stoul(head.substr(k + std::strlen(key)));
    std::string body = in.substr(head_end + 4);
    while (body.size() < length) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      body.append(buf, size_t(n));
    }
    if (target.rfind("/v1/events", 0) == 0) {
      const std::string ok = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\nretry: 1000\n: hi\n\n";
      // Registered before the client can see the answer: a push right after reaches it.
      std::lock_guard lock(mu_);
      streams_.push_back(fd);
      ++opened_;
      (void)::send(fd, ok.data(), ok.size(), MSG_NOSIGNAL);
      cv_.notify_all();
      return;
    }
    const Reply r = handler_(method, target, body);
    const std::string out = "HTTP/1.1 " + std::to_string(r.status) + " X\r\nContent-Type: " + r.content_type +
                            "\r\nContent-Length: " + std::to_string(r.body.size()) + "\r\nConnection: close\r\n\r\n" + r.body;
    (void)::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
    ::shutdown(fd, SHUT_WR);
    while (::recv(fd, buf, sizeof buf, 0) > 0) {
    }
    ::close(fd);
  }

  std::string path_;
  Handler handler_;
  int listen_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread acceptor_;
  std::vector<std::thread> workers_;  // joined at the end (the tests are short)
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> streams_;
  std::atomic<int> opened_{0};
};

struct Seen {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint32_t> progress;
  int done_calls = 0;
  infill_job_state state{};
  infill_error_code code{};
  std::string message, engine_code, png;
  uint32_t adapters_from_step = 0;

  static void on_progress(void* u, const infill_progress* p) {
    auto* s = static_cast<Seen*>(u);
    std::lock_guard lock(s->mu);
    s->progress.push_back(p->steps_done);
    s->cv.notify_all();
  }
  static void on_done(void* u, const infill_done* d) {
    auto* s = static_cast<Seen*>(u);
    std::lock_guard lock(s->mu);
    ++s->done_calls;
    s->state = d->state;
    if (d->error) {
      s->code = infill_error_get_code(d->error);
      s->message = infill_error_message(d->error);
      s->engine_code = infill_error_engine_code(d->error);
    }
    if (d->png) s->png.assign(static_cast<const char*>(d->png), d->png_size);
    s->adapters_from_step = d->adapters_from_step;
    s->cv.notify_all();
  }
  bool wait_done() {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return done_calls > 0; });
  }
  bool wait_progress(size_t calls) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return progress.size() >= calls; });
  }
};

infill_client* client_for(const std::string& sock, const char* name = nullptr) {
  infill_client_options o;
  infill_client_options_init(&o);
  const std::string ep = "unix:" + sock;
  o.endpoint = ep.c_str();
  o.client_name = name;
  o.reconnect_interval_ms = 100;
  o.engine_lost_timeout_ms = 2000;
  infill_client* c = nullptr;
  infill_error* e = infill_client_create(&o, &c);
  REQUIRE(e == nullptr);
  return c;
}

infill_job* submit(infill_client* c, Seen& seen) {
  infill_edit_params p;
  infill_edit_params_init(&p);
  p.template_id = "fake";
  p.mask_rect[2] = p.mask_rect[3] = 8;
  p.on_progress = &Seen::on_progress;
  p.on_done = &Seen::on_done;
  p.user_data = &seen;
  infill_job* job = nullptr;
  infill_error* e = infill_client_submit_edit(c, &p, &job);
  if (e) {
    INFO(infill_error_message(e));
    infill_error_delete(e);
    FAIL("submit failed");
  }
  return job;
}

Reply accepted(uint64_t id) { return Reply{202, R"({"id":)" + std::to_string(id) + R"(,"state":"queued"})", "application/json"}; }

}  // namespace

TEST_CASE("sdk protocol: an edit that fails in the engine ends once, duplicates, junk and late events are ignored",
          "[sdk][protocol]") {
  infill::test::TempDir dir("infill-sdk-fake");
  FakeEngine engine(dir.file("engine.sock"), [](const std::string& m, const std::string& t, const std::string&) {
    if (m == "POST" && t == "/v1/edits") return accepted(41);
    return Reply{};
  });
  infill_client* c = client_for(dir.file("engine.sock"));
  Seen seen;
  infill_job* job = submit(c, seen);
  CHECK(infill_job_id(job) == 41);
  engine.push("queued", R"({"id":41,"type":"queued"})");
  engine.push("started", R"({"id":41,"type":"started","steps_total":3})");
  engine.push("progress", R"({"id":41,"type":"progress","steps_done":1,"steps_total":3})");
  engine.push("progress", R"({"id":41,"type":"progress","steps_done":1,"steps_total":3})");  // a duplicate
  engine.push("progress", "this is not JSON");
  engine.push("progress", R"({"id":999,"type":"progress","steps_done":1,"steps_total":3})");  // not ours
  engine.push("mystery", R"({"id":41,"type":"mystery"})");
  engine.push("progress", R"({"id":41,"type":"progress","steps_done":2,"steps_total":3})");
  engine.push("failed", R"({"id":41,"type":"failed","state":"failed","error":{"code":"internal","message":"the GPU fell off"}})");
  engine.push("done", R"({"id":41,"type":"done","result":"/v1/edits/41/result"})");  // after the end: ignored
  engine.push("progress", R"({"id":41,"type":"progress","steps_done":3,"steps_total":3})");
  REQUIRE(seen.wait_done());
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::lock_guard lock(seen.mu);
  CHECK(seen.done_calls == 1);
  CHECK(seen.state == INFILL_JOB_FAILED);
  CHECK(seen.code == INFILL_ERROR_EDIT_FAILED);
  CHECK(seen.engine_code == "internal");
  CHECK(seen.message.find("the GPU fell off") != std::string::npos);
  CHECK(seen.message.find("edit 41") != std::string::npos);
  CHECK(seen.progress == std::vector<uint32_t>{1, 2});
  CHECK(infill_job_get_state(job) == INFILL_JOB_FAILED);
  infill_job_release(job);
  infill_client_destroy(c);
  CHECK(seen.done_calls == 1);
}

TEST_CASE("sdk protocol: events that arrive before the POST's answer are held for the edit", "[sdk][protocol]") {
  infill::test::TempDir dir("infill-sdk-fake");
  FakeEngine* self = nullptr;
  FakeEngine engine(dir.file("engine.sock"), [&](const std::string& m, const std::string& t, const std::string&) {
    if (m == "POST" && t == "/v1/edits") {
      // The engine emits before it answers: the client must not drop these.
      self->push("queued", R"({"id":42,"type":"queued"})");
      self->push("progress", R"({"id":42,"type":"progress","steps_done":1,"steps_total":1})");
      self->push("done", R"({"id":42,"type":"done","result":"/v1/edits/42/result","steps_run":1,"total_ms":12.5})");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      return accepted(42);
    }
    if (m == "GET" && t == "/v1/edits/42/result") return Reply{200, "PNG-BYTES", "image/png"};
    return Reply{};
  });
  self = &engine;
  infill_client* c = client_for(dir.file("engine.sock"));
  Seen seen;
  infill_job* job = submit(c, seen);
  REQUIRE(seen.wait_done());
  {
    std::lock_guard lock(seen.mu);
    CHECK(seen.done_calls == 1);
    CHECK(seen.state == INFILL_JOB_DONE);
    CHECK(seen.png == "PNG-BYTES");
    CHECK(seen.progress == std::vector<uint32_t>{1});
  }
  infill_job_release(job);
  infill_client_destroy(c);
}

TEST_CASE("sdk protocol: expired edits and results that cannot be fetched end once with the reason", "[sdk][protocol]") {
  infill::test::TempDir dir("infill-sdk-fake");
  std::atomic<uint64_t> next{50};
  FakeEngine engine(dir.file("engine.sock"), [&](const std::string& m, const std::string& t, const std::string&) {
    if (m == "POST" && t == "/v1/edits") return accepted(next++);
    return Reply{};  // every result: 404
  });
  infill_client* c = client_for(dir.file("engine.sock"));
  Seen expired, lost;
  infill_job* a = submit(c, expired);
  infill_job* b = submit(c, lost);
  REQUIRE(engine.wait_for_stream());
  engine.push("failed", R"({"id":50,"type":"failed","state":"expired","error":{"code":"out_of_range","message":"missed its deadline of 800 ms"}})");
  engine.push("done", R"({"id":51,"type":"done","result":"/v1/edits/51/result"})");
  REQUIRE(expired.wait_done());
  REQUIRE(lost.wait_done());
  CHECK(expired.state == INFILL_JOB_EXPIRED);
  CHECK(expired.code == INFILL_ERROR_EXPIRED);
  CHECK(lost.done_calls == 1);
  CHECK(lost.state == INFILL_JOB_FAILED);
  CHECK(lost.code == INFILL_ERROR_NOT_FOUND);
  CHECK(lost.message.find("result of edit 51") != std::string::npos);
  const void* png = nullptr;
  size_t size = 0;
  infill_error* e = infill_job_result(b, &png, &size);
  REQUIRE(e != nullptr);
  CHECK(infill_error_get_code(e) == INFILL_ERROR_CONFLICT);
  infill_error_delete(e);
  infill_job_release(a);
  infill_job_release(b);
  infill_client_destroy(c);
  CHECK(expired.done_calls == 1);
  CHECK(lost.done_calls == 1);
}

TEST_CASE("sdk protocol: after the stream drops, polling settles edits finished, forgotten or reused meanwhile",
          "[sdk][protocol]") {
  infill::test::TempDir dir("infill-sdk-fake");
  std::atomic<uint64_t> next{60};
  FakeEngine engine(dir.file("engine.sock"), [&](const std::string& m, const std::string& t, const std::string&) {
    if (m == "POST" && t == "/v1/edits") return accepted(next++);
    auto status = [](const std::string& j) { return Reply{200, j, "application/json"}; };
    if (m == "GET" && t == "/v1/edits/60")
      return status(
          R"({"id":60,"client":"painter","state":"done","steps_done":4,"steps_total":4,"metrics":{"steps_run":4,"total_ms":9,"adapters_from_step":3}})");
    if (m == "GET" && t == "/v1/edits/60/result") return Reply{200, "R60", "image/png"};
    if (m == "GET" && t == "/v1/edits/62") return status(R"({"id":62,"client":"somebody-else","state":"running"})");
    if (m == "GET" && t == "/v1/edits/63")
      return status(R"({"id":63,"client":"painter","state":"running","steps_done":2,"steps_total":4})");
    if (m == "GET" && t == "/v1/edits/63/result") return Reply{200, "R63", "image/png"};
    return Reply{};  // 61: not known any more
  });
  infill_client* c = client_for(dir.file("engine.sock"), "painter");
  Seen s60, s61, s62, s63;
  std::vector<infill_job*> jobs = {submit(c, s60), submit(c, s61), submit(c, s62), submit(c, s63)};
  REQUIRE(engine.wait_for_stream());
  engine.push("progress", R"({"id":63,"type":"progress","steps_done":1,"steps_total":4})");
  REQUIRE(s63.wait_progress(1));  // the client saw step 1 on the stream before it drops
  engine.drop_streams();
  REQUIRE(s60.wait_done());
  REQUIRE(s61.wait_done());
  REQUIRE(s62.wait_done());
  CHECK(engine.streams_opened() == 2);
  CHECK(s60.state == INFILL_JOB_DONE);
  CHECK(s60.png == "R60");
  CHECK(s61.code == INFILL_ERROR_ENGINE_LOST);
  CHECK(s62.code == INFILL_ERROR_ENGINE_LOST);
  CHECK(s62.message.find("another edit") != std::string::npos);
  // 63 still runs: the poll brought its progress, the new stream its end.
  REQUIRE(engine.wait_for_stream());
  engine.push("done",
              R"({"id":63,"type":"done","result":"/v1/edits/63/result","adapters_from_step":2})");
  REQUIRE(s63.wait_done());
  CHECK(s63.state == INFILL_JOB_DONE);
  CHECK(s63.png == "R63");
  // The K each edit ran with, from the status's metrics (polled) and from the done event.
  CHECK(s60.adapters_from_step == 3);
  CHECK(s63.adapters_from_step == 2);
  CHECK(s63.progress == std::vector<uint32_t>{1, 2});
  for (Seen* x : {&s60, &s61, &s62, &s63}) CHECK(x->done_calls == 1);
  for (infill_job* j : jobs) infill_job_release(j);
  infill_client_destroy(c);
}

TEST_CASE("sdk protocol: a callback may submit the next edit (live editing)", "[sdk][protocol]") {
  infill::test::TempDir dir("infill-sdk-fake");
  std::atomic<uint64_t> next{70};
  FakeEngine engine(dir.file("engine.sock"), [&](const std::string& m, const std::string& t, const std::string& body) {
    if (m == "POST" && t == "/v1/edits") {
      if (next == 71 && body.find("\"supersedes\":70") == std::string::npos) return Reply{400, "{}", "application/json"};
      return accepted(next++);
    }
    if (m == "GET" && t == "/v1/edits/71/result") return Reply{200, "R71", "image/png"};
    return Reply{};
  });
  infill_client* c = client_for(dir.file("engine.sock"));
  struct Ctx {
    infill_client* client;
    Seen next;
    std::string submit_error = "not called";
    infill_job* job = nullptr;
  } ctx{c, {}, "not called", nullptr};
  infill_edit_params p;
  infill_edit_params_init(&p);
  p.template_id = "fake";
  p.mask_rect[2] = p.mask_rect[3] = 8;
  p.user_data = &ctx;
  p.on_progress = [](void* user, const infill_progress* pr) {
    auto* x = static_cast<Ctx*>(user);
    infill_edit_params q;
    infill_edit_params_init(&q);
    q.template_id = "fake";
    q.mask_rect[2] = q.mask_rect[3] = 4;
    q.supersedes = pr->edit_id;
    q.on_done = &Seen::on_done;
    q.user_data = &x->next;
    infill_error* e = infill_client_submit_edit(x->client, &q, &x->job);
    x->submit_error = e ? infill_error_message(e) : "";
    infill_error_delete(e);
  };
  infill_job* a = nullptr;
  infill_error* e = infill_client_submit_edit(c, &p, &a);
  REQUIRE(e == nullptr);
  engine.push("progress", R"({"id":70,"type":"progress","steps_done":1,"steps_total":9})");
  infill_error* running = infill_job_wait(a, 0);  // still running: a timeout error
  REQUIRE(running != nullptr);
  CHECK(infill_error_get_code(running) == INFILL_ERROR_TIMEOUT);
  infill_error_delete(running);
  engine.push("failed", R"({"id":70,"type":"failed","state":"cancelled","error":{"code":"cancelled","message":"superseded by 71"}})");
  REQUIRE(infill_job_wait(a, 10000) == nullptr);
  CHECK(infill_job_get_state(a) == INFILL_JOB_CANCELLED);
  CHECK(ctx.submit_error.empty());
  REQUIRE(ctx.job != nullptr);
  CHECK(infill_job_id(ctx.job) == 71);
  engine.push("done", R"({"id":71,"type":"done","result":"/v1/edits/71/result"})");
  REQUIRE(ctx.next.wait_done());
  CHECK(ctx.next.state == INFILL_JOB_DONE);
  CHECK(ctx.next.png == "R71");
  infill_job_release(a);
  infill_job_release(ctx.job);
  infill_client_destroy(c);
  CHECK(ctx.next.done_calls == 1);
}

TEST_CASE("sdk protocol: polling retries while a restarted engine is still loading", "[sdk][protocol]") {
  infill::test::TempDir dir("infill-sdk-fake");
  std::atomic<int> polls{0};
  FakeEngine engine(dir.file("engine.sock"), [&](const std::string& m, const std::string& t, const std::string&) {
    if (m == "POST" && t == "/v1/edits") return accepted(80);
    if (m == "GET" && t == "/v1/edits/80") {
      if (polls++ < 2)
        return Reply{503, R"({"error":{"code":"not_ready","message":"the model is loading","type":"unavailable"}})", "application/json"};
      return Reply{200, R"({"id":80,"state":"done","steps_done":2,"steps_total":2})", "application/json"};
    }
    if (m == "GET" && t == "/v1/edits/80/result") return Reply{200, "R80", "image/png"};
    return Reply{};
  });
  infill_client* c = client_for(dir.file("engine.sock"));
  Seen seen;
  infill_job* job = submit(c, seen);
  REQUIRE(engine.wait_for_stream());
  engine.drop_streams();
  REQUIRE(seen.wait_done());
  CHECK(seen.done_calls == 1);
  CHECK(seen.state == INFILL_JOB_DONE);
  CHECK(seen.png == "R80");
  CHECK(polls.load() == 3);
  CHECK(engine.streams_opened() == 4);  // the first, two given up after a 503, the last
  infill_job_release(job);
  infill_client_destroy(c);
}

TEST_CASE("sdk protocol: an edit's adapters and references as the engine reads them, none from callers older than 1.3",
          "[sdk][protocol][lora]") {
  infill::test::TempDir dir("infill-sdk-fake");
  std::mutex mu;
  std::vector<nlohmann::json> bodies;
  FakeEngine engine(dir.file("engine.sock"), [&](const std::string& m, const std::string& t, const std::string& body) {
    if (m == "POST" && t == "/v1/edits") {
      std::lock_guard lock(mu);
      bodies.push_back(nlohmann::json::parse(body, nullptr, false));
      return accepted(bodies.size());
    }
    return Reply{};
  });
  infill_client* c = client_for(dir.file("engine.sock"));
  infill_edit_params p;
  infill_edit_params_init(&p);
  p.template_id = "fake";
  p.mask_rect[2] = p.mask_rect[3] = 8;
  infill_edit_adapter adapters[2];
  infill_edit_adapter_init(&adapters[0]);
  infill_edit_adapter_init(&adapters[1]);
  adapters[0].id = "style";
  adapters[1].id = "detail";
  adapters[1].strength = -2.5;
  const char* references[] = {"ref-a", "ref-b"};
  p.adapters = adapters;
  p.adapter_count = 2;
  p.references = references;
  p.reference_count = 2;
  p.adapters_from_step = 3;
  REQUIRE(infill_client_submit_edit(c, &p, nullptr) == nullptr);

  // A caller built against API 1.4 whose elements are larger: read by their struct_size.
  struct LaterAdapter {
    infill_edit_adapter v13;
    double later_field;
  } later[2] = {};
  for (LaterAdapter& a : later) {
    infill_edit_adapter_init(&a.v13);
    a.v13.struct_size = sizeof(LaterAdapter);
    a.later_field = 99;
  }
  later[0].v13.id = "first";
  later[1].v13.id = "second";
  later[1].v13.strength = 0.25;
  p.adapters = &later[0].v13;
  p.reference_count = 0;
  p.adapters_from_step = 0;  // the default: not sent
  REQUIRE(infill_client_submit_edit(c, &p, nullptr) == nullptr);

  // A caller built against API 1.2: its struct ends before the lists and K, which are not read.
  p.struct_size = offsetof(infill_edit_params, adapters);
  p.adapter_count = 1000;  // beyond the caller's struct: never read
  p.reference_count = 1000;
  p.adapters_from_step = 5000;
  REQUIRE(infill_client_submit_edit(c, &p, nullptr) == nullptr);

  std::lock_guard lock(mu);
  REQUIRE(bodies.size() == 3);
  const nlohmann::json want_adapters = nlohmann::json::parse(R"([{"id":"style","strength":1.0},{"id":"detail","strength":-2.5}])");
  CHECK(bodies[0]["adapters"] == want_adapters);
  CHECK(bodies[0]["references"] == nlohmann::json::parse(R"(["ref-a","ref-b"])"));
  CHECK(bodies[0]["adapters_from_step"] == 3);
  CHECK(bodies[1]["adapters"] == nlohmann::json::parse(R"([{"id":"first","strength":1.0},{"id":"second","strength":0.25}])"));
  CHECK_FALSE(bodies[1].contains("references"));
  CHECK_FALSE(bodies[1].contains("adapters_from_step"));
  CHECK_FALSE(bodies[2].contains("adapters"));
  CHECK_FALSE(bodies[2].contains("references"));
  CHECK_FALSE(bodies[2].contains("adapters_from_step"));
  infill_client_destroy(c);
}

TEST_CASE("sdk protocol: adapter uploads carry the name and model, answers fill infill_adapter_info", "[sdk][protocol][lora]") {
  infill::test::TempDir dir("infill-sdk-fake");
  std::mutex mu;
  std::vector<std::string> targets;
  const std::string long_name = std::string(254, 'x') + "\xc3\xa9";  // 256 bytes: the 2-byte character is cut whole
  const std::string adapter = nlohmann::json{{"id", std::string(64, 'c')}, {"name", long_name}, {"format", "kohya"},
                                             {"rank", 16}, {"min_rank", 4}, {"layers", 140}, {"bytes", 46137344}}
                                  .dump();
  FakeEngine engine(dir.file("engine.sock"), [&](const std::string& m, const std::string& t, const std::string&) {
    std::lock_guard lock(mu);
    targets.push_back(m + " " + t);
    if (m == "POST" && t.rfind("/v1/adapters", 0) == 0) return Reply{201, adapter, "application/json"};
    if (m == "GET" && t == "/v1/adapters") return Reply{200, R"({"adapters":[)" + adapter + "]}", "application/json"};
    return Reply{404, R"({"error":{"code":"unknown_adapter","message":"adapter 'gone' is not in the store","type":"not_found"}})",
                 "application/json"};
  });
  infill_client* c = client_for(dir.file("engine.sock"));
  infill_adapter_info info;
  infill_adapter_info_init(&info);
  REQUIRE(infill_client_upload_adapter(c, "bytes", 5, "my style.safetensors", "flux-2-klein", &info) == nullptr);
  CHECK(std::string(info.id) == std::string(64, 'c'));
  CHECK(std::string(info.name) == std::string(254, 'x'));
  CHECK(std::string(info.format) == "kohya");
  CHECK(info.max_rank == 16);
  CHECK(info.min_rank == 4);
  CHECK(info.layers == 140);
  CHECK(info.bytes == 46137344);
  CHECK(info.created == 1);
  infill_adapter_list* list = nullptr;
  REQUIRE(infill_client_list_adapters(c, &list) == nullptr);
  REQUIRE(infill_adapter_list_count(list) == 1);
  CHECK(infill_adapter_list_get(list, 0)->struct_size == sizeof(infill_adapter_info));
  CHECK(infill_adapter_list_get(list, 0)->created == 0);
  CHECK(infill_adapter_list_get(list, 1) == nullptr);
  infill_adapter_list_delete(list);
  infill_error* e = infill_client_delete_adapter(c, "gone");
  REQUIRE(e != nullptr);
  CHECK(infill_error_get_code(e) == INFILL_ERROR_NOT_FOUND);
  CHECK(std::string(infill_error_engine_code(e)) == "unknown_adapter");
  CHECK(std::string(infill_error_message(e)).find("adapter 'gone' is not in the store") != std::string::npos);
  infill_error_delete(e);
  std::lock_guard lock(mu);
  CHECK(targets == std::vector<std::string>{"POST /v1/adapters?name=my%20style.safetensors&model=flux-2-klein",
                                            "GET /v1/adapters", "DELETE /v1/adapters/gone"});
  infill_client_destroy(c);
}
