#pragma once
// Pre-tokenizers of byte-level BPE vocabularies: split text into the words BPE merges within,
// exactly as the regular expression of the vocabulary's tokenizer.json / llama.cpp's
// tokenizer.ggml.pre would, but matched by hand (no std::regex) over Unicode categories from a
// generated table (engine/model/unicode_categories.inc).
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/unicode_chars.h"

namespace fathom {

enum class PreTokenizer {
  // GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // StarCoder / SmolLM: every \p{N} character is its own piece first, then the GPT-2 regex.
  kDigitsThenGpt2,
  // Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}
  //          | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // Qwen 2: as Llama 3 with \p{N} (single digits) in place of \p{N}{1,3}.
  kQwen2,
  // Qwen 3.5: as Qwen 2 with combining marks kept with letters and out of the punctuation runs:
  //   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}
  //   | ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kQwen35,
  // GPT-4o / gpt-oss (tiktoken's o200k): case-aware words, each with an optional leading character
  // and an optional contraction after it; upper = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}],
  // lower = [\p{Ll}\p{Lm}\p{Lo}\p{M}]:
  //   [^\r\n\p{L}\p{N}]?upper*lower+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
  //   |[^\r\n\p{L}\p{N}]?upper+lower*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
  //   |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kGpt4o,
  // The rest are sequences of regexes, each splitting every piece the previous one produced (the
  // matches and the text between them both kept, HF's Split "isolated"):
  // DeepSeek LLM: [\r\n], \s?<cased letters>+, \s?[!-/:-~！-／：-～‘-‟　-。]+, \s+$,
  //               [一-龥ࠀ-一가-퟿]+, \p{N}+
  kDeepseekLlm,
  // DeepSeek Coder: [\r\n], \s?\p{L}+, \s?\p{P}+, [一-龥ࠀ-一가-퟿]+, \p{N}
  kDeepseekCoder,
  // DeepSeek V3: \p{N}{1,3}, [一-龥぀-ゟ゠-ヿ]+, then
  //   [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
  //   | ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kDeepseekV3,
  // Falcon: [\p{P}\$\+<=>\^~\|`]+ (HF's Punctuation), the GPT-2 regex, [0-9][0-9][0-9]
  kFalcon,
};

// The pre-tokenizer for a tokenizer.ggml.pre value; fathom::Error for one we do not implement
// (guessing would silently produce token ids the model was not trained on).
PreTokenizer pre_tokenizer_for(const std::string& pre_name);

// Appends the words of `text` to `words` (views into `text`, in order, covering it exactly).
void pre_tokenize(PreTokenizer kind, std::string_view text, std::vector<std::string_view>& words);

}  // namespace fathom
