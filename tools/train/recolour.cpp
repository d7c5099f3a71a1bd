#include "recolour.h"

#include <ATen/ATen.h>

#include "colour_words.h"

namespace infill::train {

at::Tensor recolour_masked_region(const at::Tensor& crop, const at::Tensor& mask, int word, double texture) {
  const at::Tensor m = (mask > 0.5).to(crop.scalar_type()).unsqueeze(0);  // [1, S, S]
  const double count = m.sum().item<double>();
  if (count == 0) return crop;
  const at::Tensor mean = (crop * m).flatten(1).sum(1) / count;  // [3]
  const Rgb target = reference_colour(word);
  const at::Tensor goal = at::tensor({target[0], target[1], target[2]}, crop.options()).view({3, 1, 1});
  const at::Tensor moved = (goal + texture * (crop - mean.view({3, 1, 1}))).clamp(0.0, 1.0);
  return at::where(m > 0, moved, crop);
}

}  // namespace infill::train
