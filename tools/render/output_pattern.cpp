#include "output_pattern.h"

#include <cctype>
#include <cstdio>
#include <filesystem>

namespace infill::render {
namespace {

// Calls `on_token(name, width)` for each token and `on_text(text)` between them; returns an
// error message or "".
template <class OnText, class OnToken>
std::string scan(const std::string& pattern, OnText on_text, OnToken on_token) {
  size_t i = 0;
  while (i < pattern.size()) {
    const size_t open = pattern.find_first_of("{}", i);
    if (open == std::string::npos) {
      on_text(pattern.substr(i));
      break;
    }
    if (pattern[open] == '}') return "a '}' without '{' at character " + std::to_string(open + 1);
    on_text(pattern.substr(i, open - i));
    const size_t close = pattern.find('}', open);
    if (close == std::string::npos) return "a '{' without '}' at character " + std::to_string(open + 1);
    const std::string body = pattern.substr(open + 1, close - open - 1);
    const size_t colon = body.find(':');
    const std::string name = body.substr(0, colon);
    int width = 0;
    if (colon != std::string::npos) {
      const std::string digits = body.substr(colon + 1);
      if (digits.empty() || digits.size() > 2 || digits.find_first_not_of("0123456789") != std::string::npos)
        return "token {" + body + "} has a bad width (expected e.g. {item:04})";
      width = std::stoi(digits);
    }
    if (name != "item" && name != "seed" && name != "name") return "unknown token {" + body + "}";
    on_token(name, width);
    i = close + 1;
  }
  return "";
}

std::string padded(uint64_t value, int width) {
  std::string s = std::to_string(value);
  if (static_cast<int>(s.size()) < width) s.insert(0, static_cast<size_t>(width) - s.size(), '0');
  return s;
}

}  // namespace

Status check_output_pattern(const std::string& pattern) {
  if (pattern.empty()) return invalid_argument("the pattern is empty");
  std::string error = scan(pattern, [](const std::string&) {}, [](const std::string&, int) {});
  if (!error.empty()) return invalid_argument(error);
  return {};
}

std::string expand_output_pattern(const std::string& pattern, const OutputTokens& tokens) {
  std::string out;
  scan(
      pattern, [&](const std::string& text) { out += text; },
      [&](const std::string& name, int width) {
        if (name == "item") out += padded(static_cast<uint64_t>(tokens.item), width);
        else if (name == "seed") out += padded(tokens.seed, width);
        else out += tokens.name;
      });
  return out;
}

std::optional<std::string> output_file_format(const std::string& path) {
  std::string extension = std::filesystem::path(path).extension().string();
  for (char& c : extension) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (extension == ".png") return "png";
  if (extension == ".tif" || extension == ".tiff") return "tiff";
  if (extension == ".exr") return "exr";
  return std::nullopt;
}

}  // namespace infill::render
