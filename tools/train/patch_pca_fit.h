#pragma once
/// Fits the patch PCA codec of infill-tiny in closed form: the mean and the leading
/// eigenvectors of the covariance of f x f RGB patches of training crops.

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/patch_pca_codec.h"

namespace infill::train {

/// `crops` [N, 3, S, S] in [0, 1], S a multiple of `factor`.
Result<PatchPcaCodec> fit_patch_pca(const at::Tensor& crops, int factor, int channels);

/// Mean PSNR (dB, peak 1) of codec round trips of `crops` [N, 3, S, S], per crop then averaged.
double round_trip_psnr(const LatentCodec& codec, const at::Tensor& crops);

/// Standard deviation of the codec's latents over `crops`: the manifest's scale is its inverse.
double latent_std(const LatentCodec& codec, const at::Tensor& crops);

}  // namespace infill::train
