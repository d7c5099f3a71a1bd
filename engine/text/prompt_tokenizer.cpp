#include "text/prompt_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

namespace infill {

namespace fs = std::filesystem;

namespace {

// An added-token field of tokenizer_config.json: a string, or {"content": ...}.
std::string token_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

}  // namespace

Result<PromptTokenizer> PromptTokenizer::load(const std::string& dir) {
  const fs::path root(dir);
  if (!fs::is_directory(root)) return not_found(dir + " is not a folder (expected a tokenizer folder with tokenizer.json)");
  PromptTokenizer out;
  INFILL_ASSIGN_OR_RETURN(out.tokenizer_, BpeTokenizer::load((root / "tokenizer.json").string()));

  const fs::path config_path = root / "tokenizer_config.json";
  std::ifstream config_in(config_path);
  if (!config_in) return not_found(config_path.string() + " is missing (expected the pad token and chat template)");
  nlohmann::json config;
  try {
    config = nlohmann::json::parse(config_in);
  } catch (const nlohmann::json::exception& e) {
    return corrupt_data(config_path.string() + " is not valid JSON: " + e.what());
  }

  const std::string pad = token_text(config.value("pad_token", nlohmann::json()));
  if (pad.empty()) return invalid_argument(config_path.string() + " has no \"pad_token\" (expected the token prompts are padded with)");
  out.pad_id_ = out.tokenizer_->token_id(pad);
  if (out.pad_id_ < 0) {
    return invalid_argument(config_path.string() + ": pad_token \"" + pad + "\" is not a token of tokenizer.json");
  }

  const fs::path jinja = root / "chat_template.jinja";
  if (fs::is_regular_file(jinja)) {
    std::ifstream in(jinja);
    std::stringstream text;
    text << in.rdbuf();
    INFILL_ASSIGN_OR_RETURN(out.template_, recognise_chat_template(text.str(), jinja.string()));
  } else if (config.contains("chat_template") && config["chat_template"].is_string()) {
    INFILL_ASSIGN_OR_RETURN(out.template_,
                            recognise_chat_template(config["chat_template"].get<std::string>(), config_path.string()));
  } else {
    return invalid_argument(config_path.string() + " has no \"chat_template\" and there is no " + jinja.string() +
                            " (expected the template prompts are rendered with)");
  }
  return out;
}

std::string PromptTokenizer::render(std::string_view prompt) const { return render_user_prompt(template_, prompt); }

PromptTokens PromptTokenizer::encode(std::string_view prompt, int max_length) const {
  PromptTokens out;
  std::vector<int32_t> ids = tokenizer_->encode(render(prompt));
  out.full_length = static_cast<int>(ids.size());
  if (static_cast<int>(ids.size()) > max_length) {
    ids.resize(static_cast<size_t>(max_length));
    out.truncated = true;
  }
  out.real_length = static_cast<int>(ids.size());
  out.mask.assign(static_cast<size_t>(max_length), 0);
  std::fill(out.mask.begin(), out.mask.begin() + out.real_length, 1);
  ids.resize(static_cast<size_t>(max_length), pad_id_);
  out.ids = std::move(ids);
  return out;
}

}  // namespace infill
