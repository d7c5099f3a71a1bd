// infill-tokenize DIR [--chat] [--max-length N]: tokenizes prompts with a model's tokenizer
// folder (tokenizer.json, tokenizer_config.json) as the engine does. Reads one JSON string per
// line on stdin (the prompt) and prints one JSON line per prompt:
//   {"text", "ids"}                                     plain encoding
//   {"text", "rendered", "ids", "length", "truncated"}  with --chat: the chat-templated,
//                                                       truncated (not padded) token ids
// Exit 0 when the folder loads and every line is a JSON string; 2 on a bad folder or line.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "text/prompt_tokenizer.h"

int main(int argc, char** argv) {
  std::string dir;
  bool chat = false;
  int max_length = 512;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--chat") == 0) {
      chat = true;
    } else if (std::strcmp(argv[i], "--max-length") == 0 && i + 1 < argc) {
      max_length = std::atoi(argv[++i]);
    } else if (argv[i][0] != '-' && dir.empty()) {
      dir = argv[i];
    } else {
      std::fprintf(stderr, "infill-tokenize: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (dir.empty() || max_length < 1) {
    std::fprintf(stderr, "usage: infill-tokenize TOKENIZER_DIR [--chat] [--max-length N >= 1] < prompts.jsonl\n");
    return 2;
  }
  auto tokenizer = infill::PromptTokenizer::load(dir);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "infill-tokenize: %s\n", tokenizer.status().to_string().c_str());
    return 2;
  }
  std::string line;
  int number = 0;
  while (std::getline(std::cin, line)) {
    ++number;
    if (line.empty()) continue;
    nlohmann::json text;
    try {
      text = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      std::fprintf(stderr, "infill-tokenize: stdin line %d is not JSON: %s\n", number, e.what());
      return 2;
    }
    if (!text.is_string()) {
      std::fprintf(stderr, "infill-tokenize: stdin line %d is not a JSON string (expected the prompt)\n", number);
      return 2;
    }
    const std::string prompt = text.get<std::string>();
    nlohmann::ordered_json out;
    out["text"] = prompt;
    if (chat) {
      const infill::PromptTokens tokens = tokenizer->encode(prompt, max_length);
      out["rendered"] = tokenizer->render(prompt);
      out["ids"] = std::vector<int32_t>(tokens.ids.begin(), tokens.ids.begin() + tokens.real_length);
      out["length"] = tokens.full_length;
      out["truncated"] = tokens.truncated;
    } else {
      const auto ids = tokenizer->tokenizer().encode(prompt);
      out["ids"] = ids;
      out["decoded"] = tokenizer->tokenizer().decode(ids);
    }
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  return 0;
}
