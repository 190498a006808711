// Every recursive walk of a client's constraint is bounded: JSON Schema -> grammar (through $ref
// chains), EBNF text, regex patterns, tool-call argument JSON. Each test runs on a thread with a
// 256 KiB stack, so that a missing bound crashes the test instead of passing by luck on an 8 MiB
// one: inputs far past each bound are refused with an error naming it, and the largest input of
// the same shape that a bound lets through compiles there.
#include <gtest/gtest.h>
#include <pthread.h>

#include <cstdio>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "engine/constraint/constraint_bounds.h"
#include "engine/constraint/grammar.h"
#include "engine/model/model.h"
#include "engine/model/tokenizer.h"
#include "server/config.h"
#include "server/openai_request.h"
#include "server/request_rules.h"
#include "server/schema_rules.h"

namespace fathom {
namespace {

using json = nlohmann::json;
constexpr size_t kSmallStack = 256 * 1024;

// Runs `f` on a thread with a 256 KiB stack; returns what it threw ("" when it returned).
std::string on_small_stack(const std::function<void()>& f) {
  struct Job {
    const std::function<void()>* f;
    std::string error;
  } job{&f, {}};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kSmallStack);
  pthread_t thread;
  const int made = pthread_create(
      &thread, &attr,
      [](void* p) -> void* {
        auto* j = static_cast<Job*>(p);
        try {
          (*j->f)();
        } catch (const std::exception& e) {
          j->error = e.what();
          if (j->error.empty()) j->error = "(empty message)";
        }
        return nullptr;
      },
      &job);
  pthread_attr_destroy(&attr);
  EXPECT_EQ(made, 0);
  if (made == 0) pthread_join(thread, nullptr);
  return job.error;
}

class ConstraintBoundsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Model::load(std::string(FATHOM_MODELS_DIR) + "/smollm2-135m-instruct-q4_1.gguf").release();
    compiler_ = new ConstraintCompiler(model_->tokenizer(), model_->vocab());
  }
  static void TearDownTestSuite() {
    delete compiler_;
    delete model_;
  }
  // What compiling `c` on the small stack threw ("" when it compiled).
  static std::string compile(OutputConstraint::Kind kind, const std::string& text) {
    return on_small_stack([&] { compiler_->compile({kind, text, false}); });
  }
  static std::string compile_schema(const json& schema) { return compile(OutputConstraint::Kind::kJsonSchema, schema.dump()); }
  static inline Model* model_ = nullptr;
  static inline ConstraintCompiler* compiler_ = nullptr;
};

// "d<i>", and the $ref naming it (not "d" + std::to_string(i): g++ 12 warns -Wrestrict on it).
std::string def(int i) {
  std::string name = "d";
  name += std::to_string(i);
  return name;
}
std::string ref_to(int i) { return "#/$defs/" + def(i); }

// {"$ref": d0, "$defs": {d_i: {"type": "object", "properties": {"x": {"$ref": d_i+1}}}}}: each
// hop is three JSON levels xgrammar descends; the last def is an integer.
json ref_chain(int hops) {
  json defs = json::object();
  for (int i = 0; i < hops; ++i)
    defs[def(i)] = {{"type", "object"},
                                     {"properties", {{"x", {{"$ref", ref_to(i + 1)}}}}},
                                     {"required", {"x"}}};
  defs[def(hops)] = {{"type", "integer"}};
  return {{"$ref", "#/$defs/d0"}, {"$defs", defs}};
}

// The largest n for which make(n) passes check_schema_bounds (make grows with n).
template <typename Make>
int largest_within_bounds(Make make) {
  int lo = 1, hi = 4096;  // lo passes, hi does not
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    bool ok = true;
    try {
      check_schema_bounds(make(mid));
    } catch (const Error&) {
      ok = false;
    }
    (ok ? lo : hi) = mid;
  }
  return lo;
}

TEST_F(ConstraintBoundsTest, RefChainFarPastTheBoundIsRefused) {
  // The probe's crash: a chain of $refs several thousand deep (~600 KiB, under the body limit).
  const std::string error = compile_schema(ref_chain(5000));
  EXPECT_NE(error.find("levels"), std::string::npos) << error;
  const std::string field = "response_format.json_schema.schema";
  try {
    check_schema_keywords(ref_chain(5000), field);
    ADD_FAILURE() << "the server's check let a 5,000-deep $ref chain through";
  } catch (const RuleError& e) {
    EXPECT_EQ(e.field, field);
    EXPECT_NE(std::string(e.what()).find("$ref"), std::string::npos) << e.what();
  }
}

TEST_F(ConstraintBoundsTest, RefChainAtTheBoundCompilesOnTheSmallStack) {
  const int hops = largest_within_bounds(ref_chain);
  EXPECT_GT(hops, 40) << "a realistic schema must pass";
  EXPECT_EQ(compile_schema(ref_chain(hops)), "") << hops << " hops";
}

TEST_F(ConstraintBoundsTest, BareRefChainAndNestingAtTheBoundCompile) {
  auto bare = [](int hops) {  // d_i = {"$ref": d_i+1}: one level a hop
    json defs = json::object();
    for (int i = 0; i < hops; ++i) defs[def(i)] = {{"$ref", ref_to(i + 1)}};
    defs[def(hops)] = {{"type", "string"}};
    return json{{"$ref", "#/$defs/d0"}, {"$defs", defs}};
  };
  auto nested = [](int levels) {  // objects in objects, no $ref
    json s = {{"type", "integer"}};
    for (int i = 0; i < levels; ++i) s = {{"type", "object"}, {"properties", {{"a", s}}}, {"required", {"a"}}};
    return s;
  };
  auto any_of = [](int levels) {  // anyOf in anyOf
    json s = {{"type", "integer"}};
    for (int i = 0; i < levels; ++i) s = {{"anyOf", {s, {{"type", "null"}}}}};
    return s;
  };
  for (const auto& [name, make] : std::vector<std::pair<std::string, std::function<json(int)>>>{
           {"bare $ref chain", bare}, {"nested objects", nested}, {"nested anyOf", any_of}}) {
    const int n = largest_within_bounds(make);
    EXPECT_EQ(compile_schema(make(n)), "") << name << " at " << n;
    EXPECT_NE(compile_schema(make(4 * n)), "") << name << " at " << 4 * n;
  }
}

TEST_F(ConstraintBoundsTest, RecursiveSchemasStayServable) {
  // A tree (a $ref back to the root) and a small mutually recursive expression grammar: cycles
  // stop xgrammar's descent, so they must not count as depth.
  const json tree = {{"type", "object"},
                     {"properties", {{"name", {{"type", "string"}}}, {"children", {{"type", "array"}, {"items", {{"$ref", "#"}}}}}}},
                     {"required", {"name"}}};
  EXPECT_EQ(compile_schema(tree), "");
  const json expr = {
      {"$ref", "#/$defs/expr"},
      {"$defs",
       {{"expr", {{"anyOf", {{{"$ref", "#/$defs/num"}}, {{"$ref", "#/$defs/binop"}}, {{"$ref", "#/$defs/call"}}}}}},
        {"num", {{"type", "integer"}}},
        {"binop",
         {{"type", "object"},
          {"properties", {{"op", {{"enum", {"+", "*"}}}}, {"l", {{"$ref", "#/$defs/expr"}}}, {"r", {{"$ref", "#/$defs/expr"}}}}},
          {"required", {"op", "l", "r"}}}},
        {"call",
         {{"type", "object"},
          {"properties", {{"f", {{"type", "string"}}}, {"args", {{"type", "array"}, {"items", {{"$ref", "#/$defs/expr"}}}}}}},
          {"required", {"f", "args"}}}}}}};
  EXPECT_EQ(compile_schema(expr), "");
}

TEST_F(ConstraintBoundsTest, RefsWithEmptySegmentsAreRefused) {
  // Two spellings of one target would let a cycle through both escape xgrammar's memo.
  const json schema = {{"$ref", "#/$defs//a"}, {"$defs", {{"a", {{"type", "integer"}}}}}};
  EXPECT_NE(compile_schema(schema).find("empty path segment"), std::string::npos);
  EXPECT_NE(compile_schema({{"$ref", "#/"}}).find("empty path segment"), std::string::npos);
}

TEST_F(ConstraintBoundsTest, RegexAndGrammarNestingAreBounded) {
  auto groups = [](int n) { return std::string(n, '(') + "a" + std::string(n, ')'); };
  const int r = ConstraintBounds::kMaxRegexGroups;
  EXPECT_EQ(regex_group_depth(groups(r)), r);
  EXPECT_EQ(regex_group_depth("\\((a)[(]"), 1) << "escapes and classes are not groups";
  EXPECT_EQ(compile_schema({{"type", "string"}, {"pattern", groups(r)}}), "");
  EXPECT_NE(compile_schema({{"type", "string"}, {"pattern", groups(5000)}}).find("groups"), std::string::npos);
  EXPECT_NE(compile_schema({{"type", "object"}, {"patternProperties", {{groups(5000), {{"type", "integer"}}}}}}), "");

  const int p = ConstraintBounds::kMaxGrammarParens;
  auto parens = [](int n) { return "root ::= " + std::string(n, '(') + "\"a\"" + std::string(n, ')'); };
  EXPECT_EQ(compile(OutputConstraint::Kind::kGrammar, parens(p)), "");
  EXPECT_NE(compile(OutputConstraint::Kind::kGrammar, parens(20000)).find("parentheses"), std::string::npos);
  // A regex macro, spelled with the EBNF string's own escapes for '(' (\x28, \u0028).
  EXPECT_EQ(compile(OutputConstraint::Kind::kGrammar, "root ::= Regex(\"" + groups(r) + "\")"), "");
  EXPECT_NE(compile(OutputConstraint::Kind::kGrammar, "root ::= Regex(\"" + groups(5000) + "\")"), "");
  std::string hex;
  for (int i = 0; i < 5000; ++i) hex += i % 2 ? "\\x28" : "\\u0028";
  EXPECT_NE(compile(OutputConstraint::Kind::kGrammar, "root ::= Regex(\"" + hex + "a" + std::string(5000, ')') + "\")"), "");
  // Parentheses in strings, classes and comments are not grammar nesting.
  EXPECT_EQ(compile(OutputConstraint::Kind::kGrammar, "root ::= \"((((\" [(] # " + std::string(200, '(') + "\n"), "");
}

TEST_F(ConstraintBoundsTest, DeepToolCallArgumentsAreRefused) {
  // Arguments are JSON text inside a JSON string: the body's depth check does not see them.
  ServerConfig config;
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  json body = json::parse(R"({"max_tokens": 2, "messages": [
      {"role": "user", "content": "hi"},
      {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "ok"}]})");
  body["messages"][1]["tool_calls"][0]["function"]["arguments"] = deep;
  const std::string error = on_small_stack([&] { (void)parse_chat_request(body, *model_, config); });
  EXPECT_NE(error.find("64 levels"), std::string::npos) << error;
}

}  // namespace
}  // namespace fathom

namespace fathom {
namespace {

// Compiling is bounded in time for the request, not for the compiler: past the deadline the
// request fails, the compilation goes on and is cached, and a second distinct one past
// max_compiling is refused at once.
TEST_F(ConstraintBoundsTest, ACompilationPastItsDeadlineFailsTheRequestAndIsServedLater) {
  ConstraintCompiler compiler(model_->tokenizer(), model_->vocab(), {std::chrono::milliseconds(20), 1});
  auto fan = [](int n, const std::string& key) {  // anyOf of n one-property objects: ~0.1 s each here
    json s = {{"anyOf", json::array()}};
    for (int i = 0; i < n; ++i)
      s["anyOf"].push_back({{"type", "object"}, {"properties", {{key + def(i), {{"type", "string"}}}}}, {"required", {key + def(i)}}});
    return OutputConstraint{OutputConstraint::Kind::kJsonSchema, s.dump(), false};
  };
  const OutputConstraint slow = fan(6, "a");
  try {
    compiler.compile(slow);
    ADD_FAILURE() << "a compilation of ~0.5 s met a 20 ms deadline";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("did not compile within 20 ms"), std::string::npos) << e.what();
  }
  EXPECT_THROW(compiler.compile(fan(6, "b")), ConstraintQueueFull) << "one compilation at a time was configured";
  std::shared_ptr<const CompiledConstraint> served;
  for (int tries = 0; tries < 1000 && !served; ++tries) {
    try {
      served = compiler.compile(slow);
    } catch (const Error&) {  // still compiling
    }
  }
  EXPECT_NE(served, nullptr) << "the same constraint, sent again, is served once compiled";
}

// The reuse cache is bounded by bytes, whatever number of distinct schemas a client sends, and it
// drops the least recently used first. (Before it, fathom's cache was bounded by count only and
// xgrammar's own cache, unbounded, kept every compiled schema as well.)
TEST_F(ConstraintBoundsTest, TheReuseCacheIsBoundedByBytesAndDropsTheLeastRecentlyUsed) {
  auto schema = [](int i) {  // distinct schemas of one shape, so of about one size
    return OutputConstraint{OutputConstraint::Kind::kJsonSchema,
                            json({{"type", "object"}, {"properties", {{def(i), {{"type", "integer"}}}}}, {"required", {def(i)}}}).dump(),
                            false};
  };
  int64_t one = 0;
  {
    ConstraintCompiler sizing(model_->tokenizer(), model_->vocab());
    sizing.compile(schema(1000));
    one = sizing.cached_bytes();
    std::printf("one compiled schema: %lld bytes\n", static_cast<long long>(one));
  }
  ASSERT_GT(one, 0);
  const int64_t cap = one * 5 / 2;  // room for two
  ConstraintCompiler compiler(model_->tokenizer(), model_->vocab(), {std::chrono::milliseconds(10000), 4, cap});
  const auto first = compiler.compile(schema(0));
  const auto second = compiler.compile(schema(1));
  EXPECT_EQ(compiler.compile(schema(0)), first) << "a cached schema is served from the cache";
  for (int i = 2; i < 8; ++i) {
    compiler.compile(schema(i));
    EXPECT_LE(compiler.cached_bytes(), cap);
    EXPECT_LE(compiler.cached_count(), 2u);
    if (i == 2) {
      EXPECT_EQ(compiler.compile(schema(0)), first) << "used last, so the first is still cached";
    }
  }
  EXPECT_NE(compiler.compile(schema(1)), second) << "evicted long ago: compiled again";
  ConstraintCompiler none(model_->tokenizer(), model_->vocab(), {std::chrono::milliseconds(10000), 4, 0});
  none.compile(schema(0));
  EXPECT_EQ(none.cached_count(), 0u) << "a zero budget keeps nothing";
}

TEST_F(ConstraintBoundsTest, LibraryErrorsCarryNoPathsTimesOrInternals) {
  const std::string error = compile_schema({{"type", "no-such-type"}});
  EXPECT_NE(error, "");
  EXPECT_EQ(error.find(".cc"), std::string::npos) << error;
  EXPECT_EQ(error.find('['), std::string::npos) << error;
  EXPECT_EQ(error.find("/root"), std::string::npos) << error;
}

}  // namespace
}  // namespace fathom
