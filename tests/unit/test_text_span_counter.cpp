// TextSpanCounter (engine/text_span_counter.h): the tokens of text-marked spans, however the
// markers are split over tokens.
#include "engine/text_span_counter.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace fathom {
namespace {

// The count after each token, summed.
int32_t count(const std::vector<std::string>& tokens) {
  TextSpanCounter c("<|channel|>analysis", "<|end|>");
  int32_t n = 0;
  for (const std::string& t : tokens) n += c.push(t);
  return n;
}

TEST(TextSpanCounter, SingleTokenMarkersCountTheSpanWithThem) {
  // gpt-oss's vocabulary: the markers are control tokens, "analysis" a word.
  EXPECT_EQ(count({"<|channel|>", "analysis", "<|message|>", "Hm", ".", "<|end|>", "<|start|>", "assistant",
                   "<|channel|>", "final", "<|message|>", "Paris"}),
            6);
}

TEST(TextSpanCounter, MarkersSplitOverTextTokensCountEveryTokenTheyTouch) {
  // Another vocabulary: "<|" starts the opening marker in a token that also holds "x" before it.
  EXPECT_EQ(count({"x<|", "channel", "|>", "analy", "sis<|message|>", "Easy", ".<", "|end", "|><|start|>", "assistant"}), 9);
  // The span opens and closes inside one token, and a later one opens and stays open.
  EXPECT_EQ(count({"a<|channel|>analysis<|message|>b<|end|>c", "d", "<|channel|>analysis", "e"}), 3);
}

TEST(TextSpanCounter, WithoutTheOpeningMarkerNothingCounts) {
  EXPECT_EQ(count({"<|channel|>", "final", "<|message|>", "<|end|>", "analysis", "<|channel|>anal"}), 0);
  EXPECT_EQ(count({"", "<|chan", "", "nel|>analysis", "", "<|end|>"}), 5) << "empty pieces between markers are inside";
}

TEST(TextSpanCounter, TheWindowStaysBoundedOverALongSpan) {
  TextSpanCounter c("<|channel|>analysis", "<|end|>");
  EXPECT_EQ(c.push("<|channel|>analysis"), 1);
  for (int i = 0; i < 100000; ++i) ASSERT_EQ(c.push("word "), 1);
  EXPECT_TRUE(c.inside());
  EXPECT_EQ(c.push("<|end|>"), 1);
  EXPECT_FALSE(c.inside());
}

}  // namespace
}  // namespace fathom
