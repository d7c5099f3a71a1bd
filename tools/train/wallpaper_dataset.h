#pragma once
/// Training and held-out images: photos and artwork shipped in Debian packages
/// (gnome-backgrounds, mate-backgrounds, plasma-workspace-wallpapers), grouped by source
/// picture so that every resolution and light/dark variant of one picture falls in the same
/// split. Images are decoded once and kept in RAM at a working scale; crops are drawn from
/// a torch generator, so a (seed, step) pair always gives the same batch.

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"

namespace infill::train {

struct SourceImage {
  std::string group;  ///< e.g. "plasma/Altai", "mate/Elephants", "gnome/adwaita"
  std::string path;
  at::Tensor rgb;     ///< [3, H, W] float32 in [0, 1], short side = working size
};

struct DatasetOptions {
  /// The three packages' folders only: other packages install into /usr/share/backgrounds
  /// too (ukui-wallpapers, whose photos the quality benchmark keeps for testing).
  std::vector<std::string> roots = {"/usr/share/backgrounds/gnome", "/usr/share/backgrounds/mate", "/usr/share/wallpapers"};
  int working_short_side = 512;
  /// Groups whose name hashes below this fraction are held out (about this share).
  double held_out_fraction = 0.15;
};

struct Dataset {
  std::vector<SourceImage> train;
  std::vector<SourceImage> held_out;
  std::vector<std::string> skipped;  ///< files that could not be read, with the reason
};

/// Finds, groups, splits and loads the images. Errors: no image found under the roots, or
/// one split empty (names the roots and how many groups were found).
Result<Dataset> load_dataset(const DatasetOptions& options);

/// The group a file belongs to (exposed for tests).
std::string source_group(const std::string& path);
/// Whether a group is held out (a pure function of its name).
bool is_held_out(const std::string& group, double fraction);

/// One image file at the working scale (short side `short_side`, at least 256 px), or why it
/// cannot be used, naming the file.
Result<SourceImage> load_source_image(const std::string& path, const std::string& group, int short_side = 512);

struct CropOptions {
  int size = 256;
  bool augment = true;  ///< random scale, flips and hue rotation (training only)
};

/// n random crops [n, 3, size, size] from `images` drawn with `gen`.
at::Tensor random_crops(const std::vector<SourceImage>& images, int n, const CropOptions& options, at::Generator& gen);

}  // namespace infill::train
