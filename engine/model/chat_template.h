#pragma once
// Chat templates. A model's own Jinja template (GGUF tokenizer.chat_template, or a file the
// operator names) is rendered as Hugging Face's apply_chat_template renders it (base/jinja); four
// hand-written families (chatml, gemma, llama2, llama3) remain for files without a template or
// when the operator names one. See docs/models.md (Chat templates).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fathom {

namespace jinja {
class Template;
}

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

// A conversation as apply_chat_template hands it to a template.
struct ChatInput {
  // [{"role", "content"(string or null), ...}]; an assistant turn may carry "tool_calls"
  // ([{"id", "type", "function": {"name", "arguments": object}}]) and "reasoning_content", a tool
  // turn "tool_call_id" / "name". The hand-written families read only role and content.
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null, or the request's `tools` array
  // The request's chat_template_kwargs (e.g. enable_thinking): more template variables. They
  // cannot replace messages, tools, add_generation_prompt, bos_token or eos_token.
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  bool add_generation_prompt = true;
};

enum class ChatFamily { kJinja, kChatML, kGemma, kLlama2, kLlama3 };

// A rendered prompt and the byte ranges [begin, end) of `text` that hold message content (what a
// client wrote), ascending. Encode with EncodeOptions::literal = &content: special-token text is
// recognised only where the template wrote it, so a message cannot forge a control token.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> content;
};

class ChatTemplate {
 public:
  // `family_name` empty: the Jinja template `template_text` (throws fathom::Error naming the
  // template line on a syntax error; throws when it is empty). Otherwise one of "chatml",
  // "gemma", "llama2", "llama3" (throws when unknown); a chatml family still takes its default
  // system turn from `template_text`. `tool_use_text`: the template's named alternative for
  // requests with tools (GGUF tokenizer.chat_template.tool_use), or empty.
  static ChatTemplate resolve(const std::string& template_text, const std::string& family_name,
                              const std::string& bos_text, const std::string& eos_text = "",
                              const std::string& tool_use_text = "");
  ChatFamily family() const { return family_; }
  const char* family_name() const;
  bool is_jinja() const { return family_ == ChatFamily::kJinja; }
  // True when the template itself describes `tools` to the model (a Jinja template that reads the
  // variable): the request's tools and tool turns are then passed to it as they are.
  bool renders_tools() const { return renders_tools_; }
  // The Jinja source the template renders for this input (the tool_use alternative when tools
  // are given and the model has one); empty for a hand-written family.
  const std::string& source(bool with_tools = false) const;

  // The prompt text (special tokens written as text) and the ranges of client data in it.
  // Throws fathom::Error for an empty message list, for what the template raises
  // (raise_exception, alternation rules of Gemma and Llama 2) and for a render over the limits.
  RenderedChat render(const ChatInput& input) const;
  RenderedChat render(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  std::string apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  // ChatML templates that insert a system prompt when the conversation has none (SmolLM2's
  // "You are a helpful AI assistant named SmolLM, trained by Hugging Face"): that text, taken from
  // the template, for the hand-written chatml family; empty otherwise.
  const std::string& default_system_prompt() const { return default_system_; }

 private:
  ChatFamily family_ = ChatFamily::kChatML;
  std::string bos_text_;
  std::string eos_text_;
  std::string default_system_;
  std::string source_, tool_use_source_;
  std::shared_ptr<const jinja::Template> jinja_, jinja_tool_use_;
  bool renders_tools_ = false;
};

// Renders one of the hand-written families (engine/model/chat_families.cpp). `family` is not kJinja.
RenderedChat render_family(ChatFamily family, const std::vector<ChatMessage>& messages, const std::string& bos,
                           const std::string& default_system, bool add_generation_prompt);
// The chatml family's default system turn found in a template's text (see default_system_prompt).
std::string find_default_system(const std::string& template_text);

// The family to assume when a GGUF has no tokenizer.chat_template: "gemma" for gemma/gemma2/gemma3,
// "" (none) otherwise. The model loader falls back to it by general.architecture, because
// resolve() with no template text and no family name throws (the Gemma 3 270M GGUF has no template).
std::string default_family_for_architecture(const std::string& arch);

}  // namespace fathom
