// Methods of str, dict and list values as templates call them (`content.strip()`,
// `message.get('x')`, `tools.items()`). Substring results keep their taint ranges exactly; other
// results are tainted wholly when their input was. Mutating methods of the immutable sandbox
// (list.append, dict.update, ...) raise, as jinja2's ImmutableSandboxedEnvironment does.
#include <algorithm>
#include <set>

#include "base/jinja/error.h"
#include "base/jinja/interp.h"
#include "base/jinja/strings.h"

namespace fathom::jinja {

namespace {

std::string as_string_arg(const Value* v, const char* what) {
  if (!v || !v->is_string()) throw Error(std::string(what) + " must be a string");
  return v->text();
}

Value str_method(Interp& in, const Value& self, const std::string& name, CallArgs& a) {
  const TString& s = *self.s;
  const std::string& t = s.text;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    check_args(a, name.c_str(), 1, {});
    const Value* chars = arg(a, 0, "chars");
    const bool has_chars = chars && !chars->is_none();
    if (has_chars && !chars->is_string()) throw Error(name + " arg must be None or str");
    return Value::string(py_strip(s, has_chars ? &chars->text() : nullptr, name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    check_args(a, name.c_str(), 2, {"sep", "maxsplit"});
    const Value* sep = arg(a, 0, "sep");
    const Value* maxv = arg(a, 1, "maxsplit");
    const int64_t maxsplit = maxv && maxv->is_integer() ? maxv->i : -1;
    List out;
    const bool has_sep = sep && !sep->is_none();
    const std::string sep_text = has_sep ? as_string_arg(sep, "sep") : std::string();
    for (TString& part : py_split(s, has_sep ? &sep_text : nullptr, maxsplit, name == "rsplit"))
      out.push_back(Value::string(std::move(part)));
    in.charge_list(out.size());
    return Value::make_list(std::move(out));
  }
  if (name == "splitlines") {
    List out;
    for (TString& part : py_splitlines(s)) out.push_back(Value::string(std::move(part)));
    in.charge_list(out.size());
    return Value::make_list(std::move(out));
  }
  if (name == "startswith" || name == "endswith") {
    if (a.pos.empty()) throw Error(name + "() takes at least 1 argument");
    const Value& p = a.pos[0];
    List prefixes = p.is_list() && p.tuple ? *p.list : List{p};
    for (const Value& x : prefixes) {
      if (!x.is_string()) throw Error(name + " first arg must be str or a tuple of str");
      const std::string& q = x.text();
      if (q.size() > t.size()) continue;
      if (name == "startswith" ? t.compare(0, q.size(), q) == 0 : t.compare(t.size() - q.size(), q.size(), q) == 0)
        return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "upper") return Value::string(s.derived(py_upper(t)));
  if (name == "lower") return Value::string(s.derived(py_lower(t)));
  if (name == "title") return Value::string(s.derived(py_title(t)));
  if (name == "capitalize") return Value::string(s.derived(py_capitalize(t)));
  if (name == "swapcase") return Value::string(s.derived(py_swapcase(t)));
  if (name == "replace") {
    if (a.pos.size() < 2) throw Error("replace() takes at least 2 arguments");
    const Value& old_v = a.pos[0];
    const Value& new_v = a.pos[1];
    if (!old_v.is_string() || !new_v.is_string()) throw Error("replace() arguments must be str");
    const int64_t count = a.pos.size() > 2 && a.pos[2].is_integer() ? a.pos[2].i : -1;
    return Value::string(py_replace(in, s, old_v.text(), *new_v.s, count));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    if (a.pos.empty() || !a.pos[0].is_string()) throw Error(name + "() argument must be str");
    const std::string& sub = a.pos[0].text();
    if (name == "count") {
      if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_len(t)) + 1);
      int64_t n = 0;
      for (size_t p = t.find(sub); p != std::string::npos; p = t.find(sub, p + sub.size())) ++n;
      return Value::integer(n);
    }
    const size_t p = name[0] == 'r' ? t.rfind(sub) : t.find(sub);
    if (p == std::string::npos) {
      if (name == "index" || name == "rindex") throw Error("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(static_cast<int64_t>(utf8_len(std::string_view(t).substr(0, p))));
  }
  if (name == "join") {
    if (a.pos.size() != 1) throw Error("join() takes exactly one argument");
    TString out;
    bool first = true;
    for (const Value& x : in.iterate(a.pos[0])) {
      if (!x.is_string()) throw Error("sequence item: expected str instance, " + type_name(x) + " found");
      if (!first) out.append(s);
      first = false;
      out.append(*x.s);
      in.charge_string(out.size());
    }
    return Value::string(std::move(out));
  }
  if (name == "format") return Value::string(py_format(in, s, a));
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal" || name == "isalpha" || name == "isalnum" ||
      name == "isspace" || name == "islower" || name == "isupper") {
    return Value::boolean(py_is(name, t));
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    const Value* w = arg(a, 0, "width");
    if (!w || !w->is_integer()) throw Error(name + "() width must be an integer");
    const Value* fill = arg(a, 1, "fillchar");
    const std::string f = fill && fill->is_string() ? fill->text() : " ";
    const int64_t len = static_cast<int64_t>(utf8_len(t));
    const int64_t pad = std::max<int64_t>(0, w->i - len);
    in.charge_string(t.size() + static_cast<size_t>(pad) * f.size());
    int64_t left = name == "ljust" ? 0 : name == "rjust" ? pad : pad / 2 + (pad & w->i & 1);
    TString out;
    for (int64_t k = 0; k < left; ++k) out.append(f);
    out.append(s);
    for (int64_t k = 0; k < pad - left; ++k) out.append(f);
    return Value::string(std::move(out));
  }
  throw Error("'str' object has no attribute '" + name + "'");
}

const std::set<std::string>& str_methods() {
  static const std::set<std::string> m{"strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith",
                                       "upper", "lower", "title", "capitalize", "swapcase", "replace", "find", "rfind", "index",
                                       "rindex", "count", "join", "format", "isdigit", "isnumeric", "isdecimal", "isalpha",
                                       "isalnum", "isspace", "islower", "isupper", "center", "ljust", "rjust"};
  return m;
}
const std::set<std::string>& dict_methods() {
  static const std::set<std::string> m{"items", "keys", "values", "get", "copy"};
  return m;
}
const std::set<std::string>& dict_unsafe() {
  static const std::set<std::string> m{"pop", "popitem", "setdefault", "update", "clear"};
  return m;
}
const std::set<std::string>& list_methods() {
  static const std::set<std::string> m{"index", "count", "copy"};
  return m;
}
const std::set<std::string>& list_unsafe() {
  static const std::set<std::string> m{"append", "extend", "insert", "pop", "remove", "reverse", "sort", "clear"};
  return m;
}

Value dict_method(Interp& in, const Value& self, const std::string& name, CallArgs& a) {
  const Dict& d = *self.dict;
  if (name == "items" || name == "keys" || name == "values") {
    List out;
    out.reserve(d.size());
    for (const auto& [k, v] : d.items) {
      if (name == "items") out.push_back(Value::make_list({k, v}, true));
      else out.push_back(name == "keys" ? k : v);
    }
    in.charge_list(out.size());
    return Value::make_list(std::move(out));
  }
  if (name == "get") {
    if (a.pos.empty() || a.pos.size() > 2 || !a.kw.empty()) throw Error("get() takes 1 or 2 positional arguments");
    if (a.pos[0].is_list() && !a.pos[0].tuple) throw Error("unhashable type: 'list'");
    if (a.pos[0].is_dict()) throw Error("unhashable type: 'dict'");
    if (const Value* v = d.find(a.pos[0])) return *v;
    return a.pos.size() > 1 ? a.pos[1] : Value::none();
  }
  if (name == "copy") return self;
  throw Error("'dict' object has no attribute '" + name + "'");
}

Value list_method(Interp& in, const Value& self, const std::string& name, CallArgs& a) {
  if (a.pos.size() != 1 && name != "copy") throw Error(name + "() takes exactly one argument");
  if (name == "copy") return Value::make_list(*self.list, self.tuple);
  int64_t n = 0;
  for (size_t k = 0; k < self.list->size(); ++k) {
    if (equals((*self.list)[k], a.pos[0], in.depth())) {
      if (name == "index") return Value::integer(static_cast<int64_t>(k));
      ++n;
    }
  }
  if (name == "index") throw Error("value is not in list");
  return Value::integer(n);
}

}  // namespace

std::optional<Value> bound_method(const Value& self, const std::string& name) {
  using Fn = Value (*)(Interp&, const Value&, const std::string&, CallArgs&);
  Fn fn = nullptr;
  const char* type = "";
  if (self.is_string()) {
    if (str_methods().count(name)) fn = str_method;
  } else if (self.is_dict()) {
    type = "dict";
    if (dict_methods().count(name)) fn = dict_method;
    else if (dict_unsafe().count(name))
      return Value::undefined("access to attribute '" + name + "' of '" + type + "' object is unsafe.");
  } else if (self.is_list()) {
    type = self.tuple ? "tuple" : "list";
    if (list_methods().count(name)) fn = list_method;
    else if (!self.tuple && list_unsafe().count(name))
      return Value::undefined("access to attribute '" + name + "' of '" + type + "' object is unsafe.");
  }
  if (!fn) return std::nullopt;
  auto method = std::make_shared<NativeFunction>(name, [self, name, fn](Interp& in, CallArgs& a) { return fn(in, self, name, a); });
  if (self.depth + 1 > kMaxBuiltDepth) throw Error("value nesting too deep");
  method->depth = self.depth + 1;
  return Value::object(method);
}

}  // namespace fathom::jinja
