// gpt-oss's harmony format (server/harmony.h): an answer read into reasoning, content and tool
// calls, whole and streamed cut at every byte (the pieces always add up to the whole split);
// malformed answers come back as content; a harmony vocabulary loads as llama.cpp loads it
// (engine/model/tokenizer.h); the named / required tool_choice and response_format constraints
// accept the model's own call and answer forms, markers as single tokens, and nothing else.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/constraint/grammar.h"
#include "engine/model/gguf.h"
#include "engine/model/tokenizer.h"
#include "server/harmony.h"

namespace fathom {
namespace {

ToolPlan weather_tools(ToolPlan::Mode mode = ToolPlan::Mode::kAuto) {
  ToolPlan plan;
  plan.mode = mode;
  plan.format = ToolPlan::Format::kHarmony;
  for (const char* name : {"get_weather", "get_time"})
    plan.tools.push_back({name, "", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}, true});
  if (mode == ToolPlan::Mode::kNamed) plan.named = "get_weather";
  return plan;
}

struct Expected {
  std::string reasoning;
  std::string content;
  std::vector<std::string> calls;  // "name arguments"
};

std::vector<std::string> call_strings(const std::vector<ToolCall>& calls) {
  std::vector<std::string> out;
  for (const ToolCall& c : calls) out.push_back(c.name + " " + c.arguments);
  return out;
}

void add(HarmonyPiece& sum, const HarmonyPiece& p) {
  sum.reasoning += p.reasoning;
  sum.content += p.content;
  sum.calls.insert(sum.calls.end(), p.calls.begin(), p.calls.end());
}

void expect_split(const std::string& text, const Expected& want, FinishReason finish = FinishReason::kStop,
                  const ToolPlan& plan = weather_tools()) {
  const HarmonyPiece whole = split_harmony(text, finish, plan, "call_");
  EXPECT_EQ(whole.reasoning, want.reasoning) << text;
  EXPECT_EQ(whole.content, want.content) << text;
  EXPECT_EQ(call_strings(whole.calls), want.calls) << text;
  for (size_t i = 0; i < whole.calls.size(); ++i) EXPECT_EQ(whole.calls[i].id, "call_" + std::to_string(i));
  // Streamed one byte at a time, and cut in two at every position.
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    HarmonySplit split(plan, "call_");
    HarmonyPiece sum;
    if (cut == 0) {
      for (char c : text) add(sum, split.push(std::string(1, c)));
    } else {
      add(sum, split.push(text.substr(0, cut)));
      add(sum, split.push(text.substr(cut)));
    }
    add(sum, split.finish(finish));
    EXPECT_EQ(sum.reasoning, whole.reasoning) << text << " cut at " << cut;
    EXPECT_EQ(sum.content, whole.content) << text << " cut at " << cut;
    EXPECT_EQ(call_strings(sum.calls), call_strings(whole.calls)) << text << " cut at " << cut;
  }
}

TEST(Harmony, AnalysisThenFinal) {
  expect_split("<|channel|>analysis<|message|>Add them.<|end|><|start|>assistant<|channel|>final<|message|>4",
               {"Add them.", "4", {}});
  expect_split("<|channel|>final<|message|>Just 4.", {"", "Just 4.", {}});
  // <|return|> ends generation, so the text rarely holds it; where it does, it closes the answer.
  expect_split("<|channel|>final<|message|>4<|return|>", {"", "4", {}});
  // The thinking cut by the length limit is all the answer has; so is a thinking followed by a
  // header the limit cut.
  expect_split("<|channel|>analysis<|message|>Let me th", {"Let me th", "", {}}, FinishReason::kLength);
  expect_split("<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>fin", {"Hm.", "", {}},
               FinishReason::kLength);
}

TEST(Harmony, ToolCallsInEveryHeaderForm) {
  const std::vector<std::string> paris = {R"(get_weather {"city": "Paris"})"};
  // OpenAI's guide: recipient after the channel, then <|constrain|>json; the text stops where
  // <|call|> ended generation.
  expect_split(R"(<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"})",
               {"", "", paris});
  // As the template writes past calls: recipient first, bare content type; after an analysis.
  expect_split("<|channel|>analysis<|message|>Need the tool.<|end|><|start|>assistant to=functions.get_weather"
               R"(<|channel|>commentary json<|message|>{"city": "Paris"}<|call|>)",
               {"Need the tool.", "", paris});
  // No content type, and a call in the analysis channel (llama.cpp accepts both).
  expect_split(R"(<|channel|>analysis to=functions.get_weather<|message|> {"city": "Paris"} )", {"", "", paris});
  // A preamble to the user first, then two calls closed by visible markers.
  expect_split("<|channel|>commentary<|message|>Checking.<|end|>"
               R"(<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>)"
               R"(<|start|>assistant<|channel|>commentary to=functions.get_time<|message|>{}<|call|>)",
               {"", "Checking.", {paris[0], "get_time {}"}});
}

TEST(Harmony, MessagesOfOneKindAreJoinedByANewline) {
  expect_split("<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis<|message|>Two.<|end|>"
               "<|start|>assistant<|channel|>commentary<|message|>Hi.<|end|><|start|>assistant<|channel|>final<|message|>Bye.",
               {"One.\nTwo.", "Hi.\nBye.", {}});
  // An empty message adds no newline.
  expect_split("<|channel|>final<|message|><|end|><|start|>assistant<|channel|>final<|message|>x", {"", "x", {}});
}

TEST(Harmony, WhatIsNotHarmonyIsContentAsWritten) {
  expect_split("Hello there.", {"", "Hello there.", {}});
  expect_split("<b>bold</b>", {"", "<b>bold</b>", {}});
  expect_split("", {"", "", {}});
  // A header that never ends, a header with a newline, one with an unknown channel.
  expect_split("<|channel|>final", {"", "<|channel|>final", {}});
  expect_split("<|channel|>final\n<|message|>x", {"", "<|channel|>final\n<|message|>x", {}});
  expect_split("<|channel|>poetry<|message|>roses", {"", "<|channel|>poetry<|message|>roses", {}});
  expect_split("<|start|>user<|message|>hi", {"", "<|start|>user<|message|>hi", {}});
  const std::string long_header = "<|channel|>final " + std::string(HarmonySplit::kMaxHeader, 'x') + "<|message|>y";
  expect_split(long_header, {"", long_header, {}});
  // Text after a message that does not start another: content, after a newline.
  expect_split("<|channel|>final<|message|>a<|end|>b", {"", "a\nb", {}});
}

TEST(Harmony, InvalidCallsAreContentAsWritten) {
  const std::string header = "<|channel|>commentary to=functions.";
  // A function not offered, arguments that are not an object, not JSON, or cut by the length limit.
  for (const std::string& call : {header + R"(get_stock<|message|>{"city": "Paris"})", header + "get_weather<|message|>[1]",
                                  header + R"(get_weather<|message|>{"city": )", header + "browser.search<|message|>{}",
                                  std::string(" to=python<|channel|>analysis code<|message|>print(1)")})
    expect_split(call, {"", call, {}});
  expect_split(header + R"(get_weather<|message|>{"city": "Pa)", {"", header + R"(get_weather<|message|>{"city": "Pa)", {}},
               FinishReason::kLength);
  // A call completed by its marker stands even when the length limit cut what followed.
  expect_split(header + "get_time<|message|>{}<|call|><|start|>assistant<|channel|>final<|message|>and", {"", "and", {"get_time {}"}},
               FinishReason::kLength);
  // No tools offered (or tool_choice none): every call is content.
  ToolPlan none;
  none.format = ToolPlan::Format::kHarmony;
  expect_split(header + "get_weather<|message|>{}", {"", header + "get_weather<|message|>{}", {}}, FinishReason::kStop, none);
}

// Random texts made of markers, pieces of markers and words, cut at random places: the stream
// always adds up to the whole split, and nothing throws.
TEST(Harmony, AnyTextStreamsAsItSplitsWhole) {
  const std::vector<std::string> parts = {"<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|call|>", "<|return|>",
                                          "<|constrain|>", "assistant", "analysis", "final", "commentary", " to=",
                                          "functions.get_weather", "json", " ", "\n", "{\"city\": \"Paris\"}", "{", "<|",
                                          "|>", "<|chan", "x", "\xE2\x82", "\xAC"};
  std::mt19937 rng(47);
  const ToolPlan plan = weather_tools();
  for (int round = 0; round < 3000; ++round) {
    std::string text;
    const int n = static_cast<int>(rng() % 12);
    for (int i = 0; i < n; ++i) text += parts[rng() % parts.size()];
    const FinishReason finish = rng() % 2 ? FinishReason::kStop : FinishReason::kLength;
    const HarmonyPiece whole = split_harmony(text, finish, plan, "c");
    HarmonySplit split(plan, "c");
    HarmonyPiece sum;
    for (size_t at = 0; at < text.size();) {
      const size_t len = 1 + rng() % 7;
      add(sum, split.push(text.substr(at, len)));
      at += len;
    }
    add(sum, split.finish(finish));
    ASSERT_EQ(sum.reasoning, whole.reasoning) << text;
    ASSERT_EQ(sum.content, whole.content) << text;
    ASSERT_EQ(call_strings(sum.calls), call_strings(whole.calls)) << text;
  }
}

// ---- a harmony vocabulary ----------------------------------------------------------------------

// GPT-2's byte-level alphabet: the vocabulary piece of byte b.
std::string byte_piece(int b) {
  const bool direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  int cp = b;
  if (!direct) {
    cp = 256;
    for (int x = 0; x < b; ++x)
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++cp;
  }
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// 256 byte tokens and o200k_harmony's special tokens, typed as its GGUF types them (control).
std::unique_ptr<Tokenizer> harmony_tokenizer(std::unique_ptr<GgufFile>& file) {
  auto strings = std::make_shared<GgufArray>(GgufArray{GgufValueType::STRING, {}});
  auto types = std::make_shared<GgufArray>(GgufArray{GgufValueType::INT32, {}});
  for (int b = 0; b < 256; ++b) {
    strings->values.push_back(byte_piece(b));
    types->values.push_back(int32_t{1});
  }
  for (const char* special : {"<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>", "<|end|>",
                              "<|message|>", "<|call|>"}) {
    strings->values.push_back(std::string(special));
    types->values.push_back(int32_t{3});
  }
  std::map<std::string, GgufValue> meta;
  meta["tokenizer.ggml.model"] = std::string("gpt2");
  meta["tokenizer.ggml.tokens"] = strings;
  meta["tokenizer.ggml.token_type"] = types;
  meta["tokenizer.ggml.merges"] = std::make_shared<GgufArray>(GgufArray{GgufValueType::STRING, {}});
  meta["tokenizer.ggml.eos_token_id"] = uint32_t{257};  // <|return|>, as gpt-oss's GGUFs say
  meta["tokenizer.ggml.eot_token_id"] = uint32_t{261};  // <|end|>: not an end here
  file = GgufFile::assemble("harmony-vocab", std::move(meta), {}, {}, {});
  return Tokenizer::from_gguf(*file);
}

class HarmonyVocabulary : public ::testing::Test {
 protected:
  void SetUp() override { tok_ = harmony_tokenizer(file_); }
  int32_t id(const char* piece) const { return tok_->token_id(piece); }
  std::vector<int32_t> encode(const std::string& text) const {
    EncodeOptions opts;
    opts.add_bos = false;
    return tok_->encode(text, opts);
  }
  std::unique_ptr<GgufFile> file_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(HarmonyVocabulary, LoadsAsLlamaCppLoadsIt) {
  ASSERT_TRUE(tok_->harmony());
  for (const char* shown : {"<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>"}) {
    EXPECT_FALSE(tok_->is_control(id(shown))) << shown;
    EXPECT_EQ(tok_->token_bytes(id(shown)), shown) << "the output text shows " << shown;
  }
  for (const char* end : {"<|return|>", "<|call|>", "<|endoftext|>"}) EXPECT_TRUE(tok_->is_end_of_generation(id(end))) << end;
  EXPECT_FALSE(tok_->is_end_of_generation(id("<|end|>"))) << "<|end|> closes one message of several";
  // Markers are recognised in text as one token each.
  std::vector<int32_t> want = {id("<|channel|>")};
  for (char c : std::string("final")) want.push_back(encode(std::string(1, c))[0]);
  want.push_back(id("<|message|>"));
  EXPECT_EQ(encode("<|channel|>final<|message|>"), want);
}

// The token sequence of `text`: markers as their single tokens, the rest byte by byte.
bool accepts(ConstraintMatcher& m, const std::vector<int32_t>& ids) {
  for (int32_t t : ids)
    if (!m.accept(t)) return false;
  return true;
}

TEST_F(HarmonyVocabulary, NamedAndRequiredCallsAreConstrainedToTheModelsOwnForms) {
  ConstraintCompiler compiler(*tok_, tok_->vocab_size());
  const auto named = compiler.compile(harmony_tool_constraint(weather_tools(ToolPlan::Mode::kNamed)));
  const auto required = compiler.compile(harmony_tool_constraint(weather_tools(ToolPlan::Mode::kRequired)));
  const std::string analysis = "<|channel|>analysis<|message|>Use <the> tool.<|end|><|start|>assistant";
  const std::string doc = R"(<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"})";
  const std::string tmpl = R"( to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"})";
  for (const std::string& ok : {doc, tmpl, analysis + doc, analysis + tmpl}) {
    ConstraintMatcher m(named);
    ASSERT_TRUE(accepts(m, encode(ok))) << ok;
    std::vector<float> logits(tok_->vocab_size(), 0.0f);
    m.mask_logits(logits.data(), tok_->vocab_size());
    EXPECT_FALSE(std::isinf(logits[id("<|call|>")])) << "the call ends with <|call|>";
    EXPECT_TRUE(std::isinf(logits[id("<|channel|>")])) << "and nothing else";
    ASSERT_TRUE(m.accept(id("<|call|>")));
    EXPECT_TRUE(m.complete()) << ok;
  }
  for (const std::string& bad : {std::string("<|channel|>final<|message|>Hi"), std::string("Hi"),
                                 std::string(R"(<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{})"),
                                 std::string("<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>analysis")}) {
    ConstraintMatcher m(named);
    EXPECT_FALSE(accepts(m, encode(bad)) && m.complete()) << bad;
  }
  ConstraintMatcher any(required);
  ASSERT_TRUE(accepts(any, encode(analysis + R"(<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{})")));
  ASSERT_TRUE(any.accept(id("<|call|>")));
  EXPECT_TRUE(any.complete());
  // The markers are single tokens: the constraint allows the vocabulary's <|channel|> first.
  ConstraintMatcher first(named);
  std::vector<float> logits(tok_->vocab_size(), 0.0f);
  first.mask_logits(logits.data(), tok_->vocab_size());
  EXPECT_FALSE(std::isinf(logits[id("<|channel|>")]));
  EXPECT_FALSE(std::isinf(logits[encode(" ")[0]])) << "or the space of ' to=functions.'";
  EXPECT_TRUE(std::isinf(logits[encode("H")[0]]));
}

TEST_F(HarmonyVocabulary, AStructuredAnswerGoesInTheFinalChannel) {
  ConstraintCompiler compiler(*tok_, tok_->vocab_size());
  OutputConstraint schema{OutputConstraint::Kind::kJsonSchema, R"({"type": "object", "properties": {"n": {"type": "integer"}}})", true};
  const auto compiled = compiler.compile(harmony_answer_constraint(schema));
  for (const std::string& ok : {std::string(R"(<|channel|>final<|message|>{"n": 4})"),
                                std::string(R"(<|channel|>analysis<|message|>Four.<|end|><|start|>assistant<|channel|>final<|message|>{"n": 4})")}) {
    ConstraintMatcher m(compiled);
    ASSERT_TRUE(accepts(m, encode(ok))) << ok;
    ASSERT_TRUE(m.accept(id("<|return|>")));
    EXPECT_TRUE(m.complete());
  }
  ConstraintMatcher bare(compiled);
  EXPECT_FALSE(accepts(bare, encode(R"({"n": 4})")));
  // A grammar constrains the whole text: unchanged.
  const OutputConstraint grammar{OutputConstraint::Kind::kGrammar, R"(root ::= "x")", true};
  EXPECT_EQ(harmony_answer_constraint(grammar).kind, OutputConstraint::Kind::kGrammar);
}

}  // namespace
}  // namespace fathom
