#pragma once
/// The token sequence of a FLUX.2 edit, as FLUX.2 [klein] edits: [text rows, image rows,
/// reference rows]. Image tokens are the noisy latent's pixels (FLUX.2's latent is already 2x2
/// patchified: one latent pixel, one token), reference tokens the template's clean latent,
/// told apart by their position ids' time axis (0 for the image, 10 for the first reference,
/// upstream's `scale` in prepare_image_ids). Pure functions.

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace infill {

/// Time coordinate of the (first) reference image.
constexpr int kFlux2ReferenceTime = 10;

/// float [length, 4] ids (0, 0, 0, l) of text rows l = 0 .. length-1.
at::Tensor flux2_text_ids(int64_t length);
/// float [h * w, 4] ids (t, y, x, 0) of a latent grid, row-major.
at::Tensor flux2_grid_ids(int64_t h, int64_t w, int t);
/// The mask cells of mask-conditioned models (Flux2Config::mask_channels = cells * cells):
/// `pixel_mask` [H, W] float in [0, 1], H and W multiples of `token_pixels` -> float
/// [(H / token_pixels) * (W / token_pixels), cells * cells], row-major tokens, each row the mean
/// mask over the token's cells in (y, x) order. cells == 0 gives [tokens, 0].
at::Tensor flux2_mask_rows(const at::Tensor& pixel_mask, int token_pixels, int cells);
/// rows [N, C] with `mask_rows` [N, k] appended (rows itself when k == 0).
at::Tensor flux2_with_mask(const at::Tensor& rows, const at::Tensor& mask_rows);
/// [C, h, w] latent -> [h * w, C] token rows, row-major.
at::Tensor latent_to_tokens(const at::Tensor& chw);
/// The inverse: [h * w, C] -> [C, h, w].
at::Tensor tokens_to_latent(const at::Tensor& rows, int64_t h, int64_t w);

}  // namespace infill
