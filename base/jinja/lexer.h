#pragma once
// The Jinja lexer, configured as Hugging Face renders chat templates: trim_blocks and
// lstrip_blocks on, `-`/`+` whitespace control, \r\n and \r read as \n, one trailing newline
// dropped (keep_trailing_newline=False). Template text comes out as kData tokens with the
// whitespace rules already applied; comments vanish; {% raw %} bodies are kData.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/jinja/limits.h"

namespace fathom::jinja {

enum class Tok { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tok type;
  std::string value;  // data text, name, decoded string literal, operator
  int line = 1;
  int64_t ival = 0;
  double fval = 0;
};

// Throws jinja::Error (with the line) on malformed input.
std::vector<Token> tokenize(std::string_view source, const Limits& limits);

}  // namespace fathom::jinja
