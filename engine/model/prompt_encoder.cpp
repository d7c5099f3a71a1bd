#include "model/prompt_encoder.h"

#include <algorithm>
#include <cctype>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

namespace infill {

std::vector<std::string> prompt_words(std::string_view text) {
  std::vector<std::string> words;
  std::string current;
  for (char c : text) {
    if (std::isspace(static_cast<unsigned char>(c)) || c == ',') {
      if (!current.empty()) words.push_back(std::move(current));
      current.clear();
    } else {
      current.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    }
  }
  if (!current.empty()) words.push_back(std::move(current));
  return words;
}

Result<at::Tensor> encode_prompt(const ModelManifest& manifest, std::string_view text) {
  const std::vector<std::string> words = prompt_words(text);
  if (words.empty()) return at::Tensor();
  if (!manifest.has_prompt) {
    return invalid_argument("model " + manifest.name + " takes no text prompt, got \"" + std::string(text) + "\"");
  }
  const auto& vocabulary = manifest.prompt.vocabulary;
  c10::InferenceMode guard;
  at::Tensor v = at::zeros({static_cast<int64_t>(vocabulary.size())}, at::kFloat);
  for (const std::string& word : words) {
    auto it = std::find(vocabulary.begin(), vocabulary.end(), word);
    if (it == vocabulary.end()) {
      std::string known;
      for (const auto& w : vocabulary) known += (known.empty() ? "" : ", ") + w;
      return invalid_argument("prompt word \"" + word + "\" is not in the vocabulary of model " + manifest.name +
                              " (known words: " + known + ")");
    }
    v[it - vocabulary.begin()] = 1.0f;
  }
  return v;
}

}  // namespace infill
