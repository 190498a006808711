#pragma once
// Chat templates: the families the default models use, recognised from the GGUF
// tokenizer.chat_template text. An unrecognised template is a fathom::Error unless a family
// is named explicitly (config / --chat-template).
#include <string>
#include <utility>
#include <vector>

namespace fathom {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class ChatFamily { kChatML, kGemma, kLlama2, kLlama3 };

// A rendered prompt and the byte ranges [begin, end) of `text` that hold message content (what a
// client wrote), ascending. Encode with EncodeOptions::literal = &content: special-token text is
// recognised only where the template wrote it, so a message cannot forge a control token.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> content;
};

class ChatTemplate {
 public:
  // `family_name` empty: detect from `template_text` (throws when unrecognised);
  // otherwise one of "chatml", "gemma", "llama2", "llama3" (throws when unknown).
  static ChatTemplate resolve(const std::string& template_text, const std::string& family_name,
                              const std::string& bos_text);
  ChatFamily family() const { return family_; }
  const char* family_name() const;
  // The prompt text (special tokens written as text; encode with parse_special).
  // Throws fathom::Error for an empty message list or an unknown role, and where the family's
  // template raises (Gemma, Llama 2: user/assistant turns must alternate).
  std::string apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  // The same text with the ranges of message content (see RenderedChat).
  RenderedChat render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  // True when the rendered prompt starts with the BOS text itself (Gemma, Llama 2/3): encode it
  // with add_bos = false so BOS is not doubled.
  bool writes_bos() const { return family_ != ChatFamily::kChatML; }
  // ChatML templates that insert a system prompt when the conversation has none (SmolLM2's
  // "You are a helpful AI assistant named SmolLM, trained by Hugging Face"): that text, taken from
  // the template; empty otherwise.
  const std::string& default_system_prompt() const { return default_system_; }

 private:
  ChatFamily family_ = ChatFamily::kChatML;
  std::string bos_text_;
  std::string default_system_;
};

// The family to assume when a GGUF has no tokenizer.chat_template: "gemma" for gemma/gemma2/gemma3,
// "" (none) otherwise. The model loader falls back to it by general.architecture, because
// resolve() with no template text and no family name throws (the Gemma 3 270M GGUF has no template).
std::string default_family_for_architecture(const std::string& arch);

}  // namespace fathom
