// libFuzzer target: chat messages -> every chat template family and the model's own Jinja
// template -> the SmolLM2 tokenizer.
// Bytes: messages separated by 0x1e; a message's first byte picks its role (system, user,
// assistant, or an unknown one), the rest is its content. Checked, beyond "no crash, leak, UB":
// - render() content ranges are ascending, disjoint and inside the text;
// - ChatML: encoding with the content ranges literal yields exactly as many <|im_start|> /
//   <|im_end|> tokens as the template wrote outside them (content can never forge a turn);
// - content that is valid UTF-8 survives encode -> decode unchanged, except for the bytes the
//   vocabulary cannot spell (SmolLM2 lacks 21 byte tokens; they are dropped, as HF tokenizers
//   does), which are taken out of the expected text first.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/utf8.h"
#include "engine/model/model.h"
#include "engine/model/chat_template.h"
#include "engine/model/tokenizer.h"

namespace {

const fathom::Model* g_model = nullptr;
bool g_unspellable[256] = {};  // bytes encode() drops

size_t count_outside(const fathom::RenderedChat& r, std::string_view needle) {
  size_t count = 0;
  for (size_t pos = r.text.find(needle); pos != std::string::npos; pos = r.text.find(needle, pos + 1)) {
    bool inside = false;
    for (const auto& [b, e] : r.content) inside = inside || (pos < e && pos + needle.size() > b);
    count += !inside;
  }
  return count;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* path = std::getenv("FATHOM_FUZZ_MODEL");
  g_model = fathom::Model::load(path ? path : "models/smollm2-135m-instruct-q4_1.gguf").release();
  for (int b = 0; b < 256; ++b)
    g_unspellable[b] = g_model->tokenizer()
                           .encode(std::string(1, static_cast<char>(b)), fathom::EncodeOptions{false, false, nullptr})
                           .empty();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const char* kRoles[] = {"system", "user", "assistant", "tool"};
  std::vector<fathom::ChatMessage> messages;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  while (!rest.empty() && messages.size() < 16) {
    const size_t end = std::min(rest.find('\x1e'), rest.size());
    const std::string_view m = rest.substr(0, end);
    rest.remove_prefix(std::min(end + 1, rest.size()));
    if (m.empty()) continue;
    messages.push_back({kRoles[static_cast<unsigned char>(m[0]) % 4], std::string(m.substr(1))});
  }
  const fathom::Tokenizer& tok = g_model->tokenizer();
  // "" is the model's own template (SmolLM2's ChatML, through the Jinja interpreter).
  for (const char* family : {"", "chatml", "gemma", "llama2", "llama3"}) {
    fathom::RenderedChat r;
    try {
      r = *family ? fathom::ChatTemplate::resolve("", family, "<s>").render(messages, (size & 1) != 0)
                  : g_model->chat_template().render(messages, (size & 1) != 0);
    } catch (const fathom::Error&) {
      continue;  // empty list, unknown role, non-alternating turns: a 400 in the server
    }
    size_t last = 0;
    for (const auto& [b, e] : r.content)
      if (b < last || e < b || e > r.text.size()) std::abort();
      else last = e;
    const std::vector<int32_t> ids = tok.encode(r.text, fathom::EncodeOptions{false, true, &r.content});
    if (std::string_view(family) == "chatml" || !*family) {
      for (const char* special : {"<|im_start|>", "<|im_end|>"}) {
        const int32_t id = tok.token_id(special);
        size_t n = 0;
        for (int32_t t : ids) n += t == id;
        if (n != count_outside(r, special)) std::abort();
      }
    }
  }
  for (const fathom::ChatMessage& m : messages) {
    std::string expected;
    for (char ch : m.content)
      if (!g_unspellable[static_cast<unsigned char>(ch)]) expected += ch;
    if (!fathom::is_valid_utf8(m.content) || !fathom::is_valid_utf8(expected)) continue;
    const std::vector<int32_t> ids = tok.encode(m.content, fathom::EncodeOptions{false, false, nullptr});
    if (tok.decode(ids) != expected) std::abort();
  }
  return 0;
}
