#include "http.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <exception>
#include <mutex>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "version.h"

namespace infill::sdk {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::awaitable;
using asio::use_awaitable;
using UnixStream = beast::basic_stream<asio::local::stream_protocol>;
using TcpStream = beast::tcp_stream;

// Results are PNGs of up to 4096x4096 at 16 bits per channel.
constexpr uint64_t kMaxResponseBytes = uint64_t{1} << 30;

std::chrono::milliseconds ms(uint32_t v) { return std::chrono::milliseconds(v); }

std::string hint(const HttpConfig& c) {
  return c.endpoint.is_unix() ? " (is infill-engine running? it listens on " + c.endpoint.text + ")"
                              : " (is infill-engine running with --listen " + c.endpoint.host + ":" +
                                    std::to_string(c.endpoint.port) + "?)";
}

Error transport_error(const HttpConfig& c, const beast::error_code& ec, const std::string& what, uint32_t timeout_ms) {
  if (ec == beast::error::timeout)
    return make_error(INFILL_ERROR_TIMEOUT, what + ": the engine at " + c.endpoint.text + " did not answer within " +
                                                std::to_string(timeout_ms) + " ms");
  return make_error(INFILL_ERROR_CONNECTION, what + ": " + ec.message() + " (engine at " + c.endpoint.text + ")");
}

awaitable<Status> connect(UnixStream& s, const HttpConfig& c) {
  beast::error_code ec;
  s.expires_after(ms(c.connect_timeout_ms));
  co_await s.async_connect(asio::local::stream_protocol::endpoint(c.endpoint.unix_path),
                           asio::redirect_error(use_awaitable, ec));
  if (ec == beast::error::timeout)
    co_return make_error(INFILL_ERROR_TIMEOUT, "connecting to " + c.endpoint.text + " timed out after " +
                                                   std::to_string(c.connect_timeout_ms) + " ms");
  if (ec) co_return make_error(INFILL_ERROR_CONNECTION, "cannot connect to the engine at " + c.endpoint.text + ": " + ec.message() + hint(c));
  co_return Status();
}

awaitable<Status> connect(TcpStream& s, const HttpConfig& c) {
  beast::error_code ec;
  asio::ip::tcp::resolver resolver(co_await asio::this_coro::executor);
  auto results = co_await resolver.async_resolve(c.endpoint.host, std::to_string(c.endpoint.port),
                                                 asio::redirect_error(use_awaitable, ec));
  if (ec) co_return make_error(INFILL_ERROR_CONNECTION, "cannot resolve the engine host '" + c.endpoint.host + "': " + ec.message());
  s.expires_after(ms(c.connect_timeout_ms));
  co_await s.async_connect(results, asio::redirect_error(use_awaitable, ec));
  if (ec == beast::error::timeout)
    co_return make_error(INFILL_ERROR_TIMEOUT, "connecting to " + c.endpoint.text + " timed out after " +
                                                   std::to_string(c.connect_timeout_ms) + " ms");
  if (ec) co_return make_error(INFILL_ERROR_CONNECTION, "cannot connect to the engine at " + c.endpoint.text + ": " + ec.message() + hint(c));
  s.socket().set_option(asio::ip::tcp::no_delay(true), ec);
  co_return Status();
}

http::request<http::string_body> make_request(const HttpConfig& c, http::verb verb, const std::string& target) {
  http::request<http::string_body> req{verb, target, 11};
  req.set(http::field::host, c.endpoint.is_unix() ? std::string("localhost") : c.endpoint.host + ":" + std::to_string(c.endpoint.port));
  req.set(http::field::user_agent, std::string("libinfill_client/") + kLibraryVersion);
  req.set("X-Infill-Client", c.client_name);
  if (!c.endpoint.is_unix() && !c.token.empty()) req.set(http::field::authorization, "Bearer " + c.token);
  return req;
}

// The answer of one exchange, and whether the engine keeps the connection open after it.
struct Exchanged {
  Result<HttpResponse> response = HttpResponse{};
  bool keep_alive = false;
  bool answered = false;  // a response (any status) was read
};

template <class Stream>
awaitable<Exchanged> exchange(Stream& s, const HttpConfig& c, http::request<http::string_body>& req, const std::string& what,
                              bool connected) {
  Exchanged out;
  if (!connected) {
    Status st = co_await connect(s, c);
    if (!st.ok()) {
      out.response = st.error();
      co_return out;
    }
  }
  beast::error_code ec;
  s.expires_after(ms(c.request_timeout_ms));
  co_await http::async_write(s, req, asio::redirect_error(use_awaitable, ec));
  // The engine may answer (401, 413) and close before it read the whole body: read its answer
  // even when the write broke.
  const beast::error_code write_ec = ec;
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxResponseBytes);
  ec = {};
  co_await http::async_read(s, buffer, parser, asio::redirect_error(use_awaitable, ec));
  if (ec) {
    out.response = transport_error(c, write_ec ? write_ec : ec, what, c.request_timeout_ms);
    co_return out;
  }
  auto& res = parser.get();
  HttpResponse r;
  r.status = static_cast<int>(res.result_int());
  if (auto it = res.find(http::field::content_type); it != res.end()) r.content_type = std::string(it->value());
  if (auto it = res.find(http::field::retry_after); it != res.end()) r.retry_after_s = std::atoi(std::string(it->value()).c_str());
  r.body = std::move(res.body());
  out.keep_alive = res.keep_alive() && !write_ec;
  out.answered = true;
  out.response = std::move(r);
  co_return out;
}

// Server-Sent Events framing: blocks separated by a blank line, "event:" and "data:" fields,
// ":" comments (the heartbeat).
class SseParser {
 public:
  explicit SseParser(std::function<void(const std::string&, const std::string&)> on_event) : on_event_(std::move(on_event)) {}
  void feed(std::string_view bytes) {
    for (char ch : bytes)
      if (ch != '\r') text_.push_back(ch);
    size_t end;
    while ((end = text_.find("\n\n")) != std::string::npos) {
      block(std::string_view(text_).substr(0, end));
      text_.erase(0, end + 2);
    }
  }

 private:
  void block(std::string_view b) {
    std::string type, data;
    size_t pos = 0;
    while (pos <= b.size()) {
      size_t nl = b.find('\n', pos);
      if (nl == std::string_view::npos) nl = b.size();
      std::string_view line = b.substr(pos, nl - pos);
      pos = nl + 1;
      if (line.empty() || line.front() == ':') continue;
      const size_t colon = line.find(':');
      std::string_view field = line.substr(0, colon);
      std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      if (field == "event") type = value;
      if (field == "data") {
        if (!data.empty()) data.push_back('\n');
        data += value;
      }
    }
    if (!type.empty()) on_event_(type, data);
  }
  std::function<void(const std::string&, const std::string&)> on_event_;
  std::string text_;
};

template <class Stream>
awaitable<Status> stream_events(Stream& s, const HttpConfig& c, uint32_t idle_timeout_ms, std::function<Status()> on_open,
                                std::function<void(const std::string&, const std::string&)> on_event) {
  Status st = co_await connect(s, c);
  if (!st.ok()) co_return st;
  const std::string what = "the event stream";
  auto req = make_request(c, http::verb::get, "/v1/events?client=" + c.client_name);
  req.set(http::field::accept, "text/event-stream");
  beast::error_code ec;
  s.expires_after(ms(c.request_timeout_ms));
  co_await http::async_write(s, req, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return transport_error(c, ec, what, c.request_timeout_ms);
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(1 << 20);
  co_await http::async_read_header(s, buffer, parser, asio::redirect_error(use_awaitable, ec));
  if (ec) co_return transport_error(c, ec, what, c.request_timeout_ms);
  if (parser.get().result_int() != 200) {
    // An error answer has a length: read it for the engine's message.
    co_await http::async_read(s, buffer, parser, asio::redirect_error(use_awaitable, ec));
    HttpResponse r;
    r.status = static_cast<int>(parser.get().result_int());
    r.body = parser.get().body();
    co_return response_error(c, r, "subscribing to the engine's events");
  }
  if (Status opened = on_open(); !opened.ok()) co_return opened;
  SseParser sse(std::move(on_event));
  // Bytes read past the header belong to the stream (it has no length and no chunking).
  sse.feed(std::string_view(static_cast<const char*>(buffer.data().data()), buffer.size()));
  std::string chunk(64 * 1024, '\0');
  for (;;) {
    s.expires_after(ms(idle_timeout_ms));
    const size_t n = co_await s.async_read_some(asio::buffer(chunk), asio::redirect_error(use_awaitable, ec));
    if (ec == beast::error::timeout)
      co_return make_error(INFILL_ERROR_TIMEOUT, "no event or heartbeat from the engine at " + c.endpoint.text + " for " +
                                                     std::to_string(idle_timeout_ms) + " ms");
    if (ec) co_return make_error(INFILL_ERROR_CONNECTION, "the event stream from " + c.endpoint.text + " ended: " + ec.message());
    sse.feed(std::string_view(chunk.data(), n));
  }
}

}  // namespace

namespace {

// A connection kept open between calls, with the io_context its stream runs on.
struct PooledConnection {
  asio::io_context ioc;
  std::optional<UnixStream> unix_stream;
  std::optional<TcpStream> tcp_stream;
  std::chrono::steady_clock::time_point idle_since;

  int native_handle() {
    return unix_stream ? unix_stream->socket().native_handle() : tcp_stream->socket().native_handle();
  }
  // Still open and quiet: the engine has not closed it (a read would see EOF) and sent nothing.
  bool alive() {
    char byte = 0;
    const ssize_t n = ::recv(native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
};

}  // namespace

class ConnectionPool {
 public:
  // Younger than the engine's idle limit (limits.header_timeout_ms, 1.5 s in the tests and
  // 10 s by default), so a connection taken from here is rarely one the engine is closing.
  static constexpr auto kMaxIdle = std::chrono::milliseconds(1000);
  static constexpr size_t kMaxConnections = 4;

  std::unique_ptr<PooledConnection> take() {
    std::lock_guard lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    while (!idle_.empty()) {
      std::unique_ptr<PooledConnection> c = std::move(idle_.back());
      idle_.pop_back();
      if (now - c->idle_since < kMaxIdle && c->alive()) return c;
    }
    return nullptr;
  }
  void put(std::unique_ptr<PooledConnection> c) {
    c->idle_since = std::chrono::steady_clock::now();
    std::lock_guard lock(mu_);
    if (idle_.size() < kMaxConnections) idle_.push_back(std::move(c));
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<PooledConnection>> idle_;
};

std::shared_ptr<ConnectionPool> make_connection_pool() { return std::make_shared<ConnectionPool>(); }

namespace {

// One exchange on `conn` (connecting it first when `fresh`), run on its own io_context.
Exchanged run_exchange(PooledConnection& conn, const HttpConfig& c, http::request<http::string_body>& req,
                       const std::string& what, bool fresh) {
  std::optional<Exchanged> out;
  conn.ioc.restart();
  asio::co_spawn(
      conn.ioc,
      [&]() -> awaitable<void> {
        try {
          if (conn.unix_stream) out = co_await exchange(*conn.unix_stream, c, req, what, !fresh);
          else out = co_await exchange(*conn.tcp_stream, c, req, what, !fresh);
        } catch (const std::exception& e) {
          out.emplace();
          out->response = make_error(INFILL_ERROR_INTERNAL, what + ": " + e.what());
        }
      },
      asio::detached);
  // A backstop for what the stream's own timeouts do not cover (name resolution).
  conn.ioc.run_for(ms(c.connect_timeout_ms) + ms(c.request_timeout_ms) + std::chrono::seconds(1));
  if (!out) {
    out.emplace();
    out->response = make_error(INFILL_ERROR_TIMEOUT, what + ": no answer from " + c.endpoint.text + " within " +
                                                        std::to_string(c.connect_timeout_ms + c.request_timeout_ms) + " ms");
  }
  return std::move(*out);
}

std::unique_ptr<PooledConnection> new_connection(const HttpConfig& c) {
  auto conn = std::make_unique<PooledConnection>();
  if (c.endpoint.is_unix()) conn->unix_stream.emplace(conn->ioc);
  else conn->tcp_stream.emplace(conn->ioc);
  return conn;
}

}  // namespace

Result<HttpResponse> http_call(const HttpConfig& c, const std::string& method, const std::string& target,
                               const std::string& body, const std::string& content_type) {
  const std::string what = method + " " + target.substr(0, target.find('?'));
  const http::verb verb = http::string_to_verb(method);
  auto req = make_request(c, verb, target);
  req.keep_alive(c.pool != nullptr);
  if (!content_type.empty()) req.set(http::field::content_type, content_type);
  if (!body.empty() || verb == http::verb::post) req.body() = body;
  req.prepare_payload();

  std::unique_ptr<PooledConnection> conn = c.pool ? c.pool->take() : nullptr;
  const bool reused = conn != nullptr;
  if (!conn) conn = new_connection(c);
  Exchanged out = run_exchange(*conn, c, req, what, !reused);
  if (reused && !out.answered) {
    // The engine closed the kept connection as the request went out (its idle limit): it
    // never read the request, so sending it again on a new connection is safe.
    conn = new_connection(c);
    out = run_exchange(*conn, c, req, what, true);
  }
  if (out.answered && out.keep_alive && c.pool) c.pool->put(std::move(conn));
  return std::move(out.response);
}

Error response_error(const HttpConfig& c, const HttpResponse& r, const std::string& what) {
  Error e;
  e.http_status = r.status;
  e.retry_after_s = r.retry_after_s;
  switch (r.status) {
    case 401:
    case 403: e.code = INFILL_ERROR_UNAUTHORIZED; break;
    case 404: e.code = INFILL_ERROR_NOT_FOUND; break;
    case 409: e.code = INFILL_ERROR_CONFLICT; break;
    case 413: e.code = INFILL_ERROR_TOO_LARGE; break;
    case 429: e.code = INFILL_ERROR_RATE_LIMITED; break;
    case 503: e.code = INFILL_ERROR_UNAVAILABLE; break;
    default: e.code = r.status >= 500 ? INFILL_ERROR_SERVER : r.status >= 400 ? INFILL_ERROR_REJECTED : INFILL_ERROR_PROTOCOL;
  }
  std::string engine_message;
  const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    const auto& err = j["error"];
    if (err.contains("code") && err["code"].is_string()) e.engine_code = err["code"].get<std::string>();
    if (err.contains("message") && err["message"].is_string()) engine_message = err["message"].get<std::string>();
  } else {
    engine_message = r.body.substr(0, 200);
  }
  e.message = what + ": " + (engine_message.empty() ? std::string("(no message)") : engine_message) + " (HTTP " +
              std::to_string(r.status) + (e.engine_code.empty() ? "" : " " + e.engine_code) + ")";
  if (r.status == 401) {
    e.message += c.token.empty()
                     ? "; no token was given: set infill_client_options.token or token_file, or $INFILL_TOKEN (the engine "
                       "keeps its token in ~/.config/infill/token)"
                     : "; the token was refused: it must match the engine's --token-file";
  }
  if (r.status == 429 && r.retry_after_s > 0) e.message += "; retry after " + std::to_string(r.retry_after_s) + " s";
  return e;
}

awaitable<Status> run_event_stream(const HttpConfig& c, uint32_t idle_timeout_ms, std::function<Status()> on_open,
                                   std::function<void(const std::string&, const std::string&)> on_event) {
  auto ex = co_await asio::this_coro::executor;
  if (c.endpoint.is_unix()) {
    UnixStream s(ex);
    co_return co_await stream_events(s, c, idle_timeout_ms, std::move(on_open), std::move(on_event));
  }
  TcpStream s(ex);
  co_return co_await stream_events(s, c, idle_timeout_ms, std::move(on_open), std::move(on_event));
}

}  // namespace infill::sdk
