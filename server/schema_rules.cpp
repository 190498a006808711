#include "server/schema_rules.h"

#include <set>
#include <string_view>

#include "base/error.h"
#include "base/json_depth.h"
#include "engine/constraint/constraint_bounds.h"
#include "server/request_rules.h"

namespace fathom {
namespace {

using json = nlohmann::json;
constexpr int kMaxDepth = 64;

// Keywords xgrammar 0.2.8 ignores with a warning (json_schema_converter.cc).
const std::set<std::string, std::less<>> kUnenforced = {
    "not", "if", "then", "else", "dependentRequired", "dependentSchemas", "uniqueItems", "contains", "minContains",
    "maxContains"};
// Keywords whose value is a schema, an array of schemas, or an object of schemas.
const std::set<std::string, std::less<>> kSchemaValued = {"items", "additionalProperties", "propertyNames",
                                                          "unevaluatedProperties", "unevaluatedItems"};
const std::set<std::string, std::less<>> kSchemaArrays = {"anyOf", "oneOf", "allOf", "prefixItems"};
const std::set<std::string, std::less<>> kSchemaMaps = {"properties", "patternProperties", "$defs", "definitions"};

[[noreturn]] void refuse(const std::string& field, const std::string& path, const std::string& why) {
  throw RuleError(RuleError::Kind::kInvalid, field,
                  field + ": " + why + " at " + (path.empty() ? "the schema's root" : path) +
                      " (the output could not be guaranteed to satisfy it)");
}

std::string escape_pointer(std::string_view key) {  // RFC 6901
  std::string out;
  for (char c : key) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return out;
}

bool has_type(const json& s, std::string_view type) {
  auto t = s.find("type");
  if (t == s.end()) return false;
  if (t->is_string()) return *t == type;
  if (t->is_array())
    for (const json& x : *t)
      if (x.is_string() && x == type) return true;
  return false;
}

void check(const json& s, const std::string& field, const std::string& path, int depth) {
  if (depth > kMaxDepth) refuse(field, path, "the schema is nested more than 64 levels deep");
  if (!s.is_object()) return;  // true / false, or a value the grammar engine rejects itself
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& key = it.key();
    const std::string here = path + "/" + escape_pointer(key);
    if (kUnenforced.count(key)) refuse(field, here, "JSON Schema keyword '" + key + "' is not supported");
    if (kSchemaValued.count(key)) check(*it, field, here, depth + 1);
    if (kSchemaArrays.count(key) && it->is_array())
      for (size_t i = 0; i < it->size(); ++i) check((*it)[i], field, here + "/" + std::to_string(i), depth + 1);
    if (kSchemaMaps.count(key) && it->is_object())
      for (auto sub = it->begin(); sub != it->end(); ++sub)
        check(*sub, field, here + "/" + escape_pointer(sub.key()), depth + 1);
  }
  if (s.contains("multipleOf") && has_type(s, "number"))
    refuse(field, path + "/multipleOf", "'multipleOf' on a number (only integers) is not supported");
  if ((s.contains("minLength") || s.contains("maxLength")) && (s.contains("pattern") || s.contains("format")))
    refuse(field, path, "'minLength' / 'maxLength' together with 'pattern' or 'format' is not supported");
  if (auto all = s.find("allOf"); all != s.end() && all->is_array() && all->size() > 1)
    refuse(field, path + "/allOf", "'allOf' with more than one schema is not supported");
}

// The grammar engine's own bounds (engine/constraint/constraint_bounds.h), as a 400 naming the field.
template <typename F>
void within_bounds(const std::string& field, F&& check_bounds) {
  try {
    check_bounds();
  } catch (const Error& e) {
    throw RuleError(RuleError::Kind::kInvalid, field, field + ": " + e.what());
  }
}

}  // namespace

void check_schema_keywords(const json& schema, const std::string& field) {
  check(schema, field, "", 0);
  within_bounds(field, [&] { check_schema_bounds(schema); });
}

void check_grammar_text(const std::string& grammar, const std::string& field) {
  within_bounds(field, [&] { check_grammar_bounds(grammar); });
}

void check_schema_keywords(const std::string& schema_text, const std::string& field) {
  // Bound the depth before parsing hostile text (a schema level is about two JSON levels).
  if (json_nesting_depth(schema_text, 2 * kMaxDepth + 2) > 2 * kMaxDepth + 2)
    refuse(field, "", "the schema is nested more than 64 levels deep");
  const json schema = json::parse(schema_text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) throw RuleError(RuleError::Kind::kInvalid, field, field + " is not valid JSON");
  check_schema_keywords(schema, field);
}

}  // namespace fathom
