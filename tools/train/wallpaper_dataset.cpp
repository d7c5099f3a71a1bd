#include "wallpaper_dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <regex>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "common/hash.h"
#include "pipeline/image_io.h"

namespace infill::train {

namespace fs = std::filesystem;

std::string source_group(const std::string& path) {
  const fs::path p(path);
  const std::string s = p.generic_string();
  // Plasma: /usr/share/wallpapers/<Name>/contents/images[_dark]/<W>x<H>.<ext>
  static const std::regex plasma(R"(/wallpapers/([^/]+)/contents/)");
  std::smatch m;
  if (std::regex_search(s, m, plasma)) return "plasma/" + m[1].str();
  std::string stem = p.stem().string();
  // GNOME light/dark pairs: name-l / name-d.
  if (s.find("/backgrounds/gnome/") != std::string::npos) {
    if (stem.size() > 2 && (stem.ends_with("-l") || stem.ends_with("-d"))) stem.resize(stem.size() - 2);
    return "gnome/" + stem;
  }
  // MATE: Name.jpg, Name_3840x2160.jpg
  static const std::regex resolution(R"(_\d+x\d+$)");
  stem = std::regex_replace(stem, resolution, "");
  return "mate/" + stem;
}

bool is_held_out(const std::string& group, double fraction) {
  return static_cast<double>(fnv1a64(group) % 10000) < fraction * 10000.0;
}

namespace {

bool is_image_file(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png" || ext == ".webp";
}

// Downscales (area average) so that the short side is `short_side`; smaller images are kept.
at::Tensor to_working_size(const at::Tensor& rgb, int short_side) {
  const int64_t h = rgb.size(1), w = rgb.size(2);
  const double s = static_cast<double>(short_side) / static_cast<double>(std::min(h, w));
  if (s >= 1.0) return rgb.contiguous();
  const int64_t nh = std::max<int64_t>(1, std::lround(h * s)), nw = std::max<int64_t>(1, std::lround(w * s));
  return at::adaptive_avg_pool2d(rgb.unsqueeze(0), {nh, nw})[0].contiguous();
}

}  // namespace

Result<Dataset> load_dataset(const DatasetOptions& options) {
  // Per group, the largest file of each variant folder (light and dark are both kept).
  std::map<std::string, std::map<std::string, std::pair<uintmax_t, std::string>>> chosen;
  for (const std::string& root : options.roots) {
    std::error_code ec;
    if (!fs::is_directory(root, ec)) continue;
    for (auto it = fs::recursive_directory_iterator(root, ec); it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      if (!it->is_regular_file(ec) || !is_image_file(it->path())) continue;
      const std::string path = it->path().string();
      if (path.find("screenshot") != std::string::npos) continue;
      const uintmax_t bytes = it->file_size(ec);
      if (bytes < 4096) continue;  // placeholder images (e.g. a flat colour for VNC sessions)
      const std::string group = source_group(path);
      std::string variant = it->path().parent_path().string();
      if (group.starts_with("gnome/")) variant = it->path().stem().string();
      auto& slot = chosen[group][variant];
      if (bytes > slot.first) slot = {bytes, path};
    }
  }
  if (chosen.empty()) {
    std::string roots;
    for (const auto& r : options.roots) roots += (roots.empty() ? "" : ", ") + r;
    return not_found("no training images under " + roots +
                     " (install gnome-backgrounds, mate-backgrounds and plasma-workspace-wallpapers)");
  }
  Dataset data;
  c10::InferenceMode guard;
  for (const auto& [group, variants] : chosen) {
    for (const auto& [variant, entry] : variants) {
      auto image = load_source_image(entry.second, group, options.working_short_side);
      if (!image.ok()) {
        data.skipped.push_back(image.status().message());
        continue;
      }
      (is_held_out(group, options.held_out_fraction) ? data.held_out : data.train).push_back(std::move(*image));
    }
  }
  if (data.train.empty() || data.held_out.empty()) {
    return invalid_argument("dataset split is degenerate: " + std::to_string(data.train.size()) + " training and " +
                            std::to_string(data.held_out.size()) + " held-out images from " +
                            std::to_string(chosen.size()) + " groups");
  }
  return data;
}

Result<SourceImage> load_source_image(const std::string& path, const std::string& group, int short_side) {
  c10::InferenceMode guard;
  auto image = load_image(path, int64_t{1} << 31);
  if (!image.ok()) return Status(image.status().code(), path + ": " + image.status().message());
  SourceImage s;
  s.group = group;
  s.path = path;
  s.rgb = to_working_size(to_rgb_tensor(*image), short_side);
  if (s.rgb.size(1) < 256 || s.rgb.size(2) < 256) return invalid_argument(path + ": smaller than 256 px after scaling");
  return s;
}

at::Tensor random_crops(const std::vector<SourceImage>& images, int n, const CropOptions& options, at::Generator& gen) {
  c10::InferenceMode guard;
  const int64_t size = options.size;
  at::Tensor out = at::empty({n, 3, size, size}, at::kFloat);
  auto uniform = [&](double lo, double hi) { return at::empty({1}, at::kDouble).uniform_(lo, hi, gen).item<double>(); };
  for (int i = 0; i < n; ++i) {
    const auto& img = images[static_cast<size_t>(uniform(0.0, 1.0) * images.size()) % images.size()].rgb;
    const int64_t h = img.size(1), w = img.size(2);
    // Random scale: a window of 1x to 1.6x the crop size (bounded by the image), area-downscaled.
    int64_t win = size;
    if (options.augment) win = std::min<int64_t>({static_cast<int64_t>(size * uniform(1.0, 1.6)), h, w});
    const int64_t y = static_cast<int64_t>(uniform(0.0, 1.0) * static_cast<double>(h - win + 1));
    const int64_t x = static_cast<int64_t>(uniform(0.0, 1.0) * static_cast<double>(w - win + 1));
    at::Tensor crop = img.narrow(1, std::min(y, h - win), win).narrow(2, std::min(x, w - win), win);
    if (win != size) crop = at::adaptive_avg_pool2d(crop.unsqueeze(0), {size, size})[0];
    if (options.augment) {
      if (uniform(0.0, 1.0) < 0.5) crop = crop.flip({2});
      // Hue rotation in YIQ (and a saturation change) so that every colour word is common in
      // the training labels, not only the blues and greys that dominate wallpapers.
      if (uniform(0.0, 1.0) < 0.7) {
        const double angle = uniform(-M_PI, M_PI), sat = uniform(0.7, 1.4);
        const double c = std::cos(angle) * sat, s = std::sin(angle) * sat;
        const at::Tensor to_yiq = at::tensor({0.299, 0.587, 0.114, 0.596, -0.274, -0.322, 0.211, -0.523, 0.312},
                                             at::kFloat).reshape({3, 3});
        const at::Tensor rot = at::tensor({1.0, 0.0, 0.0, 0.0, c, -s, 0.0, s, c}, at::kFloat).reshape({3, 3});
        const at::Tensor m = at::mm(at::inverse(to_yiq), at::mm(rot, to_yiq));
        crop = at::mm(m, crop.reshape({3, -1})).reshape({3, size, size}).clamp(0.0, 1.0);
      }
    }
    out[i].copy_(crop);
  }
  return out;
}

}  // namespace infill::train
