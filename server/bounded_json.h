#pragma once
// JSON text from outside (a request body, tool-call arguments, a model's tool call), parsed only
// after its nesting is measured (base/json_depth.h): every reader after the parser (dump() among
// them) may recurse.
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/json_depth.h"

namespace fathom {

enum class JsonTextFault { kNone, kTooDeep, kInvalid };

// The parsed value, or a discarded one when `text` nests deeper than kMaxJsonDepth or is not
// JSON; `fault` (optional) tells which.
inline nlohmann::json parse_bounded_json(std::string_view text, JsonTextFault* fault = nullptr) {
  if (fault != nullptr) *fault = JsonTextFault::kNone;
  if (json_nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth) {
    if (fault != nullptr) *fault = JsonTextFault::kTooDeep;
    return nlohmann::json(nlohmann::json::value_t::discarded);
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() && fault != nullptr) *fault = JsonTextFault::kInvalid;
  return j;
}

// Key order kept (nlohmann::ordered_json), for what a chat template prints back to the model as
// the client wrote it (tool definitions, call arguments). An ordered object finds a key by a linear
// search, so parsing n keys into one object costs n^2/2 comparisons: more than kMaxOrderedKeys in
// one object is a discarded value. `keep_top_level` (optional): only that member of a top-level
// object is kept (the rest of the body is skipped, not stored).
inline constexpr size_t kMaxOrderedKeys = 256;

inline nlohmann::ordered_json parse_bounded_ordered_json(std::string_view text, const char* keep_top_level = nullptr) {
  using nlohmann::ordered_json;
  if (json_nesting_depth(text, kMaxJsonDepth) > kMaxJsonDepth) return ordered_json(ordered_json::value_t::discarded);
  struct TooManyKeys {};
  // Keys of the open object at each depth (an object_start resets the count of the depth below it;
  // nlohmann reports no object_end for skipped objects). Skipped members are not stored: not counted.
  std::vector<size_t> keys;
  bool stored = true;  // the current top-level member is kept
  const ordered_json::parser_callback_t bound = [&](int depth, ordered_json::parse_event_t event, ordered_json& parsed) {
    const auto d = static_cast<size_t>(depth);
    if (event == ordered_json::parse_event_t::object_start) {
      if (keys.size() < d + 2) keys.resize(d + 2);
      keys[d + 1] = 0;
    } else if (event == ordered_json::parse_event_t::key) {
      if (keep_top_level != nullptr && d == 1) {
        stored = parsed == keep_top_level;
        return stored;
      }
      if (stored && d < keys.size() && ++keys[d] > kMaxOrderedKeys) throw TooManyKeys{};
    }
    return true;
  };
  try {
    return ordered_json::parse(text, bound, /*allow_exceptions=*/false);
  } catch (const TooManyKeys&) {
    return ordered_json(ordered_json::value_t::discarded);
  }
}

}  // namespace fathom
