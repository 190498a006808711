#pragma once
// Reads of a field of an outside JSON object that never throw: nlohmann's typed value(key, default)
// throws type_error when the field exists with another type, and a request body's types are the
// client's to choose (fuzz_request found {"tools": [{"type": {...}}]} escaping as a type_error).
// The fallback comes back instead, and the caller's validation names the field in its 400.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace fathom {

// obj[key] when obj is an object holding a string there, else `fallback`.
inline std::string string_field_or(const nlohmann::json& obj, const char* key, const std::string& fallback = "") {
  if (!obj.is_object()) return fallback;
  const auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : fallback;
}

// A JSON number as int64: unsigned values past INT64_MAX saturate, floats truncate (callers check
// is_number_integer first where a fraction is an error).
inline int64_t integer_value(const nlohmann::json& v) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    return u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
  }
  return v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
}

}  // namespace fathom
