// The event stream over WebSocket (Boost.Beast's synchronous client as the peer): the same
// events as SSE, one JSON text message each, with the same access rules.
#include "support/catch.h"

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility> (g++ 12).
#include <utility>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>

#include "server/multipart.h"
#include "server_fixture.h"

using namespace infill;
using namespace infill::test;
using nlohmann::json;
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;

namespace {

// Reads JSON messages until `stop` holds for one or the socket times out.
template <class Ws, class Stop>
std::vector<json> read_until(Ws& ws, Stop stop) {
  std::vector<json> got;
  for (;;) {
    beast::flat_buffer b;
    beast::error_code ec;
    ws.read(b, ec);
    if (ec) break;
    REQUIRE(ws.got_text());
    got.push_back(json::parse(beast::buffers_to_string(b.data())));
    if (stop(got.back())) break;
  }
  return got;
}

uint64_t submit(const Endpoint& ep, const std::string& tmpl, const std::string& client, std::vector<std::string> headers = {}) {
  json p = {{"template", tmpl}, {"mask_rect", {16, 16, 24, 16}}, {"seed", 3}, {"steps", 3}, {"preview_every_steps", 1}};
  headers.push_back("Content-Type: application/json");
  headers.push_back("X-Infill-Client: " + client);
  Response r = request(ep, "POST", "/v1/edits", p.dump(), headers);
  INFO(r.body);
  REQUIRE(r.status == 202);
  return r.json()["id"].get<uint64_t>();
}

void set_read_timeout(int fd) {
  timeval tv{20, 0};  // a broken server fails the test instead of hanging it
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

}  // namespace

TEST_CASE("WebSocket events on the Unix socket: connected, queued, progress, preview, done", "[server][websocket]") {
  ServerFixture f;
  const std::string tmpl = f.upload();
  asio::io_context ioc;
  websocket::stream<asio::local::stream_protocol::socket> ws(ioc);
  ws.next_layer().connect(asio::local::stream_protocol::endpoint(f.unix_ep.unix_path));
  set_read_timeout(ws.next_layer().native_handle());
  ws.handshake("localhost", "/v1/events?client=painter");
  auto hello = read_until(ws, [](const json&) { return true; });
  REQUIRE(hello.size() == 1);
  CHECK(hello[0]["type"] == "connected");
  CHECK(hello[0]["client"] == "painter");

  const uint64_t other = submit(f.unix_ep, tmpl, "someone-else");
  const uint64_t id = submit(f.unix_ep, tmpl, "painter");
  auto events = read_until(ws, [&](const json& e) { return e["type"] == "done" && e["id"] == id; });
  std::vector<std::string> types;
  for (const auto& e : events) {
    CHECK(e["id"].get<uint64_t>() == id);  // only this client's edits
    CHECK(e["id"].get<uint64_t>() != other);
    types.push_back(e["type"]);
  }
  REQUIRE_FALSE(types.empty());
  CHECK(types.front() == "queued");
  CHECK(types.back() == "done");
  CHECK(std::count(types.begin(), types.end(), "progress") == 3);
  CHECK(std::count(types.begin(), types.end(), "preview") >= 1);
  for (const auto& e : events)
    if (e["type"] == "preview") {
      auto png = base64_decode(e["png_base64"].get<std::string>());
      REQUIRE(png.ok());
      CHECK(decode_image(bytes_of(*png), "preview", 1 << 20).ok());
    }
  ws.close(websocket::close_code::normal);
}

TEST_CASE("WebSocket events on TCP need the token, and a closing client leaves the server serving", "[server][websocket]") {
  ServerFixture f;
  const std::string tmpl = f.upload();
  asio::io_context ioc;
  const asio::ip::tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), f.tcp_ep.port);
  {
    websocket::stream<asio::ip::tcp::socket> ws(ioc);
    ws.next_layer().connect(ep);
    set_read_timeout(ws.next_layer().native_handle());
    websocket::response_type res;
    beast::error_code ec;
    ws.handshake(res, "localhost", "/v1/events?client=farm", ec);
    CHECK(ec);
  }
  // The same upgrade by hand shows the refusal: 401 with the JSON error, no 101.
  Response refused = request(f.tcp_ep, "GET", "/v1/events?client=farm", "",
                             {"Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Version: 13",
                              "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="});
  CHECK(refused.status == 401);
  CHECK(refused.json()["error"]["code"] == "unauthorized");
  websocket::stream<asio::ip::tcp::socket> ws(ioc);
  ws.next_layer().connect(ep);
  set_read_timeout(ws.next_layer().native_handle());
  ws.set_option(websocket::stream_base::decorator(
      [&](websocket::request_type& req) { req.set(beast::http::field::authorization, "Bearer " + f.token); }));
  ws.handshake("localhost", "/v1/events?client=farm");
  CHECK(read_until(ws, [](const json&) { return true; }).at(0)["type"] == "connected");
  const uint64_t id = submit(f.tcp_ep, tmpl, "farm", {f.auth()});
  auto events = read_until(ws, [&](const json& e) { return e["type"] == "done" && e["id"] == id; });
  REQUIRE_FALSE(events.empty());
  CHECK(events.back()["type"] == "done");
  // Hang up without a close handshake: the server drops the subscription and keeps serving.
  ws.next_layer().close();
  CHECK(request(f.unix_ep, "GET", "/health").status == 200);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (f.server->connections() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(f.server->connections() == 0);
}
