// Typed access to GGUF metadata values: integer widths convert to int64 (range-checked),
// integers and floats convert to double, bools and strings only to themselves.
#include <limits>
#include <type_traits>

#include "base/error.h"
#include "engine/model/gguf.h"

namespace fathom {

const char* gguf_type_name(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8: return "uint8";
    case GgufValueType::INT8: return "int8";
    case GgufValueType::UINT16: return "uint16";
    case GgufValueType::INT16: return "int16";
    case GgufValueType::UINT32: return "uint32";
    case GgufValueType::INT32: return "int32";
    case GgufValueType::FLOAT32: return "float32";
    case GgufValueType::BOOL: return "bool";
    case GgufValueType::STRING: return "string";
    case GgufValueType::ARRAY: return "array";
    case GgufValueType::UINT64: return "uint64";
    case GgufValueType::INT64: return "int64";
    case GgufValueType::FLOAT64: return "float64";
  }
  return "unknown";
}

namespace {

template <class T>
constexpr bool kIsInteger = std::is_integral_v<T> && !std::is_same_v<T, bool>;

// Stored type of a value, for messages: "uint32", "array of string".
std::string type_of(const GgufValue& v) {
  static const char* const kNames[] = {"uint8", "int8",    "uint16",  "int16", "uint32",
                                       "int32", "uint64",  "int64",   "float32", "float64",
                                       "bool",  "string",  "array"};
  static_assert(std::size(kNames) == std::variant_size_v<GgufValue>);
  if (const auto* a = std::get_if<std::shared_ptr<GgufArray>>(&v))
    return std::string("array of ") + gguf_type_name((*a)->type);
  return kNames[v.index()];
}

enum class Conv { kOk, kWrongType, kOutOfRange };

Conv to_int(const GgufValue& v, int64_t& out) {
  return std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, uint64_t>) {
          if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return Conv::kOutOfRange;
          out = static_cast<int64_t>(x);
          return Conv::kOk;
        } else if constexpr (kIsInteger<T>) {
          out = x;
          return Conv::kOk;
        } else {
          return Conv::kWrongType;
        }
      },
      v);
}

Conv to_double(const GgufValue& v, double& out) {
  return std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (kIsInteger<T> || std::is_floating_point_v<T>) {
          out = static_cast<double>(x);
          return Conv::kOk;
        } else {
          return Conv::kWrongType;
        }
      },
      v);
}

std::string where(const std::string& path, std::string_view key) {
  return path + ": metadata key '" + std::string(key) + "'";
}

[[noreturn]] void wrong_type(const std::string& path, std::string_view key, const GgufValue& v,
                             const char* expected) {
  throw Error(where(path, key) + " has type " + type_of(v) + ", expected " + expected);
}

[[noreturn]] void out_of_range(const std::string& path, std::string_view key, const GgufValue& v) {
  throw Error(where(path, key) + " value " + std::to_string(std::get<uint64_t>(v)) +
              " does not fit in int64");
}

int64_t int_or_throw(const std::string& path, std::string_view key, const GgufValue& v, const char* expected) {
  int64_t out = 0;
  switch (to_int(v, out)) {
    case Conv::kOk: return out;
    case Conv::kWrongType: wrong_type(path, key, v, expected);
    case Conv::kOutOfRange: out_of_range(path, key, v);
  }
  return out;
}

const GgufArray& array_or_throw(const std::string& path, std::string_view key, const GgufValue& v,
                                const char* expected) {
  const auto* a = std::get_if<std::shared_ptr<GgufArray>>(&v);
  if (!a) wrong_type(path, key, v, expected);
  return **a;
}

}  // namespace

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = metadata_.find(std::string(key));
  return it == metadata_.end() ? nullptr : &it->second;
}

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  return int_or_throw(path_, key, *v, "an integer");
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  double out = 0;
  if (to_double(*v, out) != Conv::kOk) wrong_type(path_, key, *v, "a number");
  return out;
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (const bool* b = std::get_if<bool>(v)) return *b;
  wrong_type(path_, key, *v, "bool");
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (const std::string* s = std::get_if<std::string>(v)) return *s;
  wrong_type(path_, key, *v, "string");
}

std::optional<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  const GgufArray& a = array_or_throw(path_, key, *v, "array of string");
  if (a.type != GgufValueType::STRING) wrong_type(path_, key, *v, "array of string");
  std::vector<std::string> out;
  out.reserve(a.values.size());
  for (const GgufValue& e : a.values) out.push_back(std::get<std::string>(e));
  return out;
}

std::optional<std::vector<double>> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  const GgufArray& a = array_or_throw(path_, key, *v, "array of numbers");
  std::vector<double> out(a.values.size());
  for (size_t i = 0; i < out.size(); ++i)
    if (to_double(a.values[i], out[i]) != Conv::kOk) wrong_type(path_, key, *v, "array of numbers");
  return out;
}

std::optional<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  const GgufArray& a = array_or_throw(path_, key, *v, "array of integers");
  std::vector<int64_t> out(a.values.size());
  for (size_t i = 0; i < out.size(); ++i) {
    switch (to_int(a.values[i], out[i])) {
      case Conv::kOk: break;
      case Conv::kWrongType: wrong_type(path_, key, *v, "array of integers");
      case Conv::kOutOfRange:
        throw Error(where(path_, key) + " element " + std::to_string(i) + " value " +
                    std::to_string(std::get<uint64_t>(a.values[i])) + " does not fit in int64");
    }
  }
  return out;
}

int64_t GgufFile::require_int(std::string_view key) const {
  if (auto v = get_int(key)) return *v;
  throw Error(path_ + ": missing metadata key " + std::string(key));
}

double GgufFile::require_float(std::string_view key) const {
  if (auto v = get_float(key)) return *v;
  throw Error(path_ + ": missing metadata key " + std::string(key));
}

std::string GgufFile::require_string(std::string_view key) const {
  if (auto v = get_string(key)) return *v;
  throw Error(path_ + ": missing metadata key " + std::string(key));
}

}  // namespace fathom
