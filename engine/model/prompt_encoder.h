#pragma once
/// Turns prompt text into the DiT's conditioning for models with a prompt vocabulary
/// (manifest "prompt": {"vocabulary": [...]}): the prompt is the multi-hot vector of its
/// words over the vocabulary, the encoding the model was trained with.

#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "model/manifest.h"

namespace infill {

/// Words of a prompt: lower-cased, split at white space and commas, empty parts dropped.
std::vector<std::string> prompt_words(std::string_view text);

/// float [vocabulary size] with 1 at each word of `text`, or an undefined tensor (the null
/// prompt) for text without words. Errors (invalid_argument): a word outside the vocabulary,
/// naming it and listing the vocabulary; a model without a vocabulary and non-empty text.
Result<at::Tensor> encode_prompt(const ModelManifest& manifest, std::string_view text);

}  // namespace infill
