#include "base/jinja/interp.h"

#include <cmath>
#include <limits>

#include "base/jinja/error.h"
#include "base/jinja/strings.h"

namespace fathom::jinja {

namespace {

// jinja2's Namespace: attributes set with {% set ns.attr = v %}.
class Namespace : public Object {
 public:
  explicit Namespace(Dict d) : attrs_(std::move(d)) {}
  std::string type_name() const override { return "Namespace"; }
  std::optional<Value> getattr(const std::string& name) override {
    if (const Value* v = attrs_.find(name)) return *v;
    return std::nullopt;
  }
  bool setattr(const std::string& name, const Value& v) override {
    if (!name.empty() && name[0] == '_')  // Hugging Face's TemplateNamespace
      throw Error("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + name + "'");
    attrs_.set(Value::string(name), v);
    return true;
  }
  TString repr(int depth) const override {
    Value d = Value::make_dict(attrs_);
    const TString inner = jinja::repr(d, depth);
    return TString("<Namespace " + inner.text + ">", inner.tainted());
  }
  void clear() override { attrs_ = Dict(); }

 private:
  Dict attrs_;
};

// The `loop` variable of a for-loop.
class LoopObject : public Object {
 public:
  LoopObject(std::shared_ptr<const List> items, int64_t depth) : items_(std::move(items)), depth_(depth) {}
  std::string type_name() const override { return "LoopContext"; }
  void set_index(size_t i) { i_ = i; }
  std::optional<Value> getattr(const std::string& name) override {
    const auto n = static_cast<int64_t>(items_->size());
    const auto i = static_cast<int64_t>(i_);
    if (name == "index") return Value::integer(i + 1);
    if (name == "index0") return Value::integer(i);
    if (name == "revindex") return Value::integer(n - i);
    if (name == "revindex0") return Value::integer(n - i - 1);
    if (name == "first") return Value::boolean(i == 0);
    if (name == "last") return Value::boolean(i == n - 1);
    if (name == "length") return Value::integer(n);
    if (name == "depth") return Value::integer(depth_);
    if (name == "depth0") return Value::integer(depth_ - 1);
    if (name == "previtem") return i > 0 ? (*items_)[i_ - 1] : Value::undefined("there is no previous item");
    if (name == "nextitem") return i + 1 < n ? (*items_)[i_ + 1] : Value::undefined("there is no next item");
    if (name == "cycle") {
      const int64_t at = i;
      return Value::object(std::make_shared<NativeFunction>("cycle", [at](Interp&, CallArgs& a) {
        if (a.pos.empty()) throw Error("no items for cycling given");
        return a.pos[static_cast<size_t>(at % static_cast<int64_t>(a.pos.size()))];
      }));
    }
    if (name == "changed") {
      std::weak_ptr<LoopObject> self = self_;
      return Value::object(std::make_shared<NativeFunction>("changed", [self](Interp& in, CallArgs& a) {
        auto me = self.lock();
        if (!me) return Value::boolean(false);
        Value now = Value::make_list(a.pos);
        if (me->has_last_ && equals(now, me->last_changed_, in.depth())) return Value::boolean(false);
        me->last_changed_ = now;
        me->has_last_ = true;
        return Value::boolean(true);
      }));
    }
    return std::nullopt;
  }
  TString repr(int) const override { return TString("<LoopContext " + std::to_string(i_ + 1) + "/" + std::to_string(items_->size()) + ">"); }
  void clear() override {
    last_changed_ = Value();
    items_ = std::make_shared<const List>();
  }
  std::weak_ptr<LoopObject> self_;

 private:
  std::shared_ptr<const List> items_;
  size_t i_ = 0;
  int64_t depth_;
  Value last_changed_;
  bool has_last_ = false;
};

// A {% macro %} (or a {% call %} block's caller), closed over the scope it was defined in.
class MacroObject : public Object {
 public:
  MacroObject(std::shared_ptr<const MacroDef> def, std::weak_ptr<Scope> scope, Value caller)
      : def_(std::move(def)), scope_(std::move(scope)), caller_(std::move(caller)) {}
  std::string type_name() const override { return "Macro"; }
  bool callable() const override { return true; }
  Value call(Interp& in, CallArgs& args) override { return in.call_macro(*def_, scope_.lock(), args, caller_); }
  std::optional<Value> getattr(const std::string& name) override {
    if (name == "name") return Value::string(def_->name);
    return std::nullopt;
  }
  TString repr(int) const override { return TString("<Macro '" + def_->name + "'>"); }
  void clear() override { caller_ = Value(); }

 private:
  std::shared_ptr<const MacroDef> def_;
  std::weak_ptr<Scope> scope_;
  Value caller_;
};

bool checked_add(int64_t a, int64_t b, int64_t& r) { return !__builtin_add_overflow(a, b, &r); }
bool checked_sub(int64_t a, int64_t b, int64_t& r) { return !__builtin_sub_overflow(a, b, &r); }
bool checked_mul(int64_t a, int64_t b, int64_t& r) { return !__builtin_mul_overflow(a, b, &r); }

[[noreturn]] void overflow() { throw Error("integer overflow (fathom's integers are 64-bit)"); }

int64_t floordiv(int64_t a, int64_t b) {
  if (b == 0) throw Error("integer division or modulo by zero");
  if (a == std::numeric_limits<int64_t>::min() && b == -1) overflow();
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t pymod(int64_t a, int64_t b) {
  if (b == 0) throw Error("integer division or modulo by zero");
  if (b == -1) return 0;
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}
double pyfmod(double a, double b) {
  if (b == 0) throw Error("float modulo");
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  if (m == 0) m = std::copysign(0.0, b);
  return m;
}

}  // namespace

struct Interp::DepthGuard {
  Interp& in;
  explicit DepthGuard(Interp& i) : in(i) {
    if (++in.eval_depth_ > 16 * in.limits_.max_nesting)
      throw Error("template recursion too deep");
  }
  ~DepthGuard() { --in.eval_depth_; }
};

Interp::Interp(const Limits& limits, std::tm now) : limits_(limits), now_(now), globals_(make_globals()) {}

Interp::~Interp() {
  // Break reference cycles (a namespace holding itself, a loop holding a namespace holding it).
  for (auto& o : objects_) o->clear();
  objects_.clear();
  for (auto& [k, v] : globals_) v = Value();
}

void Interp::charge(uint64_t units) {
  steps_ += units;
  if (steps_ > limits_.max_steps)
    throw Error("template exceeded its work budget (" + std::to_string(limits_.max_steps) + " steps)");
}
void Interp::charge_string(size_t bytes) {
  if (bytes > limits_.max_string_bytes)
    throw Error("string too long (" + std::to_string(bytes) + " bytes, limit " + std::to_string(limits_.max_string_bytes) + ")");
  charge(1 + bytes / 16);
}
void Interp::charge_list(size_t items) {
  if (items > limits_.max_list_items)
    throw Error("list too long (" + std::to_string(items) + " items, limit " + std::to_string(limits_.max_list_items) + ")");
  charge(1 + items);
}

void Interp::register_object(const std::shared_ptr<Object>& o) {
  charge(16);  // each one is kept until the end: its memory counts against the budget
  objects_.push_back(o);
}

Value Interp::make_namespace(Dict initial) {
  auto ns = std::make_shared<Namespace>(std::move(initial));
  register_object(ns);
  return Value::object(ns);
}

void Interp::undefined_error(const Value& v) const {
  throw Error(v.hint ? *v.hint : "value is undefined");
}

TString Interp::render(const Body& body, std::unordered_map<std::string, Value> context) {
  root_ = std::make_shared<Scope>();
  root_->vars = std::move(context);
  scope_ = root_;
  TString out;
  out_ = &out;
  exec(body);
  out_ = nullptr;
  scope_.reset();
  root_.reset();
  return out;
}

void Interp::emit(const TString& s) {
  if (s.text.empty()) return;
  if (out_->size() + s.size() > limits_.max_output_bytes)
    throw Error("output too large (limit " + std::to_string(limits_.max_output_bytes) + " bytes)");
  charge(1 + s.size() / 16);
  out_->append(s);
}

TString Interp::capture(const Body& body) {
  TString buf;
  TString* saved = out_;
  out_ = &buf;
  try {
    exec(body);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buf;
}

Value Interp::lookup(const std::string& name) const {
  for (const Scope* s = scope_.get(); s; s = s->parent.get()) {
    const auto it = s->vars.find(name);
    if (it != s->vars.end()) return it->second;
  }
  const auto g = globals_.find(name);
  if (g != globals_.end()) return g->second;
  return Value::undefined("'" + name + "' is undefined");
}

Interp::Flow Interp::exec(const Body& body) {
  for (const StmtP& s : body) {
    const Flow f = exec(*s);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

void Interp::assign(const Target& t, const Value& v, int line) {
  if (!t.items.empty()) {
    const List items = iterate(v);
    if (items.size() != t.items.size())
      throw Error(items.size() > t.items.size() ? "too many values to unpack (expected " + std::to_string(t.items.size()) + ")"
                                                : "not enough values to unpack (expected " + std::to_string(t.items.size()) +
                                                      ", got " + std::to_string(items.size()) + ")",
                  line);
    for (size_t k = 0; k < items.size(); ++k) assign(t.items[k], items[k], line);
    return;
  }
  if (!t.attr.empty()) {
    const Value ns = lookup(t.name);
    if (ns.kind != Kind::kObject || !ns.obj->setattr(t.attr, v))
      throw Error("can't assign attribute '" + t.attr + "' on a non-namespace object", line);
    return;
  }
  scope_->vars[t.name] = v;
}

Interp::Flow Interp::exec(const Stmt& s) {
  DepthGuard guard(*this);
  charge(1);
  try {
    switch (s.k) {
      case Stmt::K::kText: emit(s.text); return Flow::kNormal;
      case Stmt::K::kOutput: {
        const Value v = eval(*s.e);
        if (v.kind == Kind::kString) emit(*v.s);
        else if (v.kind != Kind::kUndefined) emit(to_str(v, depth()));
        return Flow::kNormal;
      }
      case Stmt::K::kIf:
        for (const auto& [cond, body] : s.branches)
          if (truthy(eval(*cond))) return exec(body);
        return exec(s.else_body);
      case Stmt::K::kFor: return exec_for(s);
      case Stmt::K::kSet: assign(s.target, eval(*s.e), s.line); return Flow::kNormal;
      case Stmt::K::kSetBlock: {
        Value v = Value::string(capture(s.body));
        if (s.e) {
          filter_input_ = &v;
          v = eval(*s.e);
        }
        assign(s.target, v, s.line);
        return Flow::kNormal;
      }
      case Stmt::K::kMacro: {
        auto m = std::make_shared<MacroObject>(s.macro, scope_, Value());
        register_object(m);
        scope_->vars[s.macro->name] = Value::object(m);
        return Flow::kNormal;
      }
      case Stmt::K::kCallBlock: {
        auto caller = std::make_shared<MacroObject>(s.macro, scope_, Value());
        register_object(caller);
        const Expr& call = *s.e;
        Value fn = eval(*call.a[0]);
        CallArgs args;
        args_of(call, 1, args);
        args.kw.emplace_back("caller", Value::object(caller));
        const Value v = this->call(fn, args);
        if (v.kind == Kind::kString) emit(*v.s);
        else if (v.kind != Kind::kUndefined) emit(to_str(v, depth()));
        return Flow::kNormal;
      }
      case Stmt::K::kFilterBlock: {
        Value v = Value::string(capture(s.body));
        filter_input_ = &v;
        const Value r = eval(*s.e);
        emit(to_str(r, depth()));
        return Flow::kNormal;
      }
      case Stmt::K::kWith: {
        auto inner = std::make_shared<Scope>();
        inner->parent = scope_;
        std::vector<Value> values;
        for (const auto& [t, e] : s.assigns) values.push_back(eval(*e));
        auto saved = scope_;
        scope_ = inner;
        try {
          for (size_t k = 0; k < values.size(); ++k) assign(s.assigns[k].first, values[k], s.line);
          const Flow f = exec(s.body);
          scope_ = saved;
          return f;
        } catch (...) {
          scope_ = saved;
          throw;
        }
      }
      case Stmt::K::kBody: return exec(s.body);
      case Stmt::K::kBreak: return Flow::kBreak;
      case Stmt::K::kContinue: return Flow::kContinue;
    }
  } catch (const Error& e) {
    if (e.line() == 0) throw Error(e.message(), s.line);
    throw;
  }
  return Flow::kNormal;
}

Interp::Flow Interp::exec_for(const Stmt& s) {
  const Value seq = eval(*s.e);
  std::shared_ptr<const List> shared;
  if (seq.is_list() && !s.cond) {
    shared = seq.list;  // lists are immutable: iterate the value itself
    if (shared->empty()) return exec(s.else_body);
  }
  List items = shared ? List() : iterate(seq);
  if (s.cond) {
    List kept;
    auto saved = scope_;
    for (Value& item : items) {
      charge(1);
      auto it_scope = std::make_shared<Scope>();
      it_scope->parent = saved;
      scope_ = it_scope;
      try {
        assign(s.target, item, s.line);
        const bool keep = truthy(eval(*s.cond));
        scope_ = saved;
        if (keep) kept.push_back(std::move(item));
      } catch (...) {
        scope_ = saved;
        throw;
      }
    }
    items = std::move(kept);
  }
  if (!shared) {
    if (items.empty()) return exec(s.else_body);
    shared = std::make_shared<const List>(std::move(items));
  }
  auto loop = std::make_shared<LoopObject>(shared, 1);  // depth > 1 only in recursive loops
  loop->self_ = loop;
  register_object(loop);
  const Value loop_value = Value::object(loop);
  auto saved = scope_;
  std::shared_ptr<Scope> it_scope;
  try {
    for (size_t k = 0; k < shared->size(); ++k) {
      charge(1);
      loop->set_index(k);
      // A fresh scope per iteration (jinja2: nothing set in one iteration is seen by the next);
      // the previous one is reused when nothing else holds it.
      if (it_scope && it_scope.use_count() == 1 && it_scope->parent == saved) {
        it_scope->vars.clear();
      } else {
        it_scope = std::make_shared<Scope>();
        it_scope->parent = saved;
      }
      scope_ = it_scope;
      it_scope->vars["loop"] = loop_value;
      assign(s.target, (*shared)[k], s.line);
      const Flow f = exec(s.body);
      scope_ = saved;
      if (f == Flow::kBreak) break;
    }
  } catch (...) {
    scope_ = saved;
    throw;
  }
  return Flow::kNormal;
}

List Interp::iterate(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return {};
    case Kind::kList: return *v.list;
    case Kind::kDict: {
      List keys;
      keys.reserve(v.dict->size());
      for (const auto& [k, x] : v.dict->items) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      List chars;
      const std::string& t = v.text();
      for (size_t i = 0; i < t.size();) {
        const size_t b = i;
        utf8_next(t, i);
        chars.push_back(Value::string(v.s->substr(b, i - b)));
      }
      charge_list(chars.size());
      return chars;
    }
    default: throw Error("'" + type_name(v) + "' object is not iterable");
  }
}

Value Interp::call_macro(const MacroDef& m, const std::shared_ptr<Scope>& def_scope, CallArgs& args, const Value& caller) {
  if (call_depth_ >= limits_.max_call_depth)
    throw Error("macro recursion too deep (limit " + std::to_string(limits_.max_call_depth) + ")");
  auto inner = std::make_shared<Scope>();
  inner->parent = def_scope ? def_scope : root_;
  const size_t first_default = m.params.size() - m.defaults.size();
  List varargs;
  Dict kwargs;
  for (size_t k = 0; k < args.pos.size(); ++k) {
    if (k < m.params.size()) inner->vars[m.params[k]] = args.pos[k];
    else varargs.push_back(args.pos[k]);
  }
  for (auto& [name, v] : args.kw) {
    bool found = false;
    for (size_t k = 0; k < m.params.size(); ++k) {
      if (m.params[k] == name) {
        if (k < args.pos.size()) throw Error("macro '" + m.name + "' got multiple values for argument '" + name + "'");
        inner->vars[name] = v;
        found = true;
      }
    }
    if (!found) {
      if (name == "caller") inner->vars["caller"] = v;
      else kwargs.set(Value::string(name), v);
    }
  }
  if (!caller.is_undefined() && !inner->vars.count("caller")) inner->vars["caller"] = caller;
  auto saved_scope = scope_;
  scope_ = inner;
  ++call_depth_;
  try {
    for (size_t k = 0; k < m.params.size(); ++k) {
      if (inner->vars.count(m.params[k])) continue;
      if (k >= first_default) inner->vars[m.params[k]] = eval(*m.defaults[k - first_default]);
      else inner->vars[m.params[k]] = Value::undefined("parameter '" + m.params[k] + "' was not provided");
    }
    inner->vars["varargs"] = Value::make_list(std::move(varargs), true);
    inner->vars["kwargs"] = Value::make_dict(std::move(kwargs));
    TString out = capture(m.body);
    --call_depth_;
    scope_ = saved_scope;
    return Value::string(std::move(out));
  } catch (...) {
    --call_depth_;
    scope_ = saved_scope;
    throw;
  }
}

void Interp::args_of(const Expr& e, size_t first, CallArgs& out) {
  for (size_t k = first; k < e.a.size(); ++k) out.pos.push_back(eval(*e.a[k]));
  for (const auto& [name, x] : e.kwargs) out.kw.emplace_back(name, eval(*x));
}

Value Interp::call(const Value& fn, CallArgs& args) {
  charge(1);
  if (fn.is_undefined()) undefined_error(fn);
  if (fn.kind == Kind::kObject && fn.obj->callable()) return fn.obj->call(*this, args);
  throw Error("'" + type_name(fn) + "' object is not callable");
}

Value Interp::getattr(const Value& obj, const std::string& name) {
  switch (obj.kind) {
    case Kind::kUndefined: undefined_error(obj);
    case Kind::kDict:
      if (auto m = bound_method(obj, name)) return *m;
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined("'dict object' has no attribute '" + name + "'");
    case Kind::kObject:
      if (auto v = obj.obj->getattr(name)) return *v;
      return Value::undefined("'" + obj.obj->type_name() + " object' has no attribute '" + name + "'");
    case Kind::kString:
    case Kind::kList:
      if (auto m = bound_method(obj, name)) return *m;
      break;
    default: break;
  }
  return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + name + "'");
}

Value Interp::getitem(const Value& obj, const Value& key) {
  switch (obj.kind) {
    case Kind::kUndefined: undefined_error(obj);
    case Kind::kDict:
      if (const Value* v = obj.dict->find(key)) return *v;
      if (key.is_string()) {
        if (auto m = bound_method(obj, key.text())) return *m;
      }
      return Value::undefined("'dict object' has no attribute '" + to_str(key, depth()).text + "'");
    case Kind::kList:
      if (obj.lazy) return Value::undefined("'generator' object is not subscriptable");
      if (key.is_integer()) {
        const auto n = static_cast<int64_t>(obj.list->size());
        int64_t i = key.i;
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined(type_name(obj) + " object has no element " + std::to_string(key.i));
        return (*obj.list)[static_cast<size_t>(i)];
      }
      break;
    case Kind::kString:
      if (key.is_integer()) {
        const std::string& t = obj.text();
        const auto n = static_cast<int64_t>(utf8_len(t));
        int64_t i = key.i;
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("str object has no element " + std::to_string(key.i));
        const size_t b = utf8_offset(t, static_cast<size_t>(i));
        size_t e = b;
        utf8_next(t, e);
        return Value::string(obj.s->substr(b, e - b));
      }
      break;
    default: break;
  }
  if (key.is_string()) return getattr(obj, key.text());
  return Value::undefined("'" + type_name(obj) + " object' has no attribute '" + to_str(key, depth()).text + "'");
}

Value Interp::filter(const std::string& name, const Value& input, CallArgs& args) {
  charge(1);
  return call_filter(*this, name, input, args);
}
bool Interp::test(const std::string& name, const Value& input, CallArgs& args) {
  charge(1);
  return call_test(*this, name, input, args);
}
bool Interp::has_filter(const std::string& name) const { return filter_exists(name); }
bool Interp::has_test(const std::string& name) const { return test_exists(name); }

namespace {

// Python's slice.indices(length) for step != 0.
void slice_indices(const Value* lo, const Value* hi, const Value* st, int64_t n, int64_t& start, int64_t& stop, int64_t& step) {
  auto num = [](const Value* v, const char* what) -> std::optional<int64_t> {
    if (!v || v->is_none()) return std::nullopt;
    if (!v->is_integer()) throw Error(std::string("slice ") + what + " must be an integer or None");
    return v->i;
  };
  step = num(st, "step").value_or(1);
  if (step == 0) throw Error("slice step cannot be zero");
  const auto clamp = [&](std::optional<int64_t> x, int64_t def_pos, int64_t def_neg) {
    if (!x) return step > 0 ? def_pos : def_neg;
    int64_t v = *x;
    if (v < 0) {
      v += n;
      if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= n) {
      v = step < 0 ? n - 1 : n;
    }
    return v;
  };
  start = clamp(num(lo, "start"), 0, n - 1);
  stop = clamp(num(hi, "stop"), n, -1);
}

}  // namespace

Value Interp::eval(const Expr& e) {
  DepthGuard guard(*this);
  charge(1);
  try {
    switch (e.k) {
      case Expr::K::kLiteral: return e.value;
      case Expr::K::kName: return lookup(e.name);
      case Expr::K::kAttr: return getattr(eval(*e.a[0]), e.name);
      case Expr::K::kItem: {
        const Value obj = eval(*e.a[0]);
        return getitem(obj, eval(*e.a[1]));
      }
      case Expr::K::kSlice: {
        const Value obj = eval(*e.a[0]);
        Value parts[3];
        for (int k = 0; k < 3; ++k)
          if (e.a[static_cast<size_t>(k) + 1]) parts[k] = eval(*e.a[static_cast<size_t>(k) + 1]);
        const Value* p[3];
        for (int k = 0; k < 3; ++k) p[k] = e.a[static_cast<size_t>(k) + 1] ? &parts[k] : nullptr;
        if (obj.is_undefined()) undefined_error(obj);
        int64_t start, stop, step;
        if (obj.is_list() && !obj.lazy) {
          slice_indices(p[0], p[1], p[2], static_cast<int64_t>(obj.list->size()), start, stop, step);
          List out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back((*obj.list)[static_cast<size_t>(i)]);
          charge_list(out.size());
          return Value::make_list(std::move(out), obj.tuple);
        }
        if (obj.is_string()) {
          const std::string& t = obj.text();
          std::vector<size_t> offs;  // byte offset of each code point, plus the end
          for (size_t i = 0; i < t.size();) {
            offs.push_back(i);
            utf8_next(t, i);
          }
          offs.push_back(t.size());
          const auto n = static_cast<int64_t>(offs.size() - 1);
          slice_indices(p[0], p[1], p[2], n, start, stop, step);
          charge_string(t.size());
          if (step == 1) {
            if (stop <= start) return Value::string(TString());
            const size_t b = offs[static_cast<size_t>(start)], en = offs[static_cast<size_t>(stop)];
            return Value::string(obj.s->substr(b, en - b));
          }
          TString out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            const size_t b = offs[static_cast<size_t>(i)];
            out.append(obj.s->substr(b, offs[static_cast<size_t>(i) + 1] - b));
          }
          return Value::string(std::move(out));
        }
        // jinja2 compiles a slice to a plain Python subscript: anything else raises.
        throw Error("'" + type_name(obj) + "' object is not subscriptable");
      }
      case Expr::K::kCall: {
        const Value fn = eval(*e.a[0]);
        CallArgs args;
        args_of(e, 1, args);
        return call(fn, args);
      }
      case Expr::K::kFilter: {
        Value input;
        if (e.a[0]) {
          input = eval(*e.a[0]);
        } else if (filter_input_) {
          input = *filter_input_;
        }
        CallArgs args;
        args_of(e, 1, args);
        return filter(e.name, input, args);
      }
      case Expr::K::kTest: {
        const Value input = eval(*e.a[0]);
        CallArgs args;
        args_of(e, 1, args);
        return Value::boolean(test(e.name, input, args));
      }
      case Expr::K::kNeg:
      case Expr::K::kPos: {
        const Value v = eval(*e.a[0]);
        if (v.is_undefined()) undefined_error(v);
        if (v.kind == Kind::kFloat) return Value::number(e.k == Expr::K::kNeg ? -v.f : v.f);
        if (v.is_integer()) {
          if (e.k == Expr::K::kPos) return Value::integer(v.i);
          if (v.i == std::numeric_limits<int64_t>::min()) overflow();
          return Value::integer(-v.i);
        }
        throw Error("bad operand type for unary " + std::string(e.k == Expr::K::kNeg ? "-" : "+") + ": '" + type_name(v) + "'");
      }
      case Expr::K::kNot: return Value::boolean(!truthy(eval(*e.a[0])));
      case Expr::K::kBinary: return eval_binary(e);
      case Expr::K::kCompare: return eval_compare(e);
      case Expr::K::kCond:
        if (truthy(eval(*e.a[0]))) return eval(*e.a[1]);
        if (e.a[2]) return eval(*e.a[2]);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
      case Expr::K::kList:
      case Expr::K::kTuple: {
        List items;
        for (const ExprP& x : e.a) items.push_back(eval(*x));
        return Value::make_list(std::move(items), e.k == Expr::K::kTuple);
      }
      case Expr::K::kDict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.a.size(); k += 2) {
          Value key = eval(*e.a[k]);
          d.set(key, eval(*e.a[k + 1]));
        }
        return Value::make_dict(std::move(d));
      }
    }
  } catch (const Error& err) {
    if (err.line() == 0) throw Error(err.message(), e.line);
    throw;
  }
  return Value();
}

bool contains(Interp& in, const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::kString:
      if (!item.is_string()) throw Error("'in <string>' requires string as left operand, not " + type_name(item));
      return container.text().find(item.text()) != std::string::npos;
    case Kind::kList:
      for (const Value& x : *container.list)
        if (equals(x, item, in.depth())) return true;
      return false;
    case Kind::kDict:
      if (item.kind == Kind::kList && !item.tuple) throw Error("unhashable type: 'list'");
      if (item.kind == Kind::kDict) throw Error("unhashable type: 'dict'");
      return container.dict->find(item) != nullptr;
    case Kind::kUndefined: return false;
    default: throw Error("argument of type '" + type_name(container) + "' is not iterable");
  }
}

Value Interp::eval_compare(const Expr& e) {
  Value left = eval(*e.a[0]);
  for (size_t k = 0; k < e.ops.size(); ++k) {
    Value right = eval(*e.a[k + 1]);
    const std::string& op = e.ops[k];
    bool r;
    if (op == "==") r = equals(left, right, depth());
    else if (op == "!=") r = !equals(left, right, depth());
    else if (op == "in") r = contains(*this, right, left);
    else if (op == "notin") r = !contains(*this, right, left);
    else {
      if (left.is_undefined()) undefined_error(left);
      if (right.is_undefined()) undefined_error(right);
      const int c = compare(left, right, depth());
      r = op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
    }
    if (!r) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

namespace {

Value repeat(Interp& in, const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const size_t len = seq.text().size();
    if (len && static_cast<uint64_t>(n) > in.limits().max_string_bytes / len + 1) in.charge_string(in.limits().max_string_bytes + 1);
    in.charge_string(len * static_cast<size_t>(n));
    TString out;
    for (int64_t k = 0; k < n; ++k) out.append(*seq.s);
    return Value::string(std::move(out));
  }
  const size_t len = seq.list->size();
  if (len && static_cast<uint64_t>(n) > in.limits().max_list_items / len + 1) in.charge_list(in.limits().max_list_items + 1);
  in.charge_list(len * static_cast<size_t>(n));
  List out;
  for (int64_t k = 0; k < n; ++k) out.insert(out.end(), seq.list->begin(), seq.list->end());
  return Value::make_list(std::move(out), seq.tuple);
}

double int_pow_float(double a, double b) {
  const double r = std::pow(a, b);
  return r;
}

}  // namespace

Value Interp::eval_binary(const Expr& e) {
  const std::string& op = e.name;
  if (op == "and") {
    Value l = eval(*e.a[0]);
    return truthy(l) ? eval(*e.a[1]) : l;
  }
  if (op == "or") {
    Value l = eval(*e.a[0]);
    return truthy(l) ? l : eval(*e.a[1]);
  }
  const Value l = eval(*e.a[0]);
  const Value r = eval(*e.a[1]);
  if (op == "~") {
    TString s = to_str(l, depth());
    const TString t = to_str(r, depth());
    charge_string(s.size() + t.size());
    s.append(t);
    return Value::string(std::move(s));
  }
  if (l.is_undefined()) undefined_error(l);
  if (r.is_undefined()) undefined_error(r);
  const auto type_error = [&]() -> Error {
    return Error("unsupported operand type(s) for " + op + ": '" + type_name(l) + "' and '" + type_name(r) + "'");
  };
  if (l.is_number() && r.is_number()) {
    const bool ints = l.is_integer() && r.is_integer();
    int64_t x;
    if (op == "+") {
      if (!ints) return Value::number(l.as_double() + r.as_double());
      if (!checked_add(l.i, r.i, x)) overflow();
      return Value::integer(x);
    }
    if (op == "-") {
      if (!ints) return Value::number(l.as_double() - r.as_double());
      if (!checked_sub(l.i, r.i, x)) overflow();
      return Value::integer(x);
    }
    if (op == "*") {
      if (!ints) return Value::number(l.as_double() * r.as_double());
      if (!checked_mul(l.i, r.i, x)) overflow();
      return Value::integer(x);
    }
    if (op == "/") {
      if (r.as_double() == 0) throw Error("division by zero");
      return Value::number(l.as_double() / r.as_double());
    }
    if (op == "//") {
      if (ints) return Value::integer(floordiv(l.i, r.i));
      if (r.as_double() == 0) throw Error("float floor division by zero");
      return Value::number(std::floor(l.as_double() / r.as_double()));
    }
    if (op == "%") {
      if (ints) return Value::integer(pymod(l.i, r.i));
      return Value::number(pyfmod(l.as_double(), r.as_double()));
    }
    if (op == "**") {
      if (ints && r.i >= 0) {
        int64_t result = 1, base = l.i, exp = r.i;
        while (exp > 0) {
          if (exp & 1) {
            if (!checked_mul(result, base, result)) overflow();
          }
          exp >>= 1;
          if (exp > 0 && !checked_mul(base, base, base)) overflow();
        }
        return Value::integer(result);
      }
      if (l.as_double() == 0 && r.as_double() < 0) throw Error("0.0 cannot be raised to a negative power");
      if (l.as_double() < 0 && r.as_double() != std::floor(r.as_double()))
        throw Error("a negative number to a fractional power is complex: not supported");
      return Value::number(int_pow_float(l.as_double(), r.as_double()));
    }
    throw type_error();
  }
  if (op == "+") {
    if (l.is_string() && r.is_string()) {
      charge_string(l.text().size() + r.text().size());
      // markupsafe: Markup + str escapes the str (and str + Markup), the result is Markup.
      const bool markup = l.markup || r.markup;
      TString s = markup && !l.markup ? html_escape(*l.s) : *l.s;
      s.append(markup && !r.markup ? html_escape(*r.s) : *r.s);
      Value v = Value::string(std::move(s));
      v.markup = markup;
      return v;
    }
    if (l.is_list() && r.is_list() && l.tuple == r.tuple && !l.lazy && !r.lazy) {
      charge_list(l.list->size() + r.list->size());
      List out = *l.list;
      out.insert(out.end(), r.list->begin(), r.list->end());
      return Value::make_list(std::move(out), l.tuple);
    }
    if (l.is_string() && !r.is_string()) throw Error("can only concatenate str (not \"" + type_name(r) + "\") to str");
    throw type_error();
  }
  if (op == "*") {
    if ((l.is_string() || l.is_list()) && r.is_integer()) return repeat(*this, l, r.i);
    if ((r.is_string() || r.is_list()) && l.is_integer()) return repeat(*this, r, l.i);
    throw Error("can't multiply sequence by non-int of type '" + type_name(l.is_string() || l.is_list() ? r : l) + "'");
  }
  if (op == "%" && l.is_string()) return Value::string(py_percent_format(*this, *l.s, r));
  throw type_error();
}

}  // namespace fathom::jinja
