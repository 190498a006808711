#pragma once
// JSON text from outside (a request body, tool-call arguments, a model's tool call), parsed only
// after its nesting is measured (base/json_depth.h): every reader after the parser (dump() among
// them) may recurse.
#include <string_view>

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

}  // namespace fathom
