#include "colour_words.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace infill::train {

namespace {

constexpr std::array<Rgb, kColourWords> kReferences = {{
    {0.85, 0.12, 0.12},  // red
    {0.95, 0.55, 0.10},  // orange
    {0.95, 0.90, 0.20},  // yellow
    {0.20, 0.65, 0.20},  // green
    {0.20, 0.80, 0.85},  // cyan
    {0.15, 0.30, 0.85},  // blue
    {0.55, 0.20, 0.70},  // purple
    {0.95, 0.55, 0.75},  // pink
    {0.50, 0.30, 0.15},  // brown
    {0.95, 0.95, 0.95},  // white
    {0.50, 0.50, 0.50},  // gray
    {0.05, 0.05, 0.05},  // black
}};

double linear(double c) { return c <= 0.04045 ? c / 12.92 : std::pow((c + 0.055) / 1.055, 2.4); }
double lab_f(double t) { return t > 216.0 / 24389.0 ? std::cbrt(t) : (24389.0 / 27.0 * t + 16.0) / 116.0; }

}  // namespace

Rgb reference_colour(int index) {
  if (index < 0 || index >= kColourWords) throw std::out_of_range("colour word index " + std::to_string(index));
  return kReferences[index];
}

Lab srgb_to_lab(const Rgb& rgb) {
  const double r = linear(rgb[0]), g = linear(rgb[1]), b = linear(rgb[2]);
  const double x = (0.4124564 * r + 0.3575761 * g + 0.1804375 * b) / 0.95047;
  const double y = 0.2126729 * r + 0.7151522 * g + 0.0721750 * b;
  const double z = (0.0193339 * r + 0.1191920 * g + 0.9503041 * b) / 1.08883;
  const double fx = lab_f(x), fy = lab_f(y), fz = lab_f(z);
  return {116.0 * fy - 16.0, 500.0 * (fx - fy), 200.0 * (fy - fz)};
}

int nearest_colour_word(const Rgb& mean) {
  const Lab lab = srgb_to_lab(mean);
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int i = 0; i < kColourWords; ++i) {
    const Lab ref = srgb_to_lab(kReferences[i]);
    const double d = std::hypot(lab[0] - ref[0], lab[1] - ref[1], lab[2] - ref[2]);
    if (d < best_d) {
      best_d = d;
      best = i;
    }
  }
  return best;
}

std::vector<int> describe_colour(const Rgb& mean) {
  const int colour = nearest_colour_word(mean);
  std::vector<int> words = {colour};
  const double lightness = srgb_to_lab(mean)[0];
  const double ref = srgb_to_lab(kReferences[colour])[0];
  if (lightness > ref + kToneMargin) words.push_back(kBrightWord);
  if (lightness < ref - kToneMargin) words.push_back(kDarkWord);
  return words;
}

}  // namespace infill::train
