#pragma once
// The syntax tree of a template: expressions and statements as the parser builds them. Plain
// tagged structs; the interpreter (interp.cpp) walks them.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/jinja/value.h"

namespace fathom::jinja {

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum class K {
    kLiteral,   // value
    kName,      // name
    kAttr,      // a[0].name
    kItem,      // a[0][a[1]]
    kSlice,     // a[0][a[1]:a[2]:a[3]] (null parts absent)
    kCall,      // a[0](a[1..], kwargs)
    kFilter,    // a[0]|name(a[1..], kwargs); a[0] null inside {% filter %}
    kTest,      // a[0] is name(a[1..], kwargs)
    kNeg,       // -a[0]
    kPos,       // +a[0]
    kNot,       // not a[0]
    kBinary,    // a[0] name a[1]: + - * / // % ** ~ and or
    kCompare,   // a[0] ops[0] a[1] ops[1] a[2] ...
    kCond,      // a[1] if a[0] else a[2] (a[2] null: undefined)
    kList,      // [a...]
    kTuple,     // (a...)
    kDict,      // {a[0]: a[1], a[2]: a[3], ...}
  };
  K k;
  int line = 0;
  int depth = 1;  // height of this subtree (bounded by the parser)
  Value value;
  std::string name;
  std::vector<ExprP> a;
  std::vector<std::pair<std::string, ExprP>> kwargs;
  std::vector<std::string> ops;
};

struct Stmt;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;

// An assignment target: a name, a namespace attribute (ns.attr) or a tuple of names.
struct Target {
  std::string name;                // single name, or the namespace variable of ns.attr
  std::string attr;                // non-empty: ns.attr
  std::vector<Target> items;       // tuple target (name empty)
};

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprP> defaults;  // aligned to the last params
  Body body;
  bool uses_caller = false;
};

struct Stmt {
  enum class K {
    kText,      // text
    kOutput,    // {{ e }}
    kIf,        // branches: (cond, body)...; else_body
    kFor,       // target in e [if cond]: body; else_body
    kSet,       // target = e
    kSetBlock,  // {% set target [| filters] %}body{% endset %}: filter in e (kFilter chain on null)
    kMacro,     // macro
    kCallBlock, // {% call(params) e %}body{% endcall %}: macro holds the caller
    kFilterBlock,  // {% filter f %}body{% endfilter %}: e is the filter chain on null
    kWith,      // {% with targets = values %}body{% endwith %}
    kBreak,
    kContinue,
    kBody,      // plain nested body ({% generation %})
  };
  K k;
  int line = 0;
  TString text;
  ExprP e;
  ExprP cond;
  Target target;
  std::vector<std::pair<ExprP, Body>> branches;
  Body body;
  Body else_body;
  std::shared_ptr<MacroDef> macro;
  std::vector<std::pair<Target, ExprP>> assigns;  // kWith
};

}  // namespace fathom::jinja
