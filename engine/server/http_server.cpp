#include "server/http_server.h"

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility> (g++ 12).
#include <algorithm>
#include <utility>

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <filesystem>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>

#include "server/api_routes.h"
#include "server/multipart.h"
#include "server/openapi.h"

namespace infill {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::awaitable;
using asio::use_awaitable;
using nlohmann::json;
using Request = http::request<http::string_body>;
using Clock = std::chrono::steady_clock;

std::chrono::milliseconds ms(double v) { return std::chrono::milliseconds(static_cast<int64_t>(v)); }

std::string sv(beast::string_view s) { return std::string(s.data(), s.size()); }

std::string percent_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i] == '+' ? ' ' : s[i]);
    }
  }
  return out;
}

std::map<std::string, std::string> parse_query(std::string_view q) {
  std::map<std::string, std::string> out;
  while (!q.empty()) {
    const size_t amp = q.find('&');
    const std::string_view item = q.substr(0, amp);
    const size_t eq = item.find('=');
    out[percent_decode(item.substr(0, eq))] = eq == std::string_view::npos ? "" : percent_decode(item.substr(eq + 1));
    if (amp == std::string_view::npos) break;
    q.remove_prefix(amp + 1);
  }
  return out;
}

bool valid_client_id(const std::string& c) {
  if (c.empty() || c.size() > 64) return false;
  for (char ch : c)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.') return false;
  return true;
}

// The engine's pool answers on its own threads; replies are posted back to the io thread
// through the gate, which is closed before the io_context goes away.
struct Gate {
  std::mutex mu;
  asio::io_context* ioc = nullptr;
  template <class F>
  bool post(F&& f) {
    std::lock_guard lock(mu);
    if (ioc == nullptr) return false;
    asio::post(*ioc, std::forward<F>(f));
    return true;
  }
};

struct Subscriber {
  Subscriber(asio::any_io_executor ex, std::string c, bool ws) : timer(ex), client(std::move(c)), websocket(ws) {}
  asio::steady_timer timer;
  std::string client;  // "*" = every client's events
  bool websocket = false;  // queue holds JSON messages, not SSE text
  std::deque<std::string> queue;
  bool closed = false;
};

// A subscriber on the server's list for as long as its connection serves events.
class Subscription {
 public:
  Subscription(std::list<std::shared_ptr<Subscriber>>& list, std::shared_ptr<Subscriber> sub)
      : list_(list), sub_(std::move(sub)) {
    list_.push_back(sub_);
  }
  ~Subscription() { list_.remove(sub_); }
  Subscription(const Subscription&) = delete;
  Subscription& operator=(const Subscription&) = delete;
  const std::shared_ptr<Subscriber>& get() const { return sub_; }

 private:
  std::list<std::shared_ptr<Subscriber>>& list_;
  std::shared_ptr<Subscriber> sub_;
};

// The reader half of a WebSocket subscription: Beast answers pings and the close handshake
// only while a read is pending; whatever the client sends is ignored. Its end (the client
// closed or vanished) ends the subscription. A plain function, not a lambda: the coroutine
// frame must own its arguments.
struct WsReader {
  bool running = true;
  std::shared_ptr<asio::steady_timer> finished;  // cancelled when the reader returns
};

template <class WsStream>
awaitable<void> read_until_closed(WsStream& ws, std::shared_ptr<Subscriber> sub, std::shared_ptr<WsReader> state) {
  beast::flat_buffer buffer;
  beast::error_code ec;
  for (;;) {
    buffer.clear();
    co_await ws.async_read(buffer, asio::redirect_error(use_awaitable, ec));
    if (ec) break;
  }
  state->running = false;
  sub->closed = true;
  sub->timer.cancel();
  state->finished->cancel();
}

// Events a subscriber may fall behind by before it is dropped (it reconnects and polls).
constexpr size_t kMaxQueuedEvents = 4096;

}  // namespace

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  EngineService* service = nullptr;
  HttpServerOptions options;
  asio::io_context ioc{1};
  std::optional<asio::ip::tcp::acceptor> tcp;
  std::optional<asio::local::stream_protocol::acceptor> local;
  bool owns_socket_file = true;  // false when the service manager made the socket (activation)
  uint16_t bound_port = 0;
  std::thread thread;
  std::shared_ptr<Gate> gate = std::make_shared<Gate>();
  std::atomic<int> pending_calls{0};
  std::atomic<int> open_connections{0};
  std::atomic<uint64_t> accepted_connections{0};
  std::atomic<bool> stopped{false};

  // Owned by the io thread.
  std::list<std::shared_ptr<Subscriber>> subscribers;
  std::list<std::function<void()>> closers;  // close each open connection's socket
  bool closing = false;

  void publish(const ServiceEvent& e) {
    std::string text = "event: " + e.type + "\ndata: " + e.json + "\n\n";
    for (auto& s : subscribers) {
      if (s->closed || (s->client != "*" && s->client != e.client)) continue;
      if (s->queue.size() >= kMaxQueuedEvents) {
        s->closed = true;
      } else {
        s->queue.push_back(s->websocket ? e.json : text);  // the JSON carries "type" too
      }
      s->timer.cancel();
    }
  }

  void close_listeners() {
    beast::error_code ec;
    if (tcp) tcp->close(ec);
    if (local && local->is_open()) {
      local->close(ec);
      if (owns_socket_file) ::unlink(options.socket_path.c_str());
    }
  }

  // Awaits an EngineService call that answers through a callback on its pool.
  // Not a coroutine itself: g++ 12 destroys lambda temporaries passed to a coroutine inside
  // a co_await expression twice, so callers also bind the lambda to a named local first.
  template <class Start>
  awaitable<ApiReply> call(Start start) {
    auto g = gate;
    auto* counter = &pending_calls;
    return asio::async_initiate<decltype(use_awaitable), void(ApiReply)>(
        [start = std::move(start), g, counter](auto handler) mutable {
          auto h = std::make_shared<decltype(handler)>(std::move(handler));
          counter->fetch_add(1);
          start([h, g, counter](ApiReply r) {
            auto resume = [h, r = std::move(r)]() mutable { (*h)(std::move(r)); };
            if (!g->post(std::move(resume))) {
              // The io_context is gone: destroying the handler would destroy a coroutine
              // frame whose sockets belong to it, so the frame is deliberately leaked.
              new std::shared_ptr<decltype(handler)>(h);
            }
            counter->fetch_sub(1);
          });
        },
        use_awaitable);
  }

  ApiReply check_access(const Request& req, bool is_tcp, bool is_health) const {
    if (auto origin = req.find(http::field::origin); origin != req.end()) {
      const std::string o = sv(origin->value());
      if (std::find(options.allowed_origins.begin(), options.allowed_origins.end(), o) == options.allowed_origins.end())
        return error_reply(403, "origin_not_allowed",
                           "requests from browser origin " + o + " are not allowed (add it to allowed_origins in engine.json)");
    }
    if (is_tcp && !is_health) {
      auto auth = req.find(http::field::authorization);
      const std::string value = auth == req.end() ? "" : sv(auth->value());
      const std::string prefix = "Bearer ";
      if (value.rfind(prefix, 0) != 0 || !constant_time_equal(value.substr(prefix.size()), options.token))
        return error_reply(401, "unauthorized",
                           auth == req.end() ? "this TCP endpoint needs an Authorization: Bearer <token> header (the token file of the engine)"
                                             : "the bearer token in the Authorization header is not this engine's token");
    }
    return ApiReply{0, "", "", 0};
  }

  awaitable<ApiReply> dispatch(Request& req, const std::string& path, const std::map<std::string, std::string>& query,
                               const std::string& client);

  template <class Stream>
  awaitable<void> serve_events(Stream& stream, const Request& req, const std::string& client);
  template <class Stream>
  awaitable<void> serve_events_websocket(Stream& stream, const Request& req, const std::string& client);
  template <class Stream>
  awaitable<void> session(Stream stream, bool is_tcp);
  template <class Acceptor, class StreamFactory>
  awaitable<void> accept_loop(Acceptor& acceptor, bool is_tcp, StreamFactory make_stream);
};

namespace {

template <class Stream>
awaitable<bool> write_reply(Stream& stream, const ApiReply& reply, unsigned version, bool keep_alive, double timeout_ms,
                            const std::vector<std::pair<http::field, std::string>>* extra) {
  http::response<http::string_body> res{static_cast<http::status>(reply.status), version};
  res.set(http::field::server, "infill-engine");
  res.set(http::field::content_type, reply.content_type);
  res.set(http::field::cache_control, "no-store");
  if (reply.retry_after_s > 0) res.set(http::field::retry_after, std::to_string(reply.retry_after_s));
  if (reply.status == 401) res.set(http::field::www_authenticate, "Bearer");
  if (extra)
    for (const auto& [f, v] : *extra) res.set(f, v);
  res.body() = reply.body;
  res.keep_alive(keep_alive);
  res.prepare_payload();
  beast::error_code ec;
  stream.expires_after(ms(timeout_ms));
  co_await http::async_write(stream, res, asio::redirect_error(use_awaitable, ec));
  co_return !ec;
}

// Edit parameters of a multipart body: a "params" JSON part, a "mask" file part, and plain
// fields (JSON values, except the always-textual ones).
Result<EditSubmission> multipart_submission(const std::vector<FormPart>& parts) {
  EditSubmission s;
  s.params = json::object();
  for (const FormPart& p : parts) {
    if (p.name == "mask") {
      s.mask_bytes = p.data;
    } else if (p.name == "params") {
      json j = json::parse(p.data, nullptr, false);
      if (j.is_discarded() || !j.is_object()) return invalid_argument("multipart part 'params' is not a JSON object");
      for (auto& [k, v] : j.items()) s.params[k] = v;
    } else if (p.name == "template" || p.name == "prompt" || p.name == "class" || p.name == "sampler" ||
               p.name == "mask_png_base64") {
      s.params[p.name] = p.data;
    } else {
      json v = json::parse(p.data, nullptr, false);
      s.params[p.name] = v.is_discarded() ? json(p.data) : v;
    }
  }
  return s;
}

// An upload: the raw body, or the `part` file part of a multipart form (else its first file
// part), with the part's file name ("" when none).
struct Upload {
  std::string bytes;
  std::string filename;
};

Result<Upload> uploaded_file(Request& req, const std::string& part, const std::string& what) {
  auto ct = req.find(http::field::content_type);
  if (ct == req.end() || sv(ct->value()).rfind("multipart/", 0) != 0) return Upload{std::move(req.body()), ""};
  INFILL_ASSIGN_OR_RETURN(std::string boundary, multipart_boundary(sv(ct->value())));
  INFILL_ASSIGN_OR_RETURN(std::vector<FormPart> parts, parse_multipart(req.body(), boundary));
  const FormPart* file = nullptr;
  for (const auto& p : parts)
    if (p.name == part || (!file && !p.filename.empty())) file = &p;
  if (!file) return invalid_argument("multipart " + what + " upload has no '" + part + "' file part");
  return Upload{file->data, file->filename};
}

bool is_json(const Request& req) {
  auto ct = req.find(http::field::content_type);
  if (ct == req.end()) return true;  // curl -d without -H sends form-urlencoded; no header: assume JSON
  const std::string v = sv(ct->value());
  return v.rfind("application/json", 0) == 0;
}

}  // namespace

awaitable<ApiReply> HttpServer::Impl::dispatch(Request& req, const std::string& path,
                                               const std::map<std::string, std::string>& query, const std::string& client) {
  const auto method = req.method();
  // Routes and their methods come from the route table (api_routes.h), which also makes
  // GET /v1/openapi.json; the branches below only dispatch.
  const std::string_view route = api_route_of(path);
  if (route.empty())
    co_return error_reply(404, "no_such_route", "no route " + path + " (see docs/api.md or GET /v1/openapi.json: " + api_route_list() + ")");
  const std::string method_name(req.method_string().data(), req.method_string().size());
  bool listed = false;
  for (const ApiOperation& op : kApiOperations) listed = listed || (op.path == route && op.method == method_name);
  if (!listed)
    co_return error_reply(405, "method_not_allowed",
                          method_name + " is not allowed on " + path + " (allowed: " + api_methods_of(route) + ")");
  if (path == "/health") {
    co_return service->health();
  }
  if (path == "/v1/models") {
    co_return service->models();
  }
  if (path == "/v1/metrics") {
    co_return service->metrics();
  }
  if (path == "/metrics") {  // where Prometheus scrapes by default
    co_return service->prometheus_metrics();
  }
  if (path == "/v1/openapi.json") {
    co_return json_reply(200, openapi_document());
  }
  if (path == "/v1/templates") {
    auto upload = uploaded_file(req, "image", "template");
    if (!upload.ok()) co_return error_reply(400, "invalid_multipart", upload.status().message());
    std::string name = query.count("name") ? query.at("name") : upload->filename.empty() ? "upload" : upload->filename;
    auto start = [this, bytes = std::move(upload->bytes), name](std::function<void(ApiReply)> done) mutable {
      service->create_template(std::move(bytes), name, std::move(done));
    };
    ApiReply reply = co_await call(std::move(start));
    co_return reply;
  }
  if (path.rfind("/v1/templates/", 0) == 0) {
    co_return service->template_status(path.substr(std::strlen("/v1/templates/")));
  }
  if (path == "/v1/adapters") {
    if (method == http::verb::get) co_return service->adapters();
    auto upload = uploaded_file(req, "file", "adapter");
    if (!upload.ok()) co_return error_reply(400, "invalid_multipart", upload.status().message());
    std::string name = query.count("name") ? query.at("name") : upload->filename;
    std::string model = query.count("model") ? query.at("model") : "";
    auto start = [this, bytes = std::move(upload->bytes), name, model](std::function<void(ApiReply)> done) mutable {
      service->create_adapter(std::move(bytes), name, model, std::move(done));
    };
    ApiReply reply = co_await call(std::move(start));
    co_return reply;
  }
  if (path.rfind("/v1/adapters/", 0) == 0) {
    const std::string id = path.substr(std::strlen("/v1/adapters/"));
    if (method == http::verb::get) co_return service->adapter_status(id);
    co_return service->delete_adapter(id);  // DELETE: the route table allows nothing else here
  }
  if (path == "/v1/edits") {
    EditSubmission sub;
    auto ct = req.find(http::field::content_type);
    if (ct != req.end() && sv(ct->value()).rfind("multipart/", 0) == 0) {
      auto boundary = multipart_boundary(sv(ct->value()));
      if (!boundary.ok()) co_return error_reply(400, "invalid_multipart", boundary.status().message());
      auto parts = parse_multipart(req.body(), *boundary);
      if (!parts.ok()) co_return error_reply(400, "invalid_multipart", parts.status().message());
      auto s = multipart_submission(*parts);
      if (!s.ok()) co_return error_reply(400, "invalid_multipart", s.status().message());
      sub = std::move(*s);
    } else if (is_json(req)) {
      std::string json_error;
      try {
        sub.params = json::parse(req.body());
      } catch (const json::exception& e) {  // parse errors and number overflow: a 400, not a 500
        json_error = e.what();
      }
      if (!json_error.empty()) co_return error_reply(400, "invalid_json", "request body is not valid JSON: " + json_error);
    } else {
      co_return error_reply(415, "unsupported_media_type",
                            "POST /v1/edits takes application/json or multipart/form-data, not " + sv(ct->value()));
    }
    sub.client = client;
    auto start = [this, sub = std::move(sub)](std::function<void(ApiReply)> done) mutable {
      service->submit_edit(std::move(sub), std::move(done));
    };
    ApiReply reply = co_await call(std::move(start));
    co_return reply;
  }
  if (path.rfind("/v1/edits/", 0) == 0) {
    std::string rest = path.substr(std::strlen("/v1/edits/"));
    bool result = false;
    if (rest.size() > 7 && rest.compare(rest.size() - 7, 7, "/result") == 0) {
      rest.resize(rest.size() - 7);
      result = true;
    }
    if (method == http::verb::get) {
      auto accept = req.find(http::field::accept);
      // An Accept naming an image type asks for the result file, whatever format it is in.
      const bool want_result = result || (accept != req.end() && sv(accept->value()).find("image/") != std::string::npos);
      co_return service->edit_status(rest, want_result);
    }
    co_return service->cancel_edit(rest);  // DELETE: the route table allows nothing else here
  }
  co_return error_reply(500, "route_not_dispatched", "route " + std::string(route) + " is in the route table but not dispatched");
}

template <class Stream>
awaitable<void> HttpServer::Impl::serve_events(Stream& stream, const Request& req, const std::string& client) {
  auto ex = co_await asio::this_coro::executor;
  const Subscription subscription(subscribers, std::make_shared<Subscriber>(ex, client, false));
  const std::shared_ptr<Subscriber>& sub = subscription.get();

  http::response<http::empty_body> res{http::status::ok, req.version()};
  res.set(http::field::server, "infill-engine");
  res.set(http::field::content_type, "text/event-stream");
  res.set(http::field::cache_control, "no-store");
  // Delimited by closing the connection: no length, no chunking.
  res.keep_alive(false);
  http::response_serializer<http::empty_body> sr{res};
  beast::error_code ec;
  stream.expires_after(ms(options.limits.body_timeout_ms));
  co_await http::async_write_header(stream, sr, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return;
  std::string chunk = "retry: 1000\n: connected as client " + client + "\n\n";
  for (;;) {
    if (!chunk.empty()) {
      stream.expires_after(ms(options.limits.body_timeout_ms));
      co_await asio::async_write(stream, asio::buffer(chunk), asio::redirect_error(use_awaitable, ec));
      if (ec) co_return;
      chunk.clear();
    }
    if (sub->closed || closing) co_return;
    if (sub->queue.empty()) {
      sub->timer.expires_after(ms(options.limits.event_heartbeat_ms));
      co_await sub->timer.async_wait(asio::redirect_error(use_awaitable, ec));
      if (!ec) chunk = ": keep-alive\n\n";  // expired without events: let proxies and clients see life
      continue;
    }
    while (!sub->queue.empty()) {
      chunk += sub->queue.front();
      sub->queue.pop_front();
    }
  }
}

template <class Stream>
awaitable<void> HttpServer::Impl::serve_events_websocket(Stream& stream, const Request& req, const std::string& client) {
  namespace websocket = beast::websocket;
  auto ex = co_await asio::this_coro::executor;
  const Subscription subscription(subscribers, std::make_shared<Subscriber>(ex, client, true));
  const std::shared_ptr<Subscriber>& sub = subscription.get();

  // The WebSocket layer keeps its own deadlines: pings when idle, and a peer that answers
  // nothing for two heartbeats is dropped.
  stream.expires_never();
  websocket::stream<Stream&> ws(stream);
  websocket::stream_base::timeout timeouts;
  timeouts.handshake_timeout = ms(options.limits.body_timeout_ms);
  timeouts.idle_timeout = ms(2 * options.limits.event_heartbeat_ms);
  timeouts.keep_alive_pings = true;
  ws.set_option(timeouts);
  ws.set_option(websocket::stream_base::decorator(
      [](websocket::response_type& res) { res.set(http::field::server, "infill-engine"); }));
  ws.read_message_max(64 << 10);  // clients have nothing to say; a flood is cut off
  beast::error_code ec;
  co_await ws.async_accept(req, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return;
  ws.text(true);

  auto reader = std::make_shared<WsReader>();
  reader->finished = std::make_shared<asio::steady_timer>(ex, Clock::time_point::max());
  asio::co_spawn(ex, read_until_closed(ws, sub, reader), asio::detached);

  std::string message = json{{"type", "connected"}, {"client", client}}.dump();
  for (;;) {
    if (!message.empty()) {
      co_await ws.async_write(asio::buffer(message), asio::redirect_error(use_awaitable, ec));
      if (ec) break;
      message.clear();
    }
    if (sub->closed || closing) break;
    if (sub->queue.empty()) {
      sub->timer.expires_after(ms(options.limits.event_heartbeat_ms));
      co_await sub->timer.async_wait(asio::redirect_error(use_awaitable, ec));
      continue;
    }
    message = std::move(sub->queue.front());
    sub->queue.pop_front();
  }
  // Say goodbye when we are the ones leaving, then let the reader finish: it uses `ws`.
  if (reader->running && ws.is_open()) {
    const auto code = closing ? websocket::close_code::going_away : websocket::close_code::policy_error;
    co_await ws.async_close(code, asio::redirect_error(use_awaitable, ec));
  }
  if (reader->running) {
    beast::get_lowest_layer(stream).expires_after(ms(options.limits.body_timeout_ms));
    co_await reader->finished->async_wait(asio::redirect_error(use_awaitable, ec));
    while (reader->running) {  // the close handshake timed out: cut the connection
      beast::get_lowest_layer(stream).cancel();
      asio::steady_timer t(ex, std::chrono::milliseconds(10));
      co_await t.async_wait(asio::redirect_error(use_awaitable, ec));
    }
  }
}

template <class Stream>
awaitable<void> HttpServer::Impl::session(Stream stream, bool is_tcp) {
  open_connections.fetch_add(1);
  accepted_connections.fetch_add(1);
  auto self = shared_from_this();
  closers.push_front([&stream] {
    beast::error_code ec;
    stream.socket().shutdown(Stream::protocol_type::socket::shutdown_both, ec);
    stream.socket().close(ec);
  });
  const auto closer = closers.begin();
  struct Done {
    Impl* s;
    std::list<std::function<void()>>::iterator it;
    ~Done() {
      s->closers.erase(it);
      s->open_connections.fetch_sub(1);
    }
  } done{this, closer};

  if (open_connections.load() > options.limits.max_connections) {
    const ApiReply busy = error_reply(503, "too_many_connections", "the engine has too many open connections");
    co_await write_reply(stream, busy, 11, false, options.limits.body_timeout_ms, nullptr);
    co_return;
  }
  beast::flat_buffer buffer;
  // Error replies are built first and written by one co_await outside any expression that
  // holds temporaries (see call()).
  std::optional<ApiReply> fail;
  for (;;) {
    if (closing) co_return;
    http::request_parser<http::string_body> parser;
    parser.header_limit(options.limits.max_header_bytes);
    parser.body_limit(options.limits.max_body_bytes);
    beast::error_code ec;
    // The header deadline covers both an idle keep-alive connection and a slow sender.
    stream.expires_after(ms(options.limits.header_timeout_ms));
    co_await http::async_read_header(stream, buffer, parser, asio::redirect_error(use_awaitable, ec));
    if (ec) {
      if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == asio::error::operation_aborted ||
          ec == asio::error::connection_reset || ec == asio::error::eof || ec == asio::error::bad_descriptor)
        co_return;
      if (ec == http::error::header_limit) {
        fail = error_reply(431, "headers_too_large",
                           "request headers are larger than " + std::to_string(options.limits.max_header_bytes) + " bytes");
      } else if (ec == http::error::body_limit) {
        fail = error_reply(413, "body_too_large",
                           "request body is larger than " + std::to_string(options.limits.max_body_bytes) + " bytes");
      } else {
        fail = error_reply(400, "malformed_request", "malformed HTTP request: " + ec.message());
      }
      break;
    }
    Request& head = parser.get();
    const std::string target = sv(head.target());
    const size_t qmark = target.find('?');
    const std::string path = target.substr(0, qmark);
    const auto query = parse_query(qmark == std::string::npos ? std::string_view() : std::string_view(target).substr(qmark + 1));
    const bool is_health = path == "/health";
    // Refuse before reading the body: an unauthenticated client must not make us buffer it.
    ApiReply denied = check_access(head, is_tcp, is_health);
    if (denied.status != 0) {
      fail = std::move(denied);
      break;
    }
    std::string client = "default";
    if (auto c = head.find("X-Infill-Client"); c != head.end()) client = sv(c->value());
    if (query.count("client")) client = query.at("client");
    if (!valid_client_id(client)) {
      fail = error_reply(400, "invalid_client",
                         "client id '" + client.substr(0, 80) + "' must be 1-64 characters of A-Z a-z 0-9 . _ -");
      break;
    }
    // A LoRA upload may be larger than any other body.
    const uint64_t body_limit =
        path == "/v1/adapters" ? std::max(options.limits.max_adapter_bytes, options.limits.max_body_bytes) : options.limits.max_body_bytes;
    parser.body_limit(body_limit);
    if (head[http::field::expect] == "100-continue" && !parser.is_done()) {
      http::response<http::empty_body> cont{http::status::continue_, head.version()};
      stream.expires_after(ms(options.limits.body_timeout_ms));
      co_await http::async_write(stream, cont, asio::redirect_error(use_awaitable, ec));
      if (ec) co_return;
    }
    if (!parser.is_done()) {
      stream.expires_after(ms(options.limits.body_timeout_ms));
      co_await http::async_read(stream, buffer, parser, asio::redirect_error(use_awaitable, ec));
      if (ec == http::error::body_limit) {
        fail = error_reply(413, "body_too_large", "request body is larger than " + std::to_string(body_limit) + " bytes");
        break;
      }
      if (ec) {
        if (ec == beast::error::timeout || ec == http::error::end_of_stream || ec == http::error::partial_message ||
            ec == asio::error::eof || ec == asio::error::connection_reset)
          co_return;
        fail = error_reply(400, "malformed_request", "malformed HTTP request body: " + ec.message());
        break;
      }
    }
    Request req = parser.release();
    if (path == "/v1/events") {
      if (req.method() != http::verb::get) {
        fail = error_reply(405, "method_not_allowed",
                           std::string(req.method_string()) + " is not allowed on /v1/events (allowed: " +
                               api_methods_of("/v1/events") + ")");
        break;
      }
      const std::string who = query.count("all") ? std::string("*") : client;
      if (beast::websocket::is_upgrade(req)) {
        co_await serve_events_websocket(stream, req, who);
      } else {
        co_await serve_events(stream, req, who);
      }
      co_return;
    }
    ApiReply reply;
    try {
      reply = co_await dispatch(req, path, query, client);
    } catch (const std::exception& e) {
      reply = error_reply(500, "internal", std::string("request failed: ") + e.what());
    }
    std::vector<std::pair<http::field, std::string>> extra;
    if (reply.status == 405) extra.emplace_back(http::field::allow, "GET, POST, DELETE");
    const bool keep = req.keep_alive() && !closing;
    if (req.method() == http::verb::head) reply.body.clear();
    const bool written = co_await write_reply(stream, reply, req.version(), keep, options.limits.body_timeout_ms, &extra);
    if (!written || !keep) co_return;
  }
  // A request that could not be read or was refused: answer and close (its body may be unread).
  if (fail) co_await write_reply(stream, *fail, 11, false, options.limits.body_timeout_ms, nullptr);
}

template <class Acceptor, class StreamFactory>
awaitable<void> HttpServer::Impl::accept_loop(Acceptor& acceptor, bool is_tcp, StreamFactory make_stream) {
  for (;;) {
    beast::error_code ec;
    auto socket = co_await acceptor.async_accept(asio::redirect_error(use_awaitable, ec));
    if (ec) {
      if (!acceptor.is_open() || closing) co_return;
      // EMFILE and friends: back off briefly instead of spinning.
      asio::steady_timer t(co_await asio::this_coro::executor, std::chrono::milliseconds(50));
      co_await t.async_wait(asio::redirect_error(use_awaitable, ec));
      continue;
    }
    asio::co_spawn(ioc, session(make_stream(std::move(socket)), is_tcp), [](std::exception_ptr e) {
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        std::fprintf(stderr, "infill-engine: connection ended by exception: %s\n", ex.what());
      } catch (...) {
      }
    });
  }
}

Result<std::unique_ptr<HttpServer>> HttpServer::start(EngineService& service, HttpServerOptions options) {
  const bool wants_unix = !options.socket_path.empty() || options.activated_unix_fd >= 0;
  const bool wants_tcp = !options.tcp_host.empty() || options.activated_tcp_fd >= 0;
  if (!wants_unix && !wants_tcp) return invalid_argument("the server needs a Unix socket path or a TCP address");
  if (wants_tcp && options.token.empty()) return invalid_argument("a TCP listener needs a bearer token");
  auto impl = std::make_shared<Impl>();
  impl->service = &service;
  impl->options = std::move(options);
  Impl& s = *impl;
  beast::error_code ec;
  if (s.options.activated_unix_fd >= 0) {
    s.local.emplace(s.ioc);
    s.local->assign(asio::local::stream_protocol(), s.options.activated_unix_fd, ec);
    if (ec) return io_error("cannot serve on the socket-activated Unix socket: " + ec.message());
    s.owns_socket_file = false;
  } else if (!s.options.socket_path.empty()) {
    const std::filesystem::path p(s.options.socket_path);
    if (p.has_parent_path()) INFILL_RETURN_IF_ERROR(make_private_dir(p.parent_path().string()));
    struct stat st {};
    if (::lstat(s.options.socket_path.c_str(), &st) == 0) {
      if (!S_ISSOCK(st.st_mode)) return invalid_argument("socket path " + s.options.socket_path + " exists and is not a socket");
      asio::local::stream_protocol::socket probe(s.ioc);
      probe.connect(asio::local::stream_protocol::endpoint(s.options.socket_path), ec);
      if (!ec) return invalid_argument("another engine is already listening on " + s.options.socket_path);
      ::unlink(s.options.socket_path.c_str());  // stale, from an engine that died
    }
    s.local.emplace(s.ioc);
    asio::local::stream_protocol::endpoint ep(s.options.socket_path);
    s.local->open(ep.protocol(), ec);
    if (!ec) s.local->bind(ep, ec);
    if (!ec) ::chmod(s.options.socket_path.c_str(), 0600);
    if (!ec) s.local->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return io_error("cannot listen on " + s.options.socket_path + ": " + ec.message());
  }
  if (s.options.activated_tcp_fd >= 0) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    if (::getsockname(s.options.activated_tcp_fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      return io_error("cannot read the address of the socket-activated TCP socket");
    s.tcp.emplace(s.ioc);
    s.tcp->assign(addr.ss_family == AF_INET6 ? asio::ip::tcp::v6() : asio::ip::tcp::v4(), s.options.activated_tcp_fd, ec);
    if (ec) return io_error("cannot serve on the socket-activated TCP socket: " + ec.message());
    s.bound_port = s.tcp->local_endpoint().port();
  } else if (!s.options.tcp_host.empty()) {
    auto addr = asio::ip::make_address(s.options.tcp_host, ec);
    if (ec) return invalid_argument("TCP host " + s.options.tcp_host + " is not an IP address");
    asio::ip::tcp::endpoint ep(addr, s.options.tcp_port);
    s.tcp.emplace(s.ioc);
    s.tcp->open(ep.protocol(), ec);
    if (!ec) s.tcp->set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) s.tcp->bind(ep, ec);
    if (!ec) s.tcp->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return io_error("cannot listen on " + s.options.tcp_host + ":" + std::to_string(s.options.tcp_port) + ": " + ec.message());
    s.bound_port = s.tcp->local_endpoint().port();
  }
  s.gate->ioc = &s.ioc;
  std::weak_ptr<Impl> weak = impl;
  auto gate = s.gate;
  service.set_event_sink([gate, weak](const ServiceEvent& e) {
    gate->post([weak, e]() {
      if (auto sp = weak.lock()) sp->publish(e);
    });
  });
  auto log_exception = [](std::exception_ptr e) {
    if (e) std::fprintf(stderr, "infill-engine: accept loop ended by an exception\n");
  };
  if (s.local)
    asio::co_spawn(s.ioc, s.accept_loop(*s.local, false, [](auto sock) {
      return beast::basic_stream<asio::local::stream_protocol>(std::move(sock));
    }), log_exception);
  if (s.tcp)
    asio::co_spawn(s.ioc, s.accept_loop(*s.tcp, true, [](auto sock) { return beast::tcp_stream(std::move(sock)); }),
                   log_exception);
  s.thread = std::thread([&s] {
    // Handlers report errors as values; anything escaping run() is a bug, logged not fatal.
    for (;;) {
      try {
        s.ioc.run();
        return;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "infill-engine: io loop exception: %s\n", e.what());
      }
    }
  });
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->impl_ = std::move(impl);
  return server;
}

HttpServer::~HttpServer() { stop(); }

uint16_t HttpServer::tcp_port() const { return impl_->bound_port; }
const std::string& HttpServer::socket_path() const { return impl_->options.socket_path; }
int HttpServer::connections() const { return impl_->open_connections.load(); }
uint64_t HttpServer::accepted_connections() const { return impl_->accepted_connections.load(); }

void HttpServer::stop_accepting() {
  auto s = impl_;
  std::promise<void> done;
  auto fut = done.get_future();
  if (!s->gate->post([s, &done] {
        s->close_listeners();
        done.set_value();
      }))
    return;
  fut.wait();
}

void HttpServer::stop() {
  auto s = impl_;
  if (!s || s->stopped.exchange(true)) return;
  s->service->set_event_sink({});
  s->gate->post([s] {
    s->closing = true;
    s->close_listeners();
    for (auto& close : s->closers) close();
    for (auto& sub : s->subscribers) {
      sub->closed = true;
      sub->timer.cancel();
    }
  });
  // Let pool calls in flight come back (image decoding is short) so their coroutines end.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while ((s->pending_calls.load() > 0 || s->open_connections.load() > 0) && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  {
    std::lock_guard lock(s->gate->mu);
    s->gate->ioc = nullptr;
  }
  s->ioc.stop();
  if (s->thread.joinable()) s->thread.join();
}

}  // namespace infill
