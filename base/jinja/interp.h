#pragma once
// The interpreter: walks a parsed template over a context, producing tainted text (tstring.h).
// Scoping follows jinja2: a for-loop iteration, a macro call and a with-block open a scope;
// `set` writes to the innermost one; namespaces are the only mutable values.
#include <ctime>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/jinja/ast.h"
#include "base/jinja/limits.h"
#include "base/jinja/value.h"

namespace fathom::jinja {

struct Scope {
  std::unordered_map<std::string, Value> vars;
  std::shared_ptr<Scope> parent;
};

class Interp {
 public:
  Interp(const Limits& limits, std::tm now);
  ~Interp();
  Interp(const Interp&) = delete;
  Interp& operator=(const Interp&) = delete;

  // Renders `body` with the given top-level variables.
  TString render(const Body& body, std::unordered_map<std::string, Value> context);

  const Limits& limits() const { return limits_; }
  const std::tm& now() const { return now_; }
  // Work accounting (Limits::max_steps) and size checks; all throw jinja::Error when exceeded.
  void charge(uint64_t units);
  void charge_string(size_t bytes);  // also checks max_string_bytes
  void charge_list(size_t items);    // also checks max_list_items
  int depth() const { return limits_.max_value_depth; }

  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  Value call(const Value& fn, CallArgs& args);
  Value filter(const std::string& name, const Value& input, CallArgs& args);
  bool test(const std::string& name, const Value& input, CallArgs& args);
  bool has_filter(const std::string& name) const;
  bool has_test(const std::string& name) const;
  // The items a for-loop (or a filter) iterates: list items, dict keys, string characters.
  List iterate(const Value& v);
  // A Namespace object (registered, see register_object).
  Value make_namespace(Dict initial);
  // Keeps a mutable object (namespace, loop, macro, cycler) alive until the render ends, then
  // clears it: reference cycles through it are broken, and no chain of such objects is ever
  // destroyed recursively (a hostile template could build one a million long).
  void register_object(const std::shared_ptr<Object>& o);
  // Calls a macro (see MacroObject in interp.cpp).
  Value call_macro(const MacroDef& m, const std::shared_ptr<Scope>& def_scope, CallArgs& args,
                   const Value& caller);
  [[noreturn]] void undefined_error(const Value& v) const;

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Flow exec(const Body& body);
  Flow exec(const Stmt& s);
  Flow exec_for(const Stmt& s);
  Value eval(const Expr& e);
  Value eval_binary(const Expr& e);
  Value eval_compare(const Expr& e);
  void args_of(const Expr& e, size_t first, CallArgs& out);
  void assign(const Target& t, const Value& v, int line);
  Value lookup(const std::string& name) const;
  void emit(const TString& s);
  TString capture(const Body& body);

  struct DepthGuard;

  const Limits& limits_;
  std::tm now_;
  uint64_t steps_ = 0;
  int eval_depth_ = 0;
  int call_depth_ = 0;
  TString* out_ = nullptr;
  std::shared_ptr<Scope> scope_;
  std::shared_ptr<Scope> root_;
  std::unordered_map<std::string, Value> globals_;
  std::vector<std::shared_ptr<Object>> objects_;
  const Value* filter_input_ = nullptr;
};

// Python's `item in container` (substring, list membership, dict key).
bool contains(Interp& in, const Value& container, const Value& item);

// Builtins (builtins.cpp, methods.cpp).
Value call_filter(Interp& in, const std::string& name, const Value& input, CallArgs& args);
bool call_test(Interp& in, const std::string& name, const Value& input, CallArgs& args);
bool filter_exists(const std::string& name);
bool test_exists(const std::string& name);
// A method of a str/dict/list value (`s.strip`), or nullopt when the type has none by that name.
std::optional<Value> bound_method(const Value& self, const std::string& name);
std::unordered_map<std::string, Value> make_globals();
// json.dumps as Hugging Face's tojson filter calls it.
TString to_json(Interp& in, const Value& v, const Value& indent, const std::string& item_sep,
                const std::string& key_sep, bool sort_keys, bool ensure_ascii);

// A builtin callable.
class NativeFunction : public Object {
 public:
  using Fn = std::function<Value(Interp&, CallArgs&)>;
  NativeFunction(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  std::string type_name() const override { return "builtin_function_or_method"; }
  bool callable() const override { return true; }
  Value call(Interp& in, CallArgs& args) override { return fn_(in, args); }
  TString repr(int) const override { return TString("<built-in function " + name_ + ">"); }

 private:
  std::string name_;
  Fn fn_;
};

// Positional-or-keyword argument binding for builtins: arg(args, 0, "width") is the first
// positional argument or the keyword `width`, or nullptr.
const Value* arg(const CallArgs& args, size_t pos, const char* name);
// Throws when args has positional arguments past `max_pos` or keywords not in `names`.
void check_args(const CallArgs& args, const char* fn, size_t max_pos, std::initializer_list<const char*> names);

}  // namespace fathom::jinja
