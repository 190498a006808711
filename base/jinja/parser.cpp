#include "base/jinja/parser.h"

#include <initializer_list>

#include "base/jinja/error.h"
#include "base/jinja/lexer.h"

namespace fathom::jinja {

namespace {

class Parser {
 public:
  Parser(std::vector<Token> toks, const Limits& limits) : t_(std::move(toks)), limits_(limits) {}

  Body parse_all() {
    std::string end;
    Body b = subparse({}, end);
    return b;
  }

 private:
  std::vector<Token> t_;
  const Limits& limits_;
  size_t i_ = 0;
  int depth_ = 0;

  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser) : p(parser) {
      if (++p.depth_ > p.limits_.max_nesting)
        throw Error("template nesting too deep (limit " + std::to_string(p.limits_.max_nesting) + ")", p.cur().line);
    }
    ~Nest() { --p.depth_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
  void next() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().value == op; }
  bool is_name(const char* n) const { return cur().type == Tok::kName && cur().value == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(const std::string& msg) const { throw Error(msg, cur().line); }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::kEof: return "end of template";
      case Tok::kBlockEnd: return "end of statement block";
      case Tok::kVarEnd: return "end of print statement";
      case Tok::kName: return "'" + t.value + "'";
      case Tok::kOp: return "'" + t.value + "'";
      case Tok::kString: return "string";
      default: return "token";
    }
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != Tok::kName) fail("expected a name, got " + describe(cur()));
    std::string n = cur().value;
    next();
    return n;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd) fail("expected end of statement block, got " + describe(cur()));
    next();
  }

  // The tree's height is bounded too: chains (a.b.c..., 1+1+1...) do not recurse in the parser
  // but would in the interpreter and in the tree's destructor.
  void bump(Expr& parent, const Expr& child) {
    parent.depth = std::max(parent.depth, child.depth + 1);
    if (parent.depth > 4 * limits_.max_nesting)
      throw Error("expression nesting too deep (limit " + std::to_string(4 * limits_.max_nesting) + ")", parent.line);
  }
  void add(Expr& parent, ExprP child) {
    if (child) bump(parent, *child);
    parent.a.push_back(std::move(child));
  }

  ExprP node(Expr::K k, int line) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->line = line;
    return e;
  }

  // ---- statements ----

  // Parses until a {% NAME %} with NAME in `ends` (left at NAME), or the end of input.
  Body subparse(std::initializer_list<const char*> ends, std::string& found) {
    Nest nest(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == Tok::kEof) {
        if (ends.size()) {
          std::string want;
          for (const char* e : ends) want += (want.empty() ? "'" : " or '") + std::string(e) + "'";
          fail("unexpected end of template, expected " + want);
        }
        return body;
      }
      if (t.type == Tok::kData) {
        auto s = std::make_unique<Stmt>();
        s->k = Stmt::K::kText;
        s->line = t.line;
        s->text = TString(t.value);
        body.push_back(std::move(s));
        next();
      } else if (t.type == Tok::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->k = Stmt::K::kOutput;
        s->line = t.line;
        next();
        s->e = parse_tuple(true, false);
        if (cur().type != Tok::kVarEnd) fail("expected end of print statement, got " + describe(cur()));
        next();
        body.push_back(std::move(s));
      } else if (t.type == Tok::kBlockBegin) {
        next();
        if (cur().type != Tok::kName) fail("expected a statement name, got " + describe(cur()));
        for (const char* e : ends) {
          if (cur().value == e) {
            found = e;
            return body;
          }
        }
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(t));
      }
    }
  }

  // After {% NAME ... %}: consumes NAME's block (the caller checked which end was found).
  void end_tag() {
    next();  // the end name
    expect_block_end();
  }

  StmtP make(Stmt::K k) {
    auto s = std::make_unique<Stmt>();
    s->k = k;
    s->line = cur().line;
    return s;
  }

  StmtP parse_statement() {
    const std::string name = cur().value;
    const int line = cur().line;
    next();
    std::string found;
    if (name == "if") {
      auto s = make(Stmt::K::kIf);
      s->line = line;
      ExprP cond = parse_tuple(false, false);
      expect_block_end();
      while (true) {
        Body b = subparse({"elif", "else", "endif"}, found);
        s->branches.emplace_back(std::move(cond), std::move(b));
        if (found == "elif") {
          next();
          cond = parse_tuple(false, false);
          expect_block_end();
          continue;
        }
        if (found == "else") {
          end_tag();
          s->else_body = subparse({"endif"}, found);
        }
        end_tag();
        return s;
      }
    }
    if (name == "for") {
      auto s = make(Stmt::K::kFor);
      s->line = line;
      s->target = parse_target(false, true);
      if (!skip_name("in")) fail("expected 'in', got " + describe(cur()));
      s->e = parse_tuple(false, true);
      if (skip_name("if")) s->cond = parse_expression(true);
      if (is_name("recursive")) fail("recursive loops are not supported");
      expect_block_end();
      s->body = subparse({"endfor", "else"}, found);
      if (found == "else") {
        end_tag();
        s->else_body = subparse({"endfor"}, found);
      }
      end_tag();
      return s;
    }
    if (name == "set") {
      auto s = make(Stmt::K::kSet);
      s->line = line;
      s->target = parse_target(true, false);
      if (skip_op("=")) {
        s->e = parse_tuple(true, false);
        expect_block_end();
        return s;
      }
      if (!s->target.attr.empty() || !s->target.items.empty()) fail("expected '='");
      s->k = Stmt::K::kSetBlock;
      if (is_op("|")) s->e = parse_filters(nullptr);
      expect_block_end();
      s->body = subparse({"endset"}, found);
      end_tag();
      return s;
    }
    if (name == "macro") {
      auto s = make(Stmt::K::kMacro);
      s->line = line;
      s->macro = std::make_shared<MacroDef>();
      s->macro->name = expect_name();
      parse_signature(*s->macro);
      expect_block_end();
      s->macro->body = subparse({"endmacro"}, found);
      end_tag();
      return s;
    }
    if (name == "call") {
      auto s = make(Stmt::K::kCallBlock);
      s->line = line;
      s->macro = std::make_shared<MacroDef>();
      s->macro->name = "caller";
      if (is_op("(")) parse_signature(*s->macro);
      s->e = parse_expression(true);
      if (s->e->k != Expr::K::kCall) fail("expected call");
      expect_block_end();
      s->macro->body = subparse({"endcall"}, found);
      end_tag();
      return s;
    }
    if (name == "filter") {
      auto s = make(Stmt::K::kFilterBlock);
      s->line = line;
      s->e = parse_filters(nullptr, true);
      expect_block_end();
      s->body = subparse({"endfilter"}, found);
      end_tag();
      return s;
    }
    if (name == "with") {
      auto s = make(Stmt::K::kWith);
      s->line = line;
      while (cur().type != Tok::kBlockEnd) {
        if (!s->assigns.empty()) expect_op(",");
        Target t = parse_target(false, false);
        expect_op("=");
        s->assigns.emplace_back(std::move(t), parse_expression(true));
      }
      expect_block_end();
      s->body = subparse({"endwith"}, found);
      end_tag();
      return s;
    }
    if (name == "generation") {  // Hugging Face's AssistantTracker: renders its body
      auto s = make(Stmt::K::kBody);
      s->line = line;
      expect_block_end();
      s->body = subparse({"endgeneration"}, found);
      end_tag();
      return s;
    }
    if (name == "break" || name == "continue") {
      auto s = make(name == "break" ? Stmt::K::kBreak : Stmt::K::kContinue);
      s->line = line;
      expect_block_end();
      return s;
    }
    throw Error("encountered unknown tag '" + name + "'", line);
  }

  void parse_signature(MacroDef& m) {
    expect_op("(");
    while (!is_op(")")) {
      if (!m.params.empty()) expect_op(",");
      if (is_op(")")) break;
      m.params.push_back(expect_name());
      if (skip_op("=")) {
        m.defaults.push_back(parse_expression(true));
      } else if (!m.defaults.empty()) {
        fail("non-default argument follows default argument");
      }
    }
    next();
  }

  // name | ns.attr | a, b | (a, b)
  Target parse_target(bool with_namespace, bool for_loop) {
    Target t;
    auto one = [&]() {
      Target x;
      if (skip_op("(")) {
        x = parse_target(false, false);
        expect_op(")");
        return x;
      }
      x.name = expect_name();
      if (with_namespace && is_op(".") && peek().type == Tok::kName) {
        next();
        x.attr = expect_name();
      }
      return x;
    };
    Target first = one();
    if (!is_op(",")) return first;
    t.items.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type != Tok::kName && !is_op("(")) break;
      if (for_loop && is_name("in")) break;
      t.items.push_back(one());
    }
    for (const Target& x : t.items)
      if (!x.attr.empty()) fail("cannot assign to a namespace attribute in a tuple");
    return t;
  }

  // ---- expressions ----

  bool tuple_end(bool for_iter) const {
    if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || cur().type == Tok::kEof) return true;
    if (is_op(")")) return true;
    if (for_iter && (is_name("recursive") || is_name("if"))) return false;
    return false;
  }

  // expr (, expr)* : a tuple when a comma appears.
  ExprP parse_tuple(bool with_condexpr, bool for_iter) {
    const int line = cur().line;
    std::vector<ExprP> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (tuple_end(for_iter)) break;
      items.push_back(with_condexpr ? parse_expression(true) : parse_or());
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (items.empty()) fail("expected an expression, got " + describe(cur()));
      return std::move(items[0]);
    }
    auto e = node(Expr::K::kTuple, line);
    for (auto& x : items) add(*e, std::move(x));
    return e;
  }

  ExprP parse_expression(bool with_condexpr) {
    Nest nest(*this);
    if (!with_condexpr) return parse_or();
    ExprP e = parse_or();
    while (is_name("if")) {
      const int line = cur().line;
      next();
      auto c = node(Expr::K::kCond, line);
      add(*c, parse_or());
      add(*c, std::move(e));
      add(*c, skip_name("else") ? parse_expression(true) : nullptr);
      e = std::move(c);
    }
    return e;
  }

  ExprP binary(const char* op, ExprP l, ExprP r, int line) {
    auto e = node(Expr::K::kBinary, line);
    e->name = op;
    add(*e, std::move(l));
    add(*e, std::move(r));
    return e;
  }

  ExprP parse_or() {
    ExprP l = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      next();
      l = binary("or", std::move(l), parse_and(), line);
    }
    return l;
  }
  ExprP parse_and() {
    ExprP l = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      next();
      l = binary("and", std::move(l), parse_not(), line);
    }
    return l;
  }
  ExprP parse_not() {
    if (is_name("not")) {
      Nest nest(*this);
      auto e = node(Expr::K::kNot, cur().line);
      next();
      add(*e, parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    const int line = cur().line;
    ExprP l = parse_math1();
    ExprP cmp;
    while (true) {
      std::string op;
      if (cur().type == Tok::kOp &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" || cur().value == ">" ||
           cur().value == "<=" || cur().value == ">=")) {
        op = cur().value;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().type == Tok::kName && peek().value == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Expr::K::kCompare, line);
        add(*cmp, std::move(l));
      }
      cmp->ops.push_back(op);
      add(*cmp, parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(l);
  }
  ExprP parse_math1() {
    ExprP l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const char* op = is_op("+") ? "+" : "-";
      const int line = cur().line;
      next();
      l = binary(op, std::move(l), parse_concat(), line);
    }
    return l;
  }
  ExprP parse_concat() {
    ExprP l = parse_math2();
    while (is_op("~")) {
      const int line = cur().line;
      next();
      l = binary("~", std::move(l), parse_math2(), line);
    }
    return l;
  }
  ExprP parse_math2() {
    ExprP l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = cur().value;
      const int line = cur().line;
      next();
      l = binary(op == "*" ? "*" : op == "/" ? "/" : op == "//" ? "//" : "%", std::move(l), parse_pow(), line);
    }
    return l;
  }
  ExprP parse_pow() {
    ExprP l = parse_unary(true);
    while (is_op("**")) {
      const int line = cur().line;
      next();
      l = binary("**", std::move(l), parse_unary(true), line);
    }
    return l;
  }
  ExprP parse_unary(bool with_filter) {
    Nest nest(*this);
    ExprP e;
    if (is_op("-") || is_op("+")) {
      e = node(is_op("-") ? Expr::K::kNeg : Expr::K::kPos, cur().line);
      next();
      add(*e, parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprP parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    if (t.type == Tok::kName) {
      const std::string& n = t.value;
      auto e = node(Expr::K::kLiteral, line);
      if (n == "true" || n == "True") e->value = Value::boolean(true);
      else if (n == "false" || n == "False") e->value = Value::boolean(false);
      else if (n == "none" || n == "None") e->value = Value::none();
      else {
        e->k = Expr::K::kName;
        e->name = n;
      }
      next();
      return e;
    }
    if (t.type == Tok::kString) {
      std::string s = t.value;
      next();
      while (cur().type == Tok::kString) {
        s += cur().value;
        next();
      }
      auto e = node(Expr::K::kLiteral, line);
      e->value = Value::string(std::move(s));
      return e;
    }
    if (t.type == Tok::kInt || t.type == Tok::kFloat) {
      auto e = node(Expr::K::kLiteral, line);
      e->value = t.type == Tok::kInt ? Value::integer(t.ival) : Value::number(t.fval);
      next();
      return e;
    }
    if (skip_op("(")) {
      if (skip_op(")")) {
        auto e = node(Expr::K::kTuple, line);
        return e;
      }
      ExprP inner = parse_tuple(true, false);
      expect_op(")");
      return inner;
    }
    if (skip_op("[")) {
      auto e = node(Expr::K::kList, line);
      while (!is_op("]")) {
        if (!e->a.empty()) expect_op(",");
        if (is_op("]")) break;
        add(*e, parse_expression(true));
      }
      next();
      return e;
    }
    if (skip_op("{")) {
      auto e = node(Expr::K::kDict, line);
      while (!is_op("}")) {
        if (!e->a.empty()) expect_op(",");
        if (is_op("}")) break;
        add(*e, parse_expression(true));
        expect_op(":");
        add(*e, parse_expression(true));
      }
      next();
      return e;
    }
    fail("unexpected " + describe(t));
  }

  ExprP parse_postfix(ExprP e) {
    while (true) {
      if (is_op(".")) {
        const int line = cur().line;
        next();
        if (cur().type == Tok::kName) {
          auto a = node(Expr::K::kAttr, line);
          a->name = cur().value;
          next();
          add(*a, std::move(e));
          e = std::move(a);
        } else if (cur().type == Tok::kInt) {
          auto a = node(Expr::K::kItem, line);
          add(*a, std::move(e));
          auto idx = node(Expr::K::kLiteral, line);
          idx->value = Value::integer(cur().ival);
          add(*a, std::move(idx));
          next();
          e = std::move(a);
        } else {
          fail("expected name or number after '.'");
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprP parse_subscript(ExprP e) {
    Nest nest(*this);
    const int line = cur().line;
    next();  // [
    ExprP parts[3];
    bool slice = false;
    if (!is_op(":")) parts[0] = parse_expression(true);
    if (skip_op(":")) {
      slice = true;
      if (!is_op("]") && !is_op(":")) parts[1] = parse_expression(true);
      if (skip_op(":") && !is_op("]")) parts[2] = parse_expression(true);
    }
    expect_op("]");
    auto s = node(slice ? Expr::K::kSlice : Expr::K::kItem, line);
    add(*s, std::move(e));
    if (slice) {
      for (auto& p : parts) add(*s, std::move(p));
    } else {
      if (!parts[0]) fail("expected subscript expression");
      add(*s, std::move(parts[0]));
    }
    return s;
  }

  void parse_args(Expr& call) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().value == "=") {
        std::string key = cur().value;
        next();
        next();
        ExprP v = parse_expression(true);
        bump(call, *v);
        call.kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        if (!call.kwargs.empty()) fail("positional argument follows keyword argument");
        add(call, parse_expression(true));
      }
    }
    next();
  }

  ExprP parse_call(ExprP fn) {
    Nest nest(*this);
    auto c = node(Expr::K::kCall, cur().line);
    add(*c, std::move(fn));
    parse_args(*c);
    return c;
  }

  // One filter `| name(args)`; e may be null (filter blocks, set blocks).
  ExprP parse_filters(ExprP e, bool start_inline = false) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      auto f = node(Expr::K::kFilter, cur().line);
      f->name = expect_name();
      while (is_op(".") && peek().type == Tok::kName) {
        next();
        f->name.append(".").append(expect_name());
      }
      add(*f, std::move(e));
      if (is_op("(")) parse_args(*f);
      e = std::move(f);
    }
    return e;
  }

  ExprP parse_filter_expr(ExprP e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filters(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprP parse_test(ExprP e) {
    Nest nest(*this);
    const int line = cur().line;
    next();  // is
    const bool negated = skip_name("not");
    auto t = node(Expr::K::kTest, line);
    t->name = expect_name();
    while (is_op(".") && peek().type == Tok::kName) {
      next();
      t->name.append(".").append(expect_name());
    }
    add(*t, std::move(e));
    const Token& c = cur();
    if (is_op("(")) {
      parse_args(*t);
    } else if ((c.type == Tok::kName || c.type == Tok::kString || c.type == Tok::kInt || c.type == Tok::kFloat ||
                is_op("(") || is_op("[") || is_op("{")) &&
               !(is_name("else") || is_name("or") || is_name("and"))) {
      if (is_name("is")) fail("You cannot chain multiple tests with is");
      add(*t, parse_postfix(parse_primary()));
    }
    if (!negated) return t;
    auto n = node(Expr::K::kNot, line);
    add(*n, std::move(t));
    return n;
  }
};

}  // namespace

Body parse_template(std::string_view source, const Limits& limits) {
  return Parser(tokenize(source, limits), limits).parse_all();
}

}  // namespace fathom::jinja
