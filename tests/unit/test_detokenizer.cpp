// Incremental detokenization on the two default vocabularies: text held back until a UTF-8
// character completes, never invalid output, and the pieces always concatenate to decode().
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "engine/model/gguf.h"
#include "engine/model/tokenizer.h"
#include "engine/text_stream.h"

namespace fathom {
namespace {

const Tokenizer& load(const std::string& file) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& t = cache[file];
  if (!t) t = Tokenizer::from_gguf(*GgufFile::open(std::string(FATHOM_MODELS_DIR) + "/" + file));
  return *t;
}
const Tokenizer& smollm() { return load("smollm2-135m-instruct-q4_1.gguf"); }
const Tokenizer& gemma() { return load("gemma-3-270m-q4_k_m.gguf"); }

// Strict UTF-8 (no overlongs, surrogates or values past U+10FFFF), written independently of the
// tokenizer's own validator.
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t cp;
    if (b < 0x80) n = 1, cp = b;
    else if ((b & 0xE0) == 0xC0) n = 2, cp = b & 0x1F;
    else if ((b & 0xF0) == 0xE0) n = 3, cp = b & 0x0F;
    else if ((b & 0xF8) == 0xF0) n = 4, cp = b & 0x07;
    else return false;
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

// Token whose bytes are exactly the single byte b (byte-alphabet token or <0xAB>).
std::map<int, int32_t> single_byte_tokens(const Tokenizer& tok) {
  std::map<int, int32_t> by_byte;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    const std::string b = tok.token_bytes(id);
    if (b.size() == 1 && !by_byte.count(static_cast<unsigned char>(b[0]))) by_byte[static_cast<unsigned char>(b[0])] = id;
  }
  return by_byte;
}

// Streams `ids`; checks every piece is valid UTF-8 and the whole equals decode(ids).
std::string stream_and_check(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  IncrementalDetokenizer detok(tok);
  std::string all;
  for (int32_t id : ids) {
    const std::string piece = detok.push(id);
    EXPECT_TRUE(valid_utf8(piece)) << "invalid UTF-8 piece after token " << id;
    all += piece;
  }
  const std::string tail = detok.flush();
  EXPECT_TRUE(valid_utf8(tail));
  all += tail;
  EXPECT_EQ(all, tok.decode(ids));
  EXPECT_TRUE(valid_utf8(tok.decode(ids)));
  return all;
}

void check_text(const Tokenizer& tok, const std::string& text) {
  const auto ids = tok.encode(text, EncodeOptions{/*add_bos=*/false, /*parse_special=*/false});
  int partial = 0;  // tokens that end in the middle of a character: the hold-back path runs
  for (int32_t id : ids) partial += !valid_utf8(tok.token_bytes(id));
  EXPECT_GT(partial, 0) << "no token split a character; the test would not exercise hold-back";
  EXPECT_EQ(stream_and_check(tok, ids), text);
}

const std::string kEmoji = "family 👨‍👩‍👧‍👦, flag 🏳️‍🌈, coder 🧑🏿‍💻, rare 𠀀𪚥 🫨 𝔘𝔫𝔦 done";

TEST(Detokenizer, EmojiAcrossByteLevelTokens) { check_text(smollm(), kEmoji); }

TEST(Detokenizer, EmojiAcrossSentencePieceByteFallback) { check_text(gemma(), kEmoji); }

TEST(Detokenizer, HoldsBackUntilTheCharacterCompletes) {
  for (const Tokenizer* tok : {&smollm(), &gemma()}) {
    const auto byte = single_byte_tokens(*tok);
    IncrementalDetokenizer detok(*tok);
    EXPECT_EQ(detok.push(byte.at(0xF0)), "");
    EXPECT_EQ(detok.push(byte.at(0x9F)), "");
    EXPECT_EQ(detok.push(byte.at(0x98)), "");
    EXPECT_EQ(detok.push(byte.at(0x80)), "\xF0\x9F\x98\x80");  // U+1F600
    EXPECT_EQ(detok.push(byte.at('a')), "a");
    EXPECT_EQ(detok.flush(), "");
  }
}

TEST(Detokenizer, InvalidBytesBecomeReplacementCharacters) {
  const Tokenizer& tok = gemma();  // it has all 256 byte tokens (SmolLM2 lacks 0xFF, among others)
  const auto byte = single_byte_tokens(tok);
  const std::string fffd = "\xEF\xBF\xBD";
  IncrementalDetokenizer detok(tok);
  EXPECT_EQ(detok.push(byte.at(0xFF)), fffd);       // never valid
  EXPECT_EQ(detok.push(byte.at(0x80)), fffd);       // stray continuation byte
  EXPECT_EQ(detok.push(byte.at(0xE2)), "");         // may still complete
  EXPECT_EQ(detok.push(byte.at('A')), fffd + "A");  // did not
  EXPECT_EQ(detok.push(byte.at(0xE2)), "");
  EXPECT_EQ(detok.push(byte.at(0x82)), "");
  EXPECT_EQ(detok.flush(), fffd);  // one U+FFFD for the unfinished character, as Python's "replace"
  const std::vector<int32_t> ids = {byte.at(0xFF), byte.at(0x80), byte.at(0xE2), byte.at('A'), byte.at(0xE2),
                                    byte.at(0x82)};
  EXPECT_EQ(tok.decode(ids), fffd + fffd + fffd + "A" + fffd);
}

TEST(Detokenizer, RandomByteSequencesMatchDecode) {
  std::mt19937 rng(1234);
  for (const Tokenizer* tok : {&smollm(), &gemma()}) {
    const auto byte = single_byte_tokens(*tok);
    ASSERT_GE(byte.size(), 235u);  // Gemma has all 256; SmolLM2's vocabulary lacks 21 bytes
    std::vector<int32_t> all_bytes;
    for (const auto& [b, id] : byte) all_bytes.push_back(id);
    // Bytes biased towards UTF-8 structure, so that valid characters, truncations and
    // invalid continuations all occur; mixed with ordinary tokens.
    std::vector<int32_t> interesting;
    for (int b : {0x41, 0x20, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xF0, 0x9F, 0x98, 0x80, 0xED, 0xA0, 0xF4, 0x90, 0xC0,
                  0xFF, 0xBF})
      if (byte.count(b)) interesting.push_back(byte.at(b));
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<int32_t> ids;
      const int n = 1 + static_cast<int>(rng() % 24);
      for (int k = 0; k < n; ++k) {
        const uint32_t r = rng() % 10;
        if (r < 6) ids.push_back(interesting[rng() % interesting.size()]);
        else if (r < 8) ids.push_back(all_bytes[rng() % all_bytes.size()]);
        else ids.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(tok->vocab_size())));
      }
      stream_and_check(*tok, ids);
    }
  }
}

TEST(Detokenizer, ControlTokensProduceNoText) {
  const Tokenizer& tok = gemma();
  ASSERT_TRUE(tok.is_control(tok.bos_id()));
  IncrementalDetokenizer detok(tok);
  EXPECT_EQ(detok.push(tok.bos_id()), "");
  EXPECT_EQ(detok.push(tok.token_id("<start_of_turn>")), "");
  EXPECT_EQ(tok.decode({tok.bos_id(), tok.token_id("<end_of_turn>")}), "");
}

// A tool format's markers are control tokens (Mistral's [TOOL_CALLS]); a stream told to show them
// emits their text in place, so the server can parse the call. <start_of_turn> stands in here.
TEST(Detokenizer, ShownControlTokensKeepTheirText) {
  const Tokenizer& tok = gemma();
  const int32_t marker = tok.token_id("<start_of_turn>");
  ASSERT_TRUE(tok.is_control(marker));
  const std::vector<int32_t> ids = tok.encode("Sure, café", EncodeOptions{false});
  TextStream shown(tok, {}, {marker}), hidden(tok, {});
  std::string with, without;
  for (TextStream* s : {&shown, &hidden}) {
    std::string& out = s == &shown ? with : without;
    for (int32_t id : ids) out += s->push(id).text;
    out += s->push(marker).text;
    out += s->push(tok.bos_id()).text;  // not shown: still nothing
    out += s->finish();
  }
  EXPECT_EQ(without, "Sure, café");
  EXPECT_EQ(with, "Sure, café<start_of_turn>");
}

TEST(Tokenizer, EndOfGenerationIds) {
  const Tokenizer& s = smollm();
  EXPECT_TRUE(s.is_end_of_generation(s.eos_id()));
  EXPECT_TRUE(s.is_end_of_generation(s.token_id("<|im_end|>")));
  EXPECT_TRUE(s.is_end_of_generation(s.token_id("<|endoftext|>")));
  EXPECT_FALSE(s.is_end_of_generation(s.token_id("<|im_start|>")));
  const Tokenizer& g = gemma();
  EXPECT_TRUE(g.is_end_of_generation(g.eos_id()));
  EXPECT_TRUE(g.is_end_of_generation(g.token_id("<end_of_turn>")));
  EXPECT_FALSE(g.is_end_of_generation(g.token_id("<start_of_turn>")));
}

TEST(Tokenizer, TokenIdByPieceOrText) {
  const Tokenizer& s = smollm();
  EXPECT_EQ(s.token_id("<|im_end|>"), 2);
  EXPECT_GE(s.token_id("Ġthe"), 0);
  EXPECT_EQ(s.token_id(" the"), s.token_id("Ġthe"));  // plain text of exactly one token
  EXPECT_EQ(s.token_id("certainly more than one token here"), -1);
  EXPECT_EQ(s.token_id(""), -1);
  const Tokenizer& g = gemma();
  EXPECT_EQ(g.token_id("<start_of_turn>"), 105);
  EXPECT_EQ(g.token_id(" the"), g.token_id("▁the"));
}

}  // namespace
}  // namespace fathom
