#include "loss_plot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "pipeline/image_io.h"

namespace infill::train {

namespace {

// 3x5 bitmap glyphs for the characters tick labels need.
const std::array<const char*, 13> kGlyphs = {
    "111101101101111", "010110010010111", "111001111100111", "111001111001111", "101101111001001",
    "111100111001111", "111100111101111", "111001001001001", "111101111101111", "111101111001111",
    "000000000000010",  // .
    "000000111000000",  // -
    "000000000000000",  // space
};

int glyph_index(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c == '.') return 10;
  if (c == '-') return 11;
  return 12;
}

struct Canvas {
  int width, height;
  std::vector<uint8_t> rgb;
  Canvas(int w, int h) : width(w), height(h), rgb(static_cast<size_t>(w) * h * 3, 255) {}
  void put(int x, int y, std::array<uint8_t, 3> c) {
    if (x < 0 || y < 0 || x >= width || y >= height) return;
    const size_t i = (static_cast<size_t>(y) * width + x) * 3;
    rgb[i] = c[0];
    rgb[i + 1] = c[1];
    rgb[i + 2] = c[2];
  }
  void line(double x0, double y0, double x1, double y1, std::array<uint8_t, 3> c, int thick = 1) {
    const int n = static_cast<int>(std::max(std::abs(x1 - x0), std::abs(y1 - y0))) + 1;
    for (int i = 0; i <= n; ++i) {
      const double t = static_cast<double>(i) / n;
      const int x = static_cast<int>(std::lround(x0 + (x1 - x0) * t)), y = static_cast<int>(std::lround(y0 + (y1 - y0) * t));
      for (int dy = 0; dy < thick; ++dy)
        for (int dx = 0; dx < thick; ++dx) put(x + dx, y + dy, c);
    }
  }
  void text(int x, int y, const std::string& s, int scale = 2) {
    for (char ch : s) {
      const char* g = kGlyphs[glyph_index(ch)];
      for (int r = 0; r < 5; ++r)
        for (int col = 0; col < 3; ++col)
          if (g[r * 3 + col] == '1')
            for (int sy = 0; sy < scale; ++sy)
              for (int sx = 0; sx < scale; ++sx) put(x + col * scale + sx, y + r * scale + sy, {0, 0, 0});
      x += 4 * scale;
    }
  }
};

}  // namespace

Status write_loss_plot(const std::string& path, const std::vector<LossPoint>& train,
                       const std::vector<LossPoint>& held_out) {
  if (train.empty()) return invalid_argument("loss plot: no training points");
  constexpr int kW = 800, kH = 480, kLeft = 80, kRight = 20, kTop = 20, kBottom = 50;
  Canvas c(kW, kH);
  double lo = 1e30, hi = 0.0;
  for (const auto* curve : {&train, &held_out})
    for (const auto& p : *curve) {
      lo = std::min(lo, p.loss);
      hi = std::max(hi, p.loss);
    }
  lo = std::pow(10.0, std::floor(std::log10(std::max(lo, 1e-6)) * 4) / 4);
  hi = std::pow(10.0, std::ceil(std::log10(std::max(hi, lo * 1.01)) * 4) / 4);
  const double max_step = std::max(1, train.back().step);
  auto px = [&](double step) { return kLeft + (kW - kLeft - kRight) * step / max_step; };
  auto py = [&](double loss) {
    return kTop + (kH - kTop - kBottom) * (std::log10(hi) - std::log10(std::max(loss, lo))) / (std::log10(hi) - std::log10(lo));
  };
  // Grid and tick labels: loss at quarter decades, step at fifths.
  for (double e = std::log10(lo); e <= std::log10(hi) + 1e-9; e += 0.25) {
    const double v = std::pow(10.0, e);
    c.line(kLeft, py(v), kW - kRight, py(v), {225, 225, 225});
    char label[32];
    std::snprintf(label, sizeof label, "%.3g", v);
    c.text(4, static_cast<int>(py(v)) - 5, label);
  }
  for (int i = 0; i <= 5; ++i) {
    const double s = max_step * i / 5;
    c.line(px(s), kTop, px(s), kH - kBottom, {225, 225, 225});
    c.text(static_cast<int>(px(s)) - 12, kH - kBottom + 10, std::to_string(static_cast<int>(s)));
  }
  c.line(kLeft, kTop, kLeft, kH - kBottom, {0, 0, 0});
  c.line(kLeft, kH - kBottom, kW - kRight, kH - kBottom, {0, 0, 0});
  for (size_t i = 1; i < train.size(); ++i) {
    c.line(px(train[i - 1].step), py(train[i - 1].loss), px(train[i].step), py(train[i].loss), {31, 119, 180}, 2);
  }
  for (size_t i = 1; i < held_out.size(); ++i) {
    c.line(px(held_out[i - 1].step), py(held_out[i - 1].loss), px(held_out[i].step), py(held_out[i].loss),
           {255, 127, 14}, 3);
  }
  PixelImage image = PixelImage::allocate(kW, kH, 3, PixelFormat::kU8);
  std::memcpy(image.data.data(), c.rgb.data(), c.rgb.size());
  return save_image(path, image);
}

}  // namespace infill::train
