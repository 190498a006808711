#pragma once
// Bounds on what the grammar engine walks recursively, checked before it sees a constraint.
// xgrammar turns a JSON Schema into a grammar by a recursive descent that follows each `$ref`
// into the schema it names, parses EBNF by recursive descent over parentheses, and turns a regex
// (`pattern`, `Regex("...")`) into nested EBNF groups. A client controls all three, and a deep
// enough input overflows the thread's stack: one request would end the process (a `$ref` chain a
// few thousand deep, ~600 KiB of JSON, did on an 8 MiB stack). These checks walk the input
// iteratively and refuse it, naming the limit, before any recursive code runs. The limits keep
// xgrammar's deepest recursion within a 256 KiB stack (tests/unit/test_constraint_bounds.cpp runs
// every kind of input there); server threads have 8 MiB.
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace fathom {

struct ConstraintBounds {
  // JSON levels (objects and arrays) on the deepest path xgrammar can walk, where a `$ref`
  // continues the path into the schema it names (a schema level is usually two: an object and
  // its "properties"). Measured with xgrammar 0.2.8: ~450-600 such levels overflow a 256 KiB stack.
  static constexpr int kMaxSchemaLevels = 256;
  // Nested groups in a regex (`pattern`, `patternProperties` keys, EBNF `Regex("...")`).
  static constexpr int kMaxRegexGroups = 32;
  // Nested parentheses in EBNF text (xgrammar's own limit is 1,000: past a 256 KiB stack).
  static constexpr int kMaxGrammarParens = 64;
};

// Throws fathom::Error naming the bound when `schema` nests deeper than kMaxSchemaLevels through
// its `$ref`s (a cycle counts once per schema it can re-enter), a regex in it nests more than
// kMaxRegexGroups groups, or a `$ref` has an empty path segment ("#/", "#/$defs//a": RFC 6901
// reads them as the key "", xgrammar skips them; refused so that one target has one spelling).
// Runs in time and memory linear in the schema's size; never recurses.
void check_schema_bounds(const nlohmann::json& schema);

// Throws fathom::Error when EBNF `grammar` nests parentheses deeper than kMaxGrammarParens, or one
// of its string literals, read as a regex, nests more than kMaxRegexGroups groups.
void check_grammar_bounds(std::string_view grammar);

// The deepest nesting of groups in `regex` (escapes and character classes as xgrammar reads them).
int regex_group_depth(std::string_view regex);

}  // namespace fathom
