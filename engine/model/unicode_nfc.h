#pragma once
// Unicode Normalization Form C (UAX #15), as tokenizers' NFC normalizer applies it (Qwen 2/3's
// tokenizer.json): canonical decomposition, canonical ordering, canonical composition. Tables from
// unicode_nfc.inc (scripts/gen_unicode_nfc.py); Hangul by rule.
#include <string>
#include <string_view>

namespace fathom {

// `text` in NFC. Text that is not valid UTF-8 is returned unchanged (a tokenizer's input from a
// request always is valid); ASCII is returned as is without decoding.
std::string nfc(std::string_view text);

}  // namespace fathom
