#pragma once
// How deeply JSON text nests its brackets, found before parsing it: a parser given a million
// nested brackets spends memory and time for nothing, so outside JSON is measured first.
#include <string_view>

namespace fathom {

// The nesting JSON from outside (a request body, tool-call arguments, a model's tool call) may
// have: no valid request needs more, and whatever reads it (dump() among them) may recurse.
inline constexpr int kMaxJsonDepth = 64;

// The deepest nesting of [ and { in `text` (brackets inside strings do not count), or limit + 1 as
// soon as it exceeds `limit` (the scan stops there).
inline int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return limit + 1;
      if (depth > deepest) deepest = depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace fathom
