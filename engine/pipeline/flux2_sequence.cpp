#include "pipeline/flux2_sequence.h"

#include <vector>

#include <ATen/ATen.h>

namespace infill {

at::Tensor flux2_text_ids(int64_t length) {
  at::Tensor ids = at::zeros({length, 4}, at::kFloat);
  ids.select(1, 3).copy_(at::arange(length, at::kFloat));
  return ids;
}

at::Tensor flux2_grid_ids(int64_t h, int64_t w, int t) {
  at::Tensor ids = at::zeros({h * w, 4}, at::kFloat);
  const at::Tensor index = at::arange(h * w, at::kLong);
  ids.select(1, 0).fill_(static_cast<double>(t));
  ids.select(1, 1).copy_(at::floor_divide(index, w));
  ids.select(1, 2).copy_(at::remainder(index, w));
  return ids;
}

at::Tensor flux2_mask_rows(const at::Tensor& pixel_mask, int token_pixels, int cells) {
  TORCH_CHECK(pixel_mask.dim() == 2 && token_pixels > 0 && pixel_mask.size(0) % token_pixels == 0 &&
                  pixel_mask.size(1) % token_pixels == 0,
              "flux2_mask_rows: mask must be [H, W] with H and W multiples of ", token_pixels);
  const int64_t h = pixel_mask.size(0) / token_pixels, w = pixel_mask.size(1) / token_pixels;
  if (cells == 0) return at::zeros({h * w, 0}, at::kFloat);
  TORCH_CHECK(cells > 0 && token_pixels % cells == 0, "flux2_mask_rows: ", cells, " cells do not divide a token of ",
              token_pixels, " pixels");
  const int64_t cell = token_pixels / cells;
  const at::Tensor means =
      at::avg_pool2d(pixel_mask.to(at::kFloat).unsqueeze(0).unsqueeze(0), {cell, cell}, {cell, cell})[0][0];
  // [h * cells, w * cells] -> [h, w, cells, cells] -> [h * w, cells * cells]
  return means.reshape({h, cells, w, cells}).permute({0, 2, 1, 3}).reshape({h * w, int64_t{cells} * cells}).contiguous();
}

at::Tensor flux2_with_mask(const at::Tensor& rows, const at::Tensor& mask_rows) {
  return mask_rows.size(1) == 0 ? rows : at::cat({rows, mask_rows}, 1);
}

Flux2ReferenceRows flux2_reference_rows(const at::Tensor& template_latent, std::span<const at::Tensor> references,
                                        int64_t mask_channels) {
  std::vector<at::Tensor> rows, ids;
  const auto add = [&](const at::Tensor& latent, int t) {
    const at::Tensor tokens = latent_to_tokens(latent.to(at::kFloat));
    rows.push_back(flux2_with_mask(tokens, at::zeros({tokens.size(0), mask_channels}, at::kFloat)));
    ids.push_back(flux2_grid_ids(latent.size(1), latent.size(2), t));
  };
  add(template_latent, kFlux2ReferenceTime);
  for (size_t i = 0; i < references.size(); ++i) add(references[i], kFlux2ReferenceTime * static_cast<int>(i + 2));
  return {at::cat(rows), at::cat(ids)};
}

at::Tensor latent_to_tokens(const at::Tensor& chw) {
  return chw.reshape({chw.size(0), chw.size(1) * chw.size(2)}).t().contiguous();
}

at::Tensor tokens_to_latent(const at::Tensor& rows, int64_t h, int64_t w) {
  return rows.t().reshape({rows.size(1), h, w}).contiguous();
}

}  // namespace infill
