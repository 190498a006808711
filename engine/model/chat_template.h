#pragma once
// Chat templates: the families the default models use, recognised from the GGUF
// tokenizer.chat_template text. An unrecognised template is a fathom::Error unless a family
// is named explicitly (config / --chat-template).
#include <string>
#include <vector>

namespace fathom {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class ChatFamily { kChatML, kGemma, kLlama2, kLlama3 };

class ChatTemplate {
 public:
  // `family_name` empty: detect from `template_text` (throws when unrecognised);
  // otherwise one of "chatml", "gemma", "llama2", "llama3" (throws when unknown).
  static ChatTemplate resolve(const std::string& template_text, const std::string& family_name,
                              const std::string& bos_text);
  ChatFamily family() const { return family_; }
  const char* family_name() const;
  // The prompt text (special tokens written as text; encode with parse_special).
  // Throws fathom::Error for an empty message list or an unknown role.
  std::string apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;

 private:
  ChatFamily family_ = ChatFamily::kChatML;
  std::string bos_text_;
};

// The family to assume when a GGUF has no tokenizer.chat_template: "gemma" for gemma/gemma2/gemma3,
// "" (none) otherwise.
std::string default_family_for_architecture(const std::string& arch);

}  // namespace fathom
