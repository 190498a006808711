#pragma once
// Which JSON Schema keywords an output constraint may use. The grammar engine (xgrammar) turns a
// schema into a grammar but only warns about keywords it cannot enforce (`not`, `if`/`then`/
// `else`, `dependentRequired`, `uniqueItems`, `contains`, `multipleOf` on numbers, ...) and drops
// them: the output would then not be guaranteed to validate. So such a schema is refused up front
// with a RuleError naming the keyword and where it is (HTTP 400, gRPC INVALID_ARGUMENT), for
// response_format, Responses text.format, tool parameters and gRPC constraints alike.
#include <string>

#include <nlohmann/json.hpp>

namespace fathom {

// Throws RuleError(kInvalid, field) for a keyword the constraint could not enforce, a schema
// nested deeper than 64 levels or past the grammar engine's bounds through its $refs
// (engine/constraint/constraint_bounds.h), or (for the text form) text that is not JSON.
void check_schema_keywords(const nlohmann::json& schema, const std::string& field);
void check_schema_keywords(const std::string& schema_text, const std::string& field);
// Throws RuleError(kInvalid, field) for EBNF text past the grammar engine's nesting bounds.
void check_grammar_text(const std::string& grammar, const std::string& field);

}  // namespace fathom
