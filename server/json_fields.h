#pragma once
// Reads of a field of an outside JSON object that never throw: nlohmann's typed value(key, default)
// throws type_error when the field exists with another type, and a request body's types are the
// client's to choose (fuzz_request found {"tools": [{"type": {...}}]} escaping as a type_error).
// The fallback comes back instead, and the caller's validation names the field in its 400.
#include <string>

#include <nlohmann/json.hpp>

namespace fathom {

// obj[key] when obj is an object holding a string there, else `fallback`.
inline std::string string_field_or(const nlohmann::json& obj, const char* key, const std::string& fallback = "") {
  if (!obj.is_object()) return fallback;
  const auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : fallback;
}

}  // namespace fathom
