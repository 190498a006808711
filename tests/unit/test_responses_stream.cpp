// /v1/responses streamed for a <think> reasoning model (server/responses_api.h): the thinking goes
// out as it is generated, as a reasoning item, and the message follows; the events say what the
// final response says (ids, output indexes, texts), however the text arrives in pieces.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/responses_api.h"

namespace fathom {
namespace {

using json = nlohmann::json;

// The JSON of each "event: …\ndata: …\n\n" frame.
std::vector<json> events_of(const std::vector<std::string>& frames) {
  std::vector<json> out;
  for (const std::string& f : frames) out.push_back(json::parse(f.substr(f.find("\ndata: ") + 7)));
  return out;
}

struct Streamed {
  std::vector<json> live;  // the events sent before the end
  std::vector<json> all;
};

Streamed stream(const std::vector<std::string>& pieces, FinishReason finish, bool opens_thinking = false) {
  ApiRequest req;
  req.responses = json::object();
  req.reasoning.on = true;
  req.reasoning.open = opens_thinking;
  const ResponseMeta meta{"resp_0123abcd", 1, "m", ""};
  ResponsesStream s(req, meta);
  Streamed out;
  auto add = [&](const std::vector<std::string>& frames, bool live) {
    for (const json& e : events_of(frames)) {
      if (live) out.live.push_back(e);
      out.all.push_back(e);
    }
  };
  add(s.begin(), true);
  for (const std::string& p : pieces) add(s.delta(p), true);
  RequestUsage usage;
  usage.completion_tokens = 5;
  add(s.end(finish, usage, ""), false);
  return out;
}

std::vector<std::string> types(const std::vector<json>& events) {
  std::vector<std::string> t;
  for (const json& e : events) t.push_back(e["type"]);
  return t;
}

std::string joined(const std::vector<json>& events, const std::string& type) {
  std::string s;
  for (const json& e : events)
    if (e["type"] == type) s += e["delta"].get<std::string>();
  return s;
}

// Every event's sequence number in order, and every item event's output index and item as the
// final response has them.
void expect_consistent(const std::vector<json>& all) {
  const json& output = all.back()["response"]["output"];
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i]["sequence_number"], static_cast<int64_t>(i));
    if (!all[i].contains("output_index")) continue;
    const size_t at = all[i]["output_index"];
    ASSERT_LT(at, output.size()) << all[i].dump();
    const json& item = output[at];
    if (all[i].contains("item_id")) {
      EXPECT_EQ(all[i]["item_id"], item["id"]) << all[i].dump();
    }
    if (all[i]["type"] == "response.output_item.done") {
      EXPECT_EQ(all[i]["item"], item);
    }
    if (all[i]["type"] == "response.output_item.added") {
      EXPECT_EQ(all[i]["item"]["id"], item["id"]);
    }
  }
}

TEST(ResponsesStream, ThinkingStreamsAsItComesThenTheMessage) {
  const Streamed s = stream({"<think>one", " two", "</think>\n\nPar", "is"}, FinishReason::kStop);
  EXPECT_EQ(joined(s.live, "response.reasoning_text.delta"), "one two") << "sent before the end";
  EXPECT_EQ(joined(s.live, "response.output_text.delta"), "Paris");
  const std::vector<std::string> want = {
      "response.created", "response.in_progress", "response.output_item.added", "response.reasoning_text.delta",
      "response.reasoning_text.delta", "response.reasoning_text.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta",
      "response.output_text.delta", "response.output_text.done", "response.content_part.done",
      "response.output_item.done", "response.completed"};
  EXPECT_EQ(types(s.all), want);
  const json& output = s.all.back()["response"]["output"];
  ASSERT_EQ(output.size(), 2u);
  EXPECT_EQ(output[0]["content"][0]["text"], "one two");
  EXPECT_EQ(output[1]["content"][0]["text"], "Paris");
  expect_consistent(s.all);
}

TEST(ResponsesStream, AnAnswerWithoutThinkingIsOneMessageAtIndexZero) {
  const Streamed s = stream({"Hel", "lo"}, FinishReason::kStop);
  EXPECT_EQ(joined(s.live, "response.output_text.delta"), "Hello");
  EXPECT_EQ(joined(s.all, "response.reasoning_text.delta"), "");
  const json& output = s.all.back()["response"]["output"];
  ASSERT_EQ(output.size(), 1u);
  EXPECT_EQ(output[0]["type"], "message");
  expect_consistent(s.all);
}

TEST(ResponsesStream, ThinkingCutByTheLimitEndsWithAnEmptyMessage) {
  const Streamed s = stream({"still", " thinking"}, FinishReason::kLength, /*opens_thinking=*/true);
  EXPECT_EQ(joined(s.live, "response.reasoning_text.delta"), "still thinking");
  EXPECT_EQ(s.all.back()["type"], "response.incomplete");
  const json& output = s.all.back()["response"]["output"];
  ASSERT_EQ(output.size(), 2u);
  EXPECT_EQ(output[1]["content"][0]["text"], "");
  expect_consistent(s.all);
}

TEST(ResponsesStream, ATagSplitAcrossPiecesIsNeverSentAsText) {
  const Streamed s = stream({"<thi", "nk>a</th", "ink>", "\n\nb"}, FinishReason::kStop);
  EXPECT_EQ(joined(s.all, "response.reasoning_text.delta"), "a");
  EXPECT_EQ(joined(s.all, "response.output_text.delta"), "b");
  expect_consistent(s.all);
}

}  // namespace
}  // namespace fathom
