#pragma once
// Parses template source into statements (ast.h) with jinja2's grammar and precedence. Syntax
// errors are jinja::Error with the template line; nesting deeper than Limits::max_nesting is an
// error, never a stack overflow.
#include <string_view>

#include "base/jinja/ast.h"
#include "base/jinja/limits.h"

namespace fathom::jinja {

Body parse_template(std::string_view source, const Limits& limits);

}  // namespace fathom::jinja
