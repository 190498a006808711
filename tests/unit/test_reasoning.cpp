// A reasoning model's output split into reasoning_content and content (server/reasoning.h), whole
// and streamed in every cut: the pieces always add up to the whole split.
#include <gtest/gtest.h>

#include <string>

#include "server/reasoning.h"

namespace fathom {
namespace {

void expect_split(const std::string& text, bool open, const std::string& reasoning, const std::string& content) {
  const ReasoningPiece whole = split_reasoning(text, open);
  EXPECT_EQ(whole.reasoning, reasoning) << text;
  EXPECT_EQ(whole.content, content) << text;
  // Streamed one byte at a time, and cut in two at every position.
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ReasoningSplit split(open);
    ReasoningPiece sum;
    auto add = [&](const ReasoningPiece& p) {
      sum.reasoning += p.reasoning;
      sum.content += p.content;
    };
    if (cut == 0) {
      for (char c : text) add(split.push(std::string(1, c)));
    } else {
      add(split.push(text.substr(0, cut)));
      add(split.push(text.substr(cut)));
    }
    add(split.finish());
    EXPECT_EQ(sum.reasoning, reasoning) << text << " cut at " << cut;
    EXPECT_EQ(sum.content, content) << text << " cut at " << cut;
  }
}

TEST(Reasoning, ThinkBlockThenAnswer) {
  expect_split("<think>\nLet me add.\n</think>\n\n4", false, "\nLet me add.\n", "4");
  expect_split("  <think>x</think>y", false, "x", "y");
  expect_split("<think></think>\n\nAnswer <think> stays", false, "", "Answer <think> stays");
}

TEST(Reasoning, NoThinkBlockIsAllAnswer) {
  expect_split("4", false, "", "4");
  expect_split("<thin", false, "", "<thin");  // a tag cut short is text
  expect_split("\n", false, "", "\n");
  expect_split("I think </think> not", false, "", "I think </think> not");
}

TEST(Reasoning, PromptOpenedTheBlock) {
  expect_split("Hmm.\n</think>\n\n4", true, "Hmm.\n", "4");
  expect_split("cut short while thinking </thi", true, "cut short while thinking </thi", "");
}

TEST(Reasoning, PromptOpensThinking) {
  EXPECT_TRUE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n"));
  EXPECT_TRUE(prompt_opens_thinking("<think>a</think> b <think>"));
}

}  // namespace
}  // namespace fathom
