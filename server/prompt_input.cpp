#include "server/prompt_input.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "engine/model/model.h"

namespace fathom {

std::vector<int32_t> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t i = 0;
  while (i < text.size()) {
    const size_t comma = text.find(',', i);
    const std::string item = text.substr(i, comma == std::string::npos ? std::string::npos : comma - i);
    try {
      size_t used = 0;
      const long v = std::stol(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      throw Error("--prompt-ids: '" + item + "' is not a token id");
    }
    if (comma == std::string::npos) break;
    i = comma + 1;
  }
  return ids;
}

std::vector<int32_t> encode_chat_json(const Model& model, const std::string& json_text) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_array()) throw Error("--chat needs a JSON array of {\"role\", \"content\"} objects");
  std::vector<ChatMessage> messages;
  for (const auto& m : j) {
    if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m["role"].is_string() ||
        !m["content"].is_string())
      throw Error("--chat: every message needs string \"role\" and \"content\"");
    messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  return model.encode_chat(messages, /*add_generation_prompt=*/true);
}

std::vector<std::vector<int32_t>> prompts_from_args(const Model& model, const CliArgs& args) {
  std::vector<std::vector<int32_t>> prompts;
  for (const std::string& p : args.all("prompt")) prompts.push_back(model.tokenizer().encode(p));
  for (const std::string& c : args.all("chat")) prompts.push_back(encode_chat_json(model, c));
  for (const std::string& ids : args.all("prompt-ids")) prompts.push_back(parse_id_list(ids));
  if (prompts.empty()) throw Error("give a prompt with --prompt, --chat or --prompt-ids");
  return prompts;
}

}  // namespace fathom
