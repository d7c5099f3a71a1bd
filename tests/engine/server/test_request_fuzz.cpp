// A bounded mutation fuzzer of the request parser and routes: 20000 mutated requests (or
// $INFILL_FUZZ_REQUESTS; scripts/fuzz_asan.sh runs 100000 under AddressSanitizer) over the
// Unix socket; the engine must answer each with a 2xx or a 4xx carrying a JSON error
// (or close the connection of a truncated request), never a 5xx, and keep serving.
#include "support/catch.h"

#include <sys/socket.h>

#include <cstdlib>
#include <random>

#include "server_fixture.h"

using namespace infill;
using namespace infill::test;
using nlohmann::json;

namespace {

// Sends `bytes`, closes our write side (so a request cut short ends at once) and reads the
// reply until the server closes, at most `timeout_ms`.
Response fuzz_exchange(const Endpoint& ep, const std::string& bytes, int timeout_ms) {
  const int fd = connect_to(ep);
  send_all(fd, bytes);
  ::shutdown(fd, SHUT_WR);
  std::string raw;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline)
    if (!read_some(fd, raw, 20)) break;
  ::close(fd);
  return parse_response(raw);
}

std::string mutate(std::string s, std::mt19937& rng) {
  auto pick = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  const int rounds = 1 + static_cast<int>(rng() % 4);
  static const char* kTokens[] = {"\r\n", "\r\n\r\n", ":", " ", "\0", "%", "%zz", "{", "}", "[", "\"", "--",
                                  "Content-Length: 99999999\r\n", "Transfer-Encoding: chunked\r\n",
                                  "Expect: 100-continue\r\n", "HTTP/1.0", "HTTP/9.9", "/v1/edits/", "/../", "-1",
                                  "18446744073709551616", "1e308", "null", "\xff\xfe", "multipart/form-data; boundary="};
  for (int r = 0; r < rounds; ++r) {
    switch (rng() % 7) {
      case 0:  // flip a byte
        if (!s.empty()) s[pick(s.size())] = static_cast<char>(rng());
        break;
      case 1:  // delete a range
        if (!s.empty()) {
          const size_t at = pick(s.size());
          s.erase(at, 1 + pick(std::min<size_t>(64, s.size() - at)));
        }
        break;
      case 2: {  // insert a token
        const char* t = kTokens[pick(std::size(kTokens))];
        s.insert(pick(s.size() + 1), std::string(t, std::strlen(t) == 0 ? 1 : std::strlen(t)));
        break;
      }
      case 3:  // truncate
        s.resize(pick(s.size() + 1));
        break;
      case 4: {  // duplicate a range
        if (!s.empty()) {
          const size_t at = pick(s.size());
          const std::string part = s.substr(at, 1 + pick(64));
          s.insert(pick(s.size() + 1), part);
        }
        break;
      }
      case 5: {  // random bytes
        std::string junk(1 + pick(32), '\0');
        for (char& c : junk) c = static_cast<char>(rng());
        s.insert(pick(s.size() + 1), junk);
        break;
      }
      default: {  // change a digit (lengths, ids, numbers)
        std::vector<size_t> digits;
        for (size_t i = 0; i < s.size(); ++i)
          if (s[i] >= '0' && s[i] <= '9') digits.push_back(i);
        if (!digits.empty()) s[digits[pick(digits.size())]] = static_cast<char>('0' + rng() % 10);
        break;
      }
    }
  }
  return s;
}

std::string http_request(const std::string& method, const std::string& target, const std::string& body,
                         const std::vector<std::string>& headers) {
  std::string r = method + " " + target + " HTTP/1.1\r\nHost: localhost\r\n";
  for (const auto& h : headers) r += h + "\r\n";
  if (!body.empty() || method == "POST") r += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  return r + "\r\n" + body;
}

}  // namespace

TEST_CASE("mutated requests never crash the engine and get a 4xx with a JSON error", "[server][fuzz]") {
  ServerLimits limits = test_limits();
  limits.max_queued_per_client = 1000;
  limits.max_live_edits = 1000;
  ServerFixture f(true, limits);
  const std::string tmpl = f.upload();
  const std::string mask_png = png_string(rect_mask_image(64, 48, 8, 8, 16, 16));
  auto [ct, multipart] = multipart_body({{"template", "", "", tmpl},
                                         {"steps", "", "", "2"},
                                         {"params", "", "application/json", R"({"seed": 3})"},
                                         {"mask", "m.png", "image/png", mask_png}});
  const std::vector<std::string> seeds = {
      http_request("GET", "/health", "", {}),
      http_request("GET", "/v1/models", "", {"X-Infill-Client: fuzz"}),
      http_request("GET", "/v1/metrics", "", {}),
      http_request("GET", "/v1/templates/" + tmpl, "", {}),
      http_request("POST", "/v1/templates?name=fuzz.png", f.template_png, {"Content-Type: image/png"}),
      http_request("POST", "/v1/edits",
                   json({{"template", tmpl}, {"mask_rect", {8, 8, 16, 16}}, {"steps", 2}, {"seed", 1}}).dump(),
                   {"Content-Type: application/json"}),
      http_request("POST", "/v1/edits", multipart, {ct}),
      http_request("GET", "/v1/edits/1", "", {"Accept: image/png"}),
      http_request("DELETE", "/v1/edits/2", "", {}),
  };
  std::mt19937 rng(12345);
  const char* env = std::getenv("INFILL_FUZZ_REQUESTS");
  const int kRequests = env ? std::max(1, std::atoi(env)) : 20000;
  int answered = 0, closed = 0, ok = 0;
  for (int i = 0; i < kRequests; ++i) {
    const std::string req = mutate(seeds[static_cast<size_t>(i) % seeds.size()], rng);
    Response r = fuzz_exchange(f.unix_ep, req, 5000);
    if (r.status == 0) {
      ++closed;
      continue;
    }
    ++answered;
    INFO("request " << i << ": " << json(req).dump(-1, ' ', false, json::error_handler_t::replace) << "\nreply: " << r.status << " " << r.body.substr(0, 300));
    REQUIRE(r.status < 500);
    if (r.status >= 300) {
      json j = r.json();
      REQUIRE(j.is_object());
      REQUIRE(j.contains("error"));
      REQUIRE(j["error"]["message"].is_string());
    } else {
      ++ok;
    }
  }
  // Most mutations still form a request that gets an answer.
  CHECK(answered > kRequests / 2);
  CHECK(ok > 0);
  REQUIRE(f.service->drain(30000, 5000));
  CHECK(request(f.unix_ep, "GET", "/health").status == 200);
  // Every connection was closed again.
  for (int i = 0; i < 100 && f.server->connections() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(f.server->connections() == 0);
}
