// Limits the request parsers apply for the operator: client priorities are off unless
// limits.max_priority allows them, and then clamped (HTTP's "fathom.priority"; gRPC's priority
// goes through the same client_priority).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/model/model.h"
#include "server/bounded_json.h"
#include "server/config.h"
#include "server/embeddings.h"
#include "server/openai_request.h"
#include "server/responses_api.h"

namespace fathom {
namespace {

TEST(RequestLimits, ClientPriorityIsOffByDefaultAndClampedWhenAllowed) {
  const std::unique_ptr<Model> model = Model::load(std::string(FATHOM_MODELS_DIR) + "/smollm2-135m-instruct-q4_1.gguf");
  ServerConfig config;
  auto priority_of = [&](int64_t asked) {
    const nlohmann::json body = {{"prompt", "hi"}, {"max_tokens", 2}, {"fathom", {{"priority", asked}}}};
    return parse_completion_request(body, *model, config).engine.priority;
  };
  EXPECT_EQ(config.max_priority, 0);
  EXPECT_EQ(priority_of(1000000), 0) << "a client jumped the queue on a server that does not allow it";
  EXPECT_EQ(priority_of(-5), 0);
  config.max_priority = 10;
  EXPECT_EQ(priority_of(3), 3);
  EXPECT_EQ(priority_of(11), 10);
  EXPECT_EQ(priority_of(-1000000), -10);
  EXPECT_EQ(client_priority(int64_t{1} << 40, config), 10);
  EXPECT_THROW(priority_of(1000001), std::exception) << "out of the accepted range: 400";
  EXPECT_EQ(parse_server_config(R"({"limits": {"max_priority": 7}})", "test").max_priority, 7);
  EXPECT_THROW(parse_server_config(R"({"limits": {"max_priority": -1}})", "test"), std::exception);
}

TEST(RequestLimits, UnknownFieldsAreRejectedUnlessTheOperatorSaysIgnore) {
  const std::unique_ptr<Model> model = Model::load(std::string(FATHOM_MODELS_DIR) + "/smollm2-135m-instruct-q4_1.gguf");
  const nlohmann::json body = {{"prompt", "hi"}, {"max_tokens", 2}, {"max_tokns", 9}};
  ServerConfig config;
  try {
    (void)parse_completion_request(body, *model, config);
    ADD_FAILURE() << "an unknown field was accepted by default";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param, "max_tokns");
    EXPECT_EQ(e.status, 400);
  }
  config = parse_server_config(R"({"http": {"unknown_fields": "ignore"}})", "test");
  EXPECT_FALSE(config.reject_unknown_fields);
  EXPECT_EQ(parse_completion_request(body, *model, config).engine.max_tokens, 2);
  EXPECT_THROW(parse_server_config(R"({"http": {"unknown_fields": "maybe"}})", "test"), std::exception);
}

// Ordered parses (tools and call arguments as the client wrote them) cap the keys of a stored
// object: an ordered object's inserts are linear searches, so n keys cost n^2/2 comparisons.
TEST(RequestLimits, OrderedJsonKeepsKeyOrderAndCapsKeysPerObject) {
  auto object_of = [](size_t keys, const char* prefix) {
    std::string s = "{";
    for (size_t i = 0; i < keys; ++i) s += (i ? ",\"" : "\"") + std::string(prefix) + std::to_string(i) + "\":0";
    return s + "}";
  };
  const nlohmann::ordered_json j = parse_bounded_ordered_json(R"({"b": 1, "a": {"z": 1, "y": 2}})");
  EXPECT_EQ(j.dump(), R"({"b":1,"a":{"z":1,"y":2}})");
  EXPECT_FALSE(parse_bounded_ordered_json(object_of(kMaxOrderedKeys, "k")).is_discarded());
  EXPECT_TRUE(parse_bounded_ordered_json(object_of(kMaxOrderedKeys + 1, "k")).is_discarded());
  EXPECT_TRUE(parse_bounded_ordered_json("{\"t\": [" + object_of(kMaxOrderedKeys + 1, "k") + "]}").is_discarded());
  EXPECT_TRUE(parse_bounded_ordered_json(std::string(100, '[') + std::string(100, ']')).is_discarded());
  // Only "tools" is kept: a large object elsewhere (a logit_bias) is skipped, not stored or counted.
  const nlohmann::ordered_json t = parse_bounded_ordered_json(
      "{\"logit_bias\": " + object_of(1000, "") + ", \"tools\": [{\"b\": 1, \"a\": 2}], \"n\": 1}", "tools");
  ASSERT_FALSE(t.is_discarded());
  EXPECT_EQ(t.dump(), R"({"tools":[{"b":1,"a":2}]})");
}

// /v1/responses' tools reach a template that prints them (Qwen 2.5's) in the client's key order,
// as chat's do: the same tools in both shapes give the same prompt, and a key-sorted rendering
// would not.
TEST(RequestLimits, ResponsesToolsKeepTheClientsKeyOrder) {
  const std::unique_ptr<Model> model =
      Model::load(std::string(FATHOM_MODELS_DIR) + "/smollm2-135m-instruct-q4_1.gguf",
                  std::string(FATHOM_SOURCE_DIR) + "/tests/fixtures/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja");
  ServerConfig config;
  const std::string params = R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})";
  const std::string responses = R"({"input": "Weather?", "tools": [{"type": "function", "name": "get_weather",
      "description": "The weather.", "parameters": )" + params + "}]}";
  const std::string chat = R"({"messages": [{"role": "user", "content": "Weather?"}], "tools": [{"type": "function",
      "function": {"name": "get_weather", "description": "The weather.", "parameters": )" + params + "}}]}";
  const auto r = parse_responses_request(nlohmann::json::parse(responses), *model, config, responses);
  const auto c = parse_chat_request(nlohmann::json::parse(chat), *model, config, chat);
  EXPECT_EQ(r.engine.prompt, c.engine.prompt);
  const auto sorted = parse_responses_request(nlohmann::json::parse(responses), *model, config);
  EXPECT_NE(sorted.engine.prompt, c.engine.prompt) << "the test cannot tell the orders apart";
}

// OpenAI's base64 encoding_format: float32 bytes, little-endian (expected strings from Python's
// base64.b64encode(struct.pack("<nf", ...))), padding included.
TEST(RequestLimits, EmbeddingsBase64IsLittleEndianFloat32) {
  EXPECT_EQ(base64_floats({1.0f, -2.5f}), "AACAPwAAIMA=");
  EXPECT_EQ(base64_floats({0.1f, 1e-30f, 3.4e38f}), "zczMPWBCog2eyX9/");
  EXPECT_EQ(base64_floats({}), "");
}

}  // namespace
}  // namespace fathom
