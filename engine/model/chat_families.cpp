// The hand-written chat template families, each a rendering of its reference Jinja template, for
// GGUF files without a template and for operators who name a family (--chat-template):
//   chatml : <|im_start|>{role}\n{content}<|im_end|>\n ... (SmolLM2 adds a default system turn)
//   gemma  : Gemma 3's template (BOS, system text prepended to the first user turn, "model" role)
//   llama2 : Llama-2-chat's template ([INST] ... [/INST], <<SYS>> block in the first turn)
//   llama3 : Llama 3 Instruct's template (<|start_header_id|>role<|end_header_id|>\n\n ... <|eot_id|>)
#include <initializer_list>
#include <string_view>

#include "base/error.h"
#include "engine/model/chat_template.h"

namespace fathom {
namespace {


// Python's str.isspace() code points: what Jinja's `trim` and str.strip() remove.
bool is_python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// Decodes the character starting at s[i] (1..3 bytes suffice for every space above); returns
// {code point, length}, with an invalid/4-byte lead as a non-space.
std::pair<uint32_t, size_t> char_at(const std::string& s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {b0, 1};
  const size_t n = (b0 & 0xE0) == 0xC0 ? 2 : (b0 & 0xF0) == 0xE0 ? 3 : 0;
  // Only 2- and 3-byte characters can be white space; anything else, a sequence cut short by
  // the end of the text or a non-continuation byte is one non-space byte (found by fuzz_chat:
  // a lone 0xE2 decoded as U+2000 and stepped past the end).
  if (n == 0 || i + n > s.size()) return {0xFFFFFFFF, 1};
  uint32_t cp = n == 2 ? (b0 & 0x1Fu) : (b0 & 0x0Fu);
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return {0xFFFFFFFF, 1};
    cp = (cp << 6) | (b & 0x3Fu);
  }
  return {cp, n};
}

std::string python_strip(const std::string& s) {
  size_t begin = 0;
  while (begin < s.size()) {
    auto [cp, n] = char_at(s, begin);
    if (!is_python_space(cp)) break;
    begin += n;
  }
  size_t end = s.size();
  while (end > begin) {
    // Step back to the start of the last character.
    size_t start = end - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    auto [cp, n] = char_at(s, start);
    if (!is_python_space(cp) || start + n != end) break;
    end = start;
  }
  return s.substr(begin, end - begin);
}

// Builds the prompt, recording where message content lands: lit() for the template's own text
// (special tokens spelled as text), msg() for what a client wrote.
struct Writer {
  RenderedChat r;
  Writer& lit(std::string_view s) {
    r.text.append(s);
    return *this;
  }
  Writer& msg(std::string_view s) {
    if (!s.empty()) r.content.emplace_back(r.text.size(), r.text.size() + s.size());
    r.text.append(s);
    return *this;
  }
};

void check_roles(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) throw Error("chat template: the message list is empty");
  for (const ChatMessage& m : messages)
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      throw Error("chat template: unknown role '" + m.role + "' (expected system, user or assistant)");
}

RenderedChat render_chatml(const std::vector<ChatMessage>& messages, const std::string& default_system,
                           bool add_generation_prompt) {
  Writer w;
  if (!default_system.empty() && messages[0].role != "system")
    w.lit("<|im_start|>system\n").lit(default_system).lit("<|im_end|>\n");  // the template's own text
  for (const ChatMessage& m : messages) w.lit("<|im_start|>").lit(m.role).lit("\n").msg(m.content).lit("<|im_end|>\n");
  if (add_generation_prompt) w.lit("<|im_start|>assistant\n");
  return w.r;
}

// Gemma 3: a leading system message becomes "<content>\n\n" before the first turn's text; turns
// must alternate user/model starting with user (the template raises otherwise); text is trimmed.
RenderedChat render_gemma(const std::vector<ChatMessage>& messages, const std::string& bos, bool add_generation_prompt) {
  Writer w;
  w.lit(bos);
  size_t begin = 0;
  if (messages[0].role == "system") begin = 1;
  for (size_t i = begin; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const size_t index0 = i - begin;
    if ((m.role == "user") != (index0 % 2 == 0))
      throw Error("gemma chat template: conversation roles must alternate user/assistant/user/assistant/...");
    w.lit("<start_of_turn>").lit(m.role == "assistant" ? "model" : m.role).lit("\n");
    if (index0 == 0 && begin == 1) w.msg(messages[0].content).lit("\n\n");
    w.msg(python_strip(m.content)).lit("<end_of_turn>\n");
  }
  if (add_generation_prompt) w.lit("<start_of_turn>model\n");
  return w.r;
}

// Llama 2 chat. Its template has no generation prompt: the prompt ends with " [/INST]". The
// <<SYS>> block is plain text inside the first user turn (stripped with it, as the template does).
RenderedChat render_llama2(const std::vector<ChatMessage>& messages, const std::string& bos) {
  const std::string eos = "</s>";  // every Llama 2 vocabulary spells EOS this way
  Writer w;
  size_t begin = 0;
  const bool has_system = messages[0].role == "system";
  if (has_system) begin = 1;
  for (size_t i = begin; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const size_t index0 = i - begin;
    if ((m.role == "user") != (index0 % 2 == 0))
      throw Error("llama2 chat template: conversation roles must alternate user/assistant/user/assistant/...");
    std::string content = m.content;
    if (index0 == 0 && has_system) {
      content.clear();
      for (std::string_view part : {std::string_view("<<SYS>>\n"), std::string_view(messages[0].content),
                                    std::string_view("\n<</SYS>>\n\n"), std::string_view(m.content)})
        content.append(part);
    }
    if (m.role == "user") {
      w.lit(bos).lit("[INST] ").msg(python_strip(content)).lit(" [/INST]");
    } else if (m.role == "assistant") {
      w.lit(" ").msg(python_strip(content)).lit(" ").lit(eos);
    }
  }
  return w.r;
}

RenderedChat render_llama3(const std::vector<ChatMessage>& messages, const std::string& bos, bool add_generation_prompt) {
  Writer w;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i == 0) w.lit(bos);
    w.lit("<|start_header_id|>").lit(messages[i].role).lit("<|end_header_id|>\n\n");
    w.msg(python_strip(messages[i].content)).lit("<|eot_id|>");
  }
  if (add_generation_prompt) w.lit("<|start_header_id|>assistant<|end_header_id|>\n\n");
  return w.r;
}

}  // namespace

// A ChatML template's literal default system turn: the text of the first
// '<|im_start|>system\n TEXT <|im_end|>' in which TEXT is plain (no Jinja expression). The literal
// may spell the newline as a real newline (SmolLM2's GGUF) or as the escape \n (Qwen 2.5).
std::string find_default_system(const std::string& tmpl) {
  const std::string open = "<|im_start|>system";
  for (size_t at = tmpl.find(open); at != std::string::npos; at = tmpl.find(open, at + 1)) {
    size_t p = at + open.size();
    if (tmpl.compare(p, 1, "\n") == 0) {
      p += 1;
    } else if (tmpl.compare(p, 2, "\\n") == 0) {
      p += 2;
    } else {
      continue;
    }
    const size_t close = tmpl.find("<|im_end|>", p);
    if (close == std::string::npos) break;
    std::string text = tmpl.substr(p, close - p);
    if (text.empty() || text.find_first_of("'\"{}") != std::string::npos) continue;
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'n') {
        out += '\n';
        ++i;
      } else {
        out += text[i];
      }
    }
    return out;
  }
  return {};
}

RenderedChat render_family(ChatFamily family, const std::vector<ChatMessage>& messages, const std::string& bos,
                           const std::string& default_system, bool add_generation_prompt) {
  check_roles(messages);
  switch (family) {
    case ChatFamily::kChatML: return render_chatml(messages, default_system, add_generation_prompt);
    case ChatFamily::kGemma: return render_gemma(messages, bos, add_generation_prompt);
    case ChatFamily::kLlama2: return render_llama2(messages, bos);
    case ChatFamily::kLlama3: return render_llama3(messages, bos, add_generation_prompt);
    case ChatFamily::kJinja: break;
  }
  throw Error("chat template: not a hand-written family");
}

std::string default_family_for_architecture(const std::string& arch) {
  if (arch == "gemma" || arch == "gemma2" || arch == "gemma3") return "gemma";
  return "";
}

}  // namespace fathom
