#pragma once
// A real engine (small random-weight model) behind a real server on a Unix socket in a temp
// dir and on TCP 127.0.0.1 with an ephemeral port.
#include <c10/core/InferenceMode.h>

#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "engine/serving/serving_fixture.h"
#include "http_test_client.h"
#include "pipeline/image_io.h"
#include "server/engine_service.h"
#include "server/http_server.h"
#include "support/catch.h"
#include "support/temp_dir.h"

namespace infill::test {

inline ServerLimits test_limits() {
  ServerLimits l;
  l.max_body_bytes = 1 << 20;
  l.max_queued_per_client = 3;
  l.header_timeout_ms = 1500;
  l.body_timeout_ms = 5000;
  l.event_heartbeat_ms = 500;
  return l;
}

inline std::string to_string(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

inline std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

inline std::string png_string(const PixelImage& img) {
  auto png = encode_png(img);
  if (!png.ok()) throw std::runtime_error(png.status().to_string());
  return to_string(*png);
}

// A grey 8-bit mask of the given size, 255 inside the rectangle.
inline PixelImage rect_mask_image(int width, int height, int x, int y, int w, int h) {
  PixelImage m = PixelImage::allocate(width, height, 1, PixelFormat::kU8);
  auto* p = reinterpret_cast<uint8_t*>(m.data.data());
  for (int yy = y; yy < y + h; ++yy)
    for (int xx = x; xx < x + w; ++xx) p[yy * width + xx] = 255;
  return m;
}

struct ServerFixture {
  c10::InferenceMode guard;
  TempDir dir{"infill-srv"};
  std::string token = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  std::unique_ptr<EngineService> service;
  std::unique_ptr<HttpServer> server;
  Endpoint unix_ep;
  Endpoint tcp_ep;
  PixelImage picture = serving_picture(0);
  std::string template_png = png_string(picture);

  /// `second_model`: also serve dir/model-b, a random model one block deeper (another id).
  /// `before_step`: the workers' step hook (a StepGate's, tests/support/step_gate.h).
  /// `make_model`: writes the model to serve into the fixture's folder and returns its path
  /// (default: a small random DiT model). `configure` changes the service's options last.
  explicit ServerFixture(bool load = true, ServerLimits limits = test_limits(), bool second_model = false,
                         std::function<void(std::span<const uint64_t>)> before_step = {},
                         std::function<std::string(const TempDir&)> make_model = {},
                         std::function<void(ServiceOptions&)> configure = {}) {
    ServiceOptions o;
    if (make_model) {
      o.model_path = make_model(dir);
    } else {
      if (!write_random_model(dir.file("model"), tiny_serving_dit(), 16, 42).ok()) throw std::runtime_error("model");
      o.model_path = dir.file("model");
    }
    if (second_model) {
      DitConfig deeper = tiny_serving_dit();
      deeper.depth += 1;
      if (!write_random_model(dir.file("model-b"), deeper, 16, 43).ok()) throw std::runtime_error("model-b");
      o.extra_model_paths.push_back(dir.file("model-b"));
    }
    o.limits = limits;
    o.calibrate = false;
    o.ram_cache_bytes = 64 << 20;
    o.before_step = std::move(before_step);
    if (configure) configure(o);
    service = std::make_unique<EngineService>(o);
    if (load) REQUIRE(service->load().ok());
    HttpServerOptions h;
    h.socket_path = dir.file("run/engine.sock");
    h.tcp_host = "127.0.0.1";
    h.tcp_port = 0;
    h.token = token;
    h.limits = limits;
    auto s = HttpServer::start(*service, h);
    REQUIRE(s.ok());
    server = std::move(*s);
    unix_ep.unix_path = h.socket_path;
    tcp_ep.port = server->tcp_port();
  }
  ~ServerFixture() {
    server->stop();
    server.reset();
    service.reset();
  }

  std::string auth() const { return "Authorization: Bearer " + token; }

  // Uploads the picture; returns the template id.
  std::string upload() {
    Response r = request(unix_ep, "POST", "/v1/templates?name=picture.png", template_png, {"Content-Type: image/png"});
    REQUIRE((r.status == 201 || r.status == 200));
    return r.json()["id"].get<std::string>();
  }
};

}  // namespace infill::test
