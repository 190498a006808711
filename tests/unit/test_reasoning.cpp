// A reasoning model's output split into reasoning_content and content (server/reasoning.h), whole
// and streamed in every cut: the pieces always add up to the whole split. And the thinking span an
// output constraint leaves free (engine/constraint/grammar.h ConstraintMatcher with a ThinkingSpan).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/constraint/grammar.h"
#include "engine/model/model.h"
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

// The gate is about token ids: SmolLM2's <|im_start|> and <|im_end|> stand in for <think> and
// </think>; the grammar allows "yes" or "no".
class ThinkingGate : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::load(std::string(FATHOM_MODELS_DIR) + "/smollm2-135m-instruct-q4_1.gguf").release();
    compiler_ = new ConstraintCompiler(model_->tokenizer(), model_->vocab());
    compiled_ = compiler_->compile({OutputConstraint::Kind::kGrammar, R"(root ::= "yes" | "no")", true});
  }
  static void TearDownTestSuite() {
    compiled_.reset();
    delete compiler_;
    delete model_;
  }
  // The tokens the matcher allows next.
  static std::vector<int32_t> allowed(ConstraintMatcher& m) {
    std::vector<float> logits(model_->vocab(), 0.0f);
    m.mask_logits(logits.data(), model_->vocab());
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < model_->vocab(); ++i)
      if (!std::isinf(logits[i])) ids.push_back(i);
    return ids;
  }
  static bool allows(ConstraintMatcher& m, int32_t id) {
    const std::vector<int32_t> a = allowed(m);
    return std::find(a.begin(), a.end(), id) != a.end();
  }
  int32_t id(const std::string& text) const { return model_->tokenizer().token_id(text); }

  static Model* model_;
  static ConstraintCompiler* compiler_;
  static std::shared_ptr<const CompiledConstraint> compiled_;
};
Model* ThinkingGate::model_ = nullptr;
ConstraintCompiler* ThinkingGate::compiler_ = nullptr;
std::shared_ptr<const CompiledConstraint> ThinkingGate::compiled_;

TEST_F(ThinkingGate, WithoutASpanTheGrammarStartsAtOnce) {
  ConstraintMatcher m(compiled_);
  EXPECT_FALSE(allows(m, id("<|im_start|>")));
  EXPECT_TRUE(allows(m, id("yes")));
  EXPECT_LT(allowed(m).size(), 10u);
}

TEST_F(ThinkingGate, AnOutputMayOpenTheSpanFirstThenThinksFreelyUntilItCloses) {
  const int32_t open = id("<|im_start|>"), close = id("<|im_end|>");
  ConstraintMatcher m(compiled_, ThinkingSpan{open, close, false, {}, {}});
  EXPECT_TRUE(allows(m, open)) << "the span may open first";
  EXPECT_TRUE(allows(m, id("yes"))) << "or the answer start at once";
  EXPECT_FALSE(allows(m, id("maybe")));
  ASSERT_TRUE(m.accept(open));
  EXPECT_TRUE(m.thinking());
  EXPECT_EQ(allowed(m).size(), static_cast<size_t>(model_->vocab())) << "thinking is free";
  ASSERT_TRUE(m.accept(id("maybe")));
  ASSERT_TRUE(m.accept(open));  // inside, the open token is just a token
  EXPECT_FALSE(m.complete());
  ASSERT_TRUE(m.accept(close));
  EXPECT_FALSE(m.thinking());
  EXPECT_FALSE(allows(m, id("maybe"))) << "after </think> the grammar holds";
  EXPECT_FALSE(allows(m, open)) << "and the span cannot open again";
  ASSERT_TRUE(m.accept(id("no")));
  EXPECT_FALSE(allows(m, id("yes"))) << "the grammar matched: only a stop token may follow";
}

TEST_F(ThinkingGate, AnAnswerThatStartsAtOnceCannotOpenTheSpanLater) {
  const int32_t open = id("<|im_start|>"), close = id("<|im_end|>");
  ConstraintMatcher m(compiled_, ThinkingSpan{open, close, false, {}, {}});
  ASSERT_TRUE(m.accept(id("y")));
  EXPECT_FALSE(allows(m, open));
  EXPECT_FALSE(m.thinking());
}

TEST_F(ThinkingGate, APromptThatLeftTheSpanOpenStartsInsideIt) {
  const int32_t close = id("<|im_end|>");
  ConstraintMatcher m(compiled_, ThinkingSpan{-1, close, true, {}, {}});
  EXPECT_TRUE(m.thinking());
  EXPECT_TRUE(allows(m, id("maybe")));
  ASSERT_TRUE(m.accept(id("maybe")));
  ASSERT_TRUE(m.accept(close));
  EXPECT_TRUE(allows(m, id("yes")));
  EXPECT_FALSE(allows(m, id("maybe")));
}

TEST(ThinkingSpanOf, NeedsTheClosingTagAsOneToken) {
  const std::unique_ptr<Model> smol = Model::load(std::string(FATHOM_MODELS_DIR) + "/smollm2-135m-instruct-q4_1.gguf");
  // SmolLM2's vocabulary has no <think> tokens: no span (the grammar applies from the first token).
  EXPECT_EQ(thinking_span(ReasoningMode{true, false}, smol->tokenizer()).end, -1);
  EXPECT_EQ(thinking_span(ReasoningMode{false, false}, smol->tokenizer()).end, -1);
}

}  // namespace
}  // namespace fathom
