// libFuzzer target: arbitrary bytes (invalid UTF-8 included) -> every BPE pre-tokenizer.
// Checked, beyond "no crash, out-of-range read, leak, UB, hang": the words are non-empty views
// into the input, in order, covering it exactly (a word lost or repeated would lose or invent
// text before BPE ever sees it).
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "engine/model/bpe_pretokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  constexpr fathom::PreTokenizer kKinds[] = {
      fathom::PreTokenizer::kGpt2,        fathom::PreTokenizer::kDigitsThenGpt2, fathom::PreTokenizer::kLlama3,
      fathom::PreTokenizer::kQwen2,       fathom::PreTokenizer::kDeepseekLlm,    fathom::PreTokenizer::kDeepseekCoder,
      fathom::PreTokenizer::kDeepseekV3, fathom::PreTokenizer::kFalcon,         fathom::PreTokenizer::kQwen35,
      fathom::PreTokenizer::kGpt4o,
  };
  std::vector<std::string_view> words;
  for (fathom::PreTokenizer kind : kKinds) {
    words.clear();
    fathom::pre_tokenize(kind, text, words);
    const char* at = text.data();
    for (std::string_view w : words) {
      if (w.empty() || w.data() != at) std::abort();
      at += w.size();
    }
    if (at != text.data() + text.size()) std::abort();
  }
  return 0;
}
