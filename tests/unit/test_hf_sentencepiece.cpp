// SentencePiece-style tokenizer.json -> libsentencepiece scores (engine/model/hf_sentencepiece.h):
// the score formula, and each merge list libsentencepiece could not follow, refused by name. The
// tokenization itself is compared with `tokenizers` in tests/e2e/test_hf_sp_tokenizer.py.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/error.h"
#include "engine/model/hf_sentencepiece.h"

namespace fathom::hf {
namespace {

// Tokens: a b c ab bc abc (normal), <s> (control), d (user-defined).
const std::vector<std::string> kTokens = {"a", "b", "c", "ab", "bc", "abc", "<s>", "d"};
const std::vector<int32_t> kTypes = {1, 1, 1, 1, 1, 1, 3, 4};

std::string refusal(const Json& merges, std::vector<std::string> tokens = kTokens,
                    std::vector<int32_t> types = kTypes) {
  try {
    spm_scores(Reader("tokenizer.json"), merges, tokens, types);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(HfSentencePiece, ScoresAreMinusOnePlusTheFirstRankMakingTheToken) {
  const Json merges = Json::parse(R"([["a", "b"], ["b", "c"], ["ab", "c"], ["a", "bc"]])");
  const std::vector<float> s = spm_scores(Reader("tokenizer.json"), merges, kTokens, kTypes);
  EXPECT_EQ(s, (std::vector<float>{0, 0, 0, -1, -2, -3, 0, 0}));
  // "left right" strings read as [left, right].
  EXPECT_EQ(spm_scores(Reader("t"), Json::parse(R"(["a b", "b c", "ab c", "a bc"])"), kTokens, kTypes), s);
}

TEST(HfSentencePiece, RefusesMergesLibsentencepieceWouldApplyDifferently) {
  // abc's two merges with bc's between them: libsentencepiece ranks by the token made.
  EXPECT_NE(refusal(Json::parse(R"([["a", "b"], ["ab", "c"], ["b", "c"], ["a", "bc"]])")).find("not consecutive"),
            std::string::npos);
  // a + bc makes abc but is not listed: libsentencepiece would merge it anyway.
  EXPECT_NE(refusal(Json::parse(R"([["a", "b"], ["b", "c"], ["ab", "c"]])")).find("merges lacks that pair"),
            std::string::npos);
  // A token holding a character that is no token: tokenizers falls back to bytes first.
  EXPECT_NE(refusal(Json::parse(R"([["a", "b"], ["b", "c"], ["ab", "c"], ["a", "bc"]])"),
                    {"a", "b", "c", "ab", "bc", "abc", "<s>", "d", "xa"}, {1, 1, 1, 1, 1, 1, 3, 4, 1})
                .find("holds the character 'x'"),
            std::string::npos);
  // A merge making a byte token, or naming no token.
  EXPECT_NE(refusal(Json::parse(R"([["a", "b"]])"), kTokens, {1, 1, 1, 6, 1, 1, 3, 4}).find("a byte or unused token"),
            std::string::npos);
  EXPECT_NE(refusal(Json::parse(R"([["a", "q"]])")).find("'q' is not a token"), std::string::npos);
  EXPECT_NE(refusal(Json::parse(R"([["a b"]])")).find("is neither"), std::string::npos);
}

TEST(HfSentencePiece, AMergeMakingAControlTokenIsKept) {
  // "<s>" from "<" + "s>": libsentencepiece never makes control tokens from text (documented).
  const std::vector<std::string> tokens = {"<", "s", ">", "s>", "<s>"};
  const std::vector<float> s =
      spm_scores(Reader("t"), Json::parse(R"([["s", ">"], ["<", "s>"]])"), tokens, {1, 1, 1, 1, 3});
  EXPECT_EQ(s, (std::vector<float>{0, 0, 0, -1, -2}));
}

}  // namespace
}  // namespace fathom::hf
