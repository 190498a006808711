// libFuzzer target: a model's output -> what the APIs report of it (server/answer.h), in every
// format and tool_choice mode: harmony's channels (server/harmony.h), <think> spans
// (server/reasoning.h), and Hermes, Llama 3.x and Mistral calls (server/tools.h,
// server/tool_stream.h), whole and streamed in the pieces the input chooses. A harmony or <think>
// stream must add up to the whole split, and every call reported (but a named one, whose text is
// the arguments) must name an offered function and hold a JSON object; anything thrown, a crash,
// a leak or undefined behaviour is a finding.
// Bytes: [selector][cut seed][text...]. Selector: bits 0-1 the format (Hermes, Llama, Mistral,
// harmony), bits 2-3 the mode (none, auto, required, named), bit 4 the finish (stop or length),
// bit 5 a prompt that opened <think>.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/answer.h"
#include "server/bounded_json.h"
#include "server/harmony.h"
#include "server/reasoning.h"
#include "server/tool_stream.h"

namespace {

fathom::ToolPlan plan_of(uint8_t selector) {
  using fathom::ToolPlan;
  ToolPlan plan;
  constexpr ToolPlan::Format kFormats[] = {ToolPlan::Format::kHermes, ToolPlan::Format::kLlamaJson,
                                           ToolPlan::Format::kMistral, ToolPlan::Format::kHarmony};
  constexpr ToolPlan::Mode kModes[] = {ToolPlan::Mode::kNone, ToolPlan::Mode::kAuto, ToolPlan::Mode::kRequired,
                                       ToolPlan::Mode::kNamed};
  plan.format = kFormats[selector & 3];
  plan.mode = kModes[(selector >> 2) & 3];
  for (const char* name : {"get_weather", "f"})
    plan.tools.push_back({name, "", {{"type", "object"}}, false});
  plan.named = "get_weather";
  return plan;
}

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t selector = data[0];
  uint32_t seed = data[1] | 1u;
  const std::string text(reinterpret_cast<const char*>(data + 2), size - 2);
  const fathom::ToolPlan plan = plan_of(selector);
  const fathom::FinishReason finish = (selector & 16) ? fathom::FinishReason::kLength : fathom::FinishReason::kStop;
  fathom::ReasoningMode mode;
  mode.on = true;
  mode.harmony = plan.format == fathom::ToolPlan::Format::kHarmony;
  mode.open = !mode.harmony && (selector & 32) != 0;
  // The cuts of the stream: 1 to 8 bytes each, from a small xorshift seeded by the input.
  auto next_cut = [&] {
    seed ^= seed << 13, seed ^= seed >> 17, seed ^= seed << 5;
    return 1 + seed % 8;
  };

  const fathom::AnswerParts whole = fathom::answer_parts(mode, plan, text, finish, "call_");
  if (plan.mode != fathom::ToolPlan::Mode::kNamed)
    for (const fathom::ToolCall& call : whole.calls) {
      check(call.name == "get_weather" || call.name == "f");
      check(fathom::parse_bounded_json(call.arguments).is_object());
    }

  if (mode.harmony) {
    fathom::HarmonySplit split(plan, "call_");
    fathom::HarmonyPiece sum;
    auto add = [&](const fathom::HarmonyPiece& p) {
      sum.reasoning += p.reasoning;
      sum.content += p.content;
      sum.calls.insert(sum.calls.end(), p.calls.begin(), p.calls.end());
    };
    for (size_t at = 0; at < text.size();) {
      const size_t n = next_cut();
      add(split.push(std::string_view(text).substr(at, n)));
      at += n;
    }
    add(split.finish(finish));
    check(sum.reasoning == whole.reasoning && sum.content == whole.content && sum.calls.size() == whole.calls.size());
    for (size_t i = 0; i < sum.calls.size(); ++i)
      check(sum.calls[i].name == whole.calls[i].name && sum.calls[i].arguments == whole.calls[i].arguments);
    return 0;
  }

  fathom::ReasoningSplit split(mode.open);
  fathom::ReasoningPiece sum;
  fathom::ToolCallStream tools(plan, "call_");
  for (size_t at = 0; at < text.size();) {
    const size_t n = next_cut();
    const fathom::ReasoningPiece p = split.push(std::string_view(text).substr(at, n));
    sum.reasoning += p.reasoning;
    sum.content += p.content;
    if (plan.offered()) (void)tools.push(p.content);
    at += n;
  }
  const fathom::ReasoningPiece tail = split.finish();
  sum.reasoning += tail.reasoning;
  sum.content += tail.content;
  check(sum.reasoning == whole.reasoning);
  if (plan.offered()) {
    (void)tools.push(tail.content);
    nlohmann::json reason;
    (void)tools.finish(finish, reason);
  }
  return 0;
}
