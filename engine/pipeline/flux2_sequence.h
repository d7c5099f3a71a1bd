#pragma once
/// The token sequence of a FLUX.2 edit, as FLUX.2 [klein] edits: [text rows, image rows,
/// reference rows]. Image tokens are the noisy latent's pixels (FLUX.2's latent is already 2x2
/// patchified: one latent pixel, one token), reference tokens the template's clean latent and
/// then each reference image's (reference_image.h), told apart by their position ids' time axis
/// (0 for the image, 10 for the template, 20, 30, ... for the edit's references: upstream's
/// `scale + scale * i` in encode_image_refs). Pure functions.

#include <cstdint>
#include <span>

#include <ATen/core/Tensor.h>

namespace infill {

/// Time coordinate of the (first) reference image.
constexpr int kFlux2ReferenceTime = 10;

/// The reference rows of a sequence and their ids.
struct Flux2ReferenceRows {
  at::Tensor rows;  ///< [R, C + mask_channels]: clean latent tokens, mask cells zero
  at::Tensor ids;   ///< [R, 4]
};
/// The template's clean latent `template_latent` [C, h, w] at t = 10, then each of
/// `references` ([C, h_i, w_i]) at t = 20, 30, ...
Flux2ReferenceRows flux2_reference_rows(const at::Tensor& template_latent, std::span<const at::Tensor> references,
                                        int64_t mask_channels);

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
