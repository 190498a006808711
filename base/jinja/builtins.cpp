// jinja2's filters, tests and globals (as far as chat templates use them), and Hugging Face's
// additions: the tojson override, raise_exception, strftime_now, the underscore-refusing namespace.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "base/jinja/error.h"
#include "base/jinja/interp.h"
#include "base/jinja/strings.h"

namespace fathom::jinja {

const Value* arg(const CallArgs& args, size_t pos, const char* name) {
  if (pos < args.pos.size()) return &args.pos[pos];
  for (const auto& [k, v] : args.kw)
    if (k == name) return &v;
  return nullptr;
}

void check_args(const CallArgs& args, const char* fn, size_t max_pos, std::initializer_list<const char*> names) {
  if (args.pos.size() > max_pos) throw Error(std::string(fn) + "() got too many positional arguments");
  for (const auto& [k, v] : args.kw) {
    bool ok = false;
    for (const char* n : names) ok = ok || k == n;
    if (!ok) throw Error(std::string(fn) + "() got an unexpected keyword argument '" + k + "'");
  }
}

namespace {

using FilterFn = Value (*)(Interp&, const Value&, CallArgs&);
using TestFn = bool (*)(Interp&, const Value&, CallArgs&);

TString str_of(Interp& in, const Value& v) { return v.is_undefined() ? TString() : to_str(v, in.depth()); }

bool arg_bool(const CallArgs& a, size_t pos, const char* name, bool def) {
  const Value* v = arg(a, pos, name);
  return v ? truthy(*v) : def;
}

int64_t len_of(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return 0;
    case Kind::kString: return static_cast<int64_t>(utf8_len(v.text()));
    case Kind::kList:
      if (v.lazy) throw Error("object of type 'generator' has no len()");
      return static_cast<int64_t>(v.list->size());
    case Kind::kDict: return static_cast<int64_t>(v.dict->size());
    default: throw Error("object of type '" + type_name(v) + "' has no len()");
  }
}

// jinja2's make_attrgetter: "a.b.0" walks attributes / items.
Value attr_path(Interp& in, const Value& v, const Value& path) {
  if (path.is_integer()) return in.getitem(v, path);
  if (!path.is_string()) throw Error("attribute must be a string or an integer");
  Value cur = v;
  const std::string& p = path.text();
  size_t start = 0;
  while (true) {
    const size_t dot = p.find('.', start);
    const std::string part = p.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!part.empty() && part.find_first_not_of("0123456789") == std::string::npos && part.size() < 18)
      cur = in.getitem(cur, Value::integer(std::stoll(part)));
    else
      cur = in.getitem(cur, Value::string(part));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

Value lower_key(const Value& v) {
  if (v.is_string()) return Value::string(py_lower(v.text()));
  return v;
}

// ---- filters ----

Value f_length(Interp&, const Value& v, CallArgs&) { return Value::integer(len_of(v)); }

Value f_first(Interp& in, const Value& v, CallArgs&) {
  List items = in.iterate(v);
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}
Value f_last(Interp& in, const Value& v, CallArgs&) {
  if (v.lazy) throw Error("'generator' object is not reversible");
  List items = in.iterate(v);
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_join(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "join", 2, {"d", "attribute"});
  const Value* sep = arg(a, 0, "d");
  const Value* attribute = arg(a, 1, "attribute");
  const TString s = sep ? str_of(in, *sep) : TString();
  TString out;
  bool first = true;
  for (const Value& x : in.iterate(v)) {
    if (!first) out.append(s);
    first = false;
    out.append(str_of(in, attribute && !attribute->is_none() ? attr_path(in, x, *attribute) : x));
    in.charge_string(out.size());
  }
  return Value::string(std::move(out));
}

Value f_map(Interp& in, const Value& v, CallArgs& a) {
  List out;
  if (!truthy(v)) return Value::generator({});  // jinja2: `if value:` before iterating
  const Value* attribute = nullptr;
  const Value* def = nullptr;
  for (const auto& [k, x] : a.kw) {
    if (k == "attribute") attribute = &x;
    else if (k == "default") def = &x;
  }
  if (attribute) {
    for (const Value& x : in.iterate(v)) {
      Value r = attr_path(in, x, *attribute);
      if (r.is_undefined() && def) r = *def;
      out.push_back(std::move(r));
    }
  } else {
    if (a.pos.empty() || !a.pos[0].is_string()) throw Error("map requires a filter argument");
    const std::string name = a.pos[0].text();
    CallArgs rest;
    rest.pos.assign(a.pos.begin() + 1, a.pos.end());
    rest.kw = a.kw;
    for (const Value& x : in.iterate(v)) {
      CallArgs r = rest;
      out.push_back(in.filter(name, x, r));
    }
  }
  in.charge_list(out.size());
  return Value::generator(std::move(out));
}

Value select_impl(Interp& in, const Value& v, CallArgs& a, bool by_attr, bool keep_when) {
  if (!truthy(v)) return Value::generator({});  // jinja2: `if value:` before iterating
  size_t next = 0;
  Value attribute;
  if (by_attr) {
    if (a.pos.empty()) throw Error("selectattr requires an attribute");
    attribute = a.pos[next++];
  }
  std::string test;
  if (next < a.pos.size()) {
    if (!a.pos[next].is_string()) throw Error("test name must be a string");
    test = a.pos[next++].text();
  }
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(next), a.pos.end());
  rest.kw = a.kw;
  List out;
  for (const Value& x : in.iterate(v)) {
    const Value subject = by_attr ? attr_path(in, x, attribute) : x;
    bool ok;
    if (test.empty()) {
      ok = truthy(subject);
    } else {
      CallArgs r = rest;
      ok = in.test(test, subject, r);
    }
    if (ok == keep_when) out.push_back(x);
  }
  return Value::generator(std::move(out));
}
Value f_select(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, true); }
Value f_reject(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, false, false); }
Value f_selectattr(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, true); }
Value f_rejectattr(Interp& in, const Value& v, CallArgs& a) { return select_impl(in, v, a, true, false); }

Value f_default(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "default", 2, {"default_value", "boolean"});
  const Value* d = arg(a, 0, "default_value");
  const bool boolean = arg_bool(a, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !truthy(v))) return d ? *d : Value::string("");
  return v;
}

Value f_upper(Interp& in, const Value& v, CallArgs&) {
  const TString s = str_of(in, v);
  return Value::string(s.derived(py_upper(s.text)));
}
Value f_lower(Interp& in, const Value& v, CallArgs&) {
  const TString s = str_of(in, v);
  return Value::string(s.derived(py_lower(s.text)));
}
Value f_capitalize(Interp& in, const Value& v, CallArgs&) {
  const TString s = str_of(in, v);
  return Value::string(s.derived(py_capitalize(s.text)));
}
// jinja2's title: each piece after a run of [-\s({\[<] gets an upper first letter, lower rest.
Value f_title(Interp& in, const Value& v, CallArgs&) {
  const TString s = str_of(in, v);
  std::string out;
  bool start = true;
  for (size_t i = 0; i < s.text.size();) {
    const size_t b = i;
    const uint32_t cp = utf8_next(s.text, i);
    const bool sep = py_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
    std::string ch = s.text.substr(b, i - b);
    if (!sep) ch = start ? py_upper(ch) : py_lower(ch);
    out += ch;
    start = sep;
  }
  return Value::string(s.derived(out));
}
Value f_trim(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "trim", 1, {"chars"});
  const Value* chars = arg(a, 0, "chars");
  const bool has = chars && !chars->is_none();
  const std::string c = has ? str_of(in, *chars).text : "";
  return Value::string(py_strip(str_of(in, v), has ? &c : nullptr, true, true));
}
Value f_replace(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "replace", 3, {"old", "new", "count"});
  const Value* o = arg(a, 0, "old");
  const Value* n = arg(a, 1, "new");
  if (!o || !n) throw Error("replace() missing required arguments");
  const Value* c = arg(a, 2, "count");
  const int64_t count = c && c->is_integer() ? c->i : -1;
  return Value::string(py_replace(in, str_of(in, v), str_of(in, *o).text, str_of(in, *n), count));
}
Value f_string(Interp& in, const Value& v, CallArgs&) { return Value::string(str_of(in, v)); }
Value f_safe(Interp& in, const Value& v, CallArgs&) {
  Value r = v.is_string() ? v : Value::string(str_of(in, v));
  r.markup = true;
  return r;
}
Value f_escape(Interp& in, const Value& v, CallArgs&) {
  if (v.is_string() && v.markup) return v;
  Value r = Value::string(html_escape(str_of(in, v)));
  in.charge_string(r.text().size());
  r.markup = true;
  return r;
}

// Python int(str): optional sign, digits with single underscores, surrounding whitespace.
bool parse_py_int(std::string s, int64_t& out) {
  const TString t = py_strip(TString(s), nullptr, true, true);
  s = t.text;
  std::string digits;
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
  bool prev_digit = false;
  for (; i < s.size(); ++i) {
    if (s[i] >= '0' && s[i] <= '9') {
      digits += s[i];
      prev_digit = true;
    } else if (s[i] == '_' && prev_digit && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '9') {
      prev_digit = false;
    } else {
      return false;
    }
  }
  if (digits.empty() || digits.size() > 18) return false;
  out = std::stoll(digits) * (neg ? -1 : 1);
  return true;
}
bool parse_py_float(const std::string& s, double& out) {
  const std::string t = py_strip(TString(s), nullptr, true, true).text;
  if (t.empty()) return false;
  const std::string low = py_lower(t);
  for (const char* special : {"inf", "+inf", "-inf", "infinity", "+infinity", "-infinity", "nan", "+nan", "-nan"}) {
    if (low == special) {
      out = low.find("nan") != std::string::npos ? NAN : (low[0] == '-' ? -INFINITY : INFINITY);
      return true;
    }
  }
  for (const char c : t)
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-' || c == '_')) return false;
  std::string clean;
  for (const char c : t)
    if (c != '_') clean += c;
  char* end = nullptr;
  out = std::strtod(clean.c_str(), &end);
  return end && *end == 0;
}

Value f_int(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "int", 2, {"default", "base"});
  const Value* d = arg(a, 0, "default");
  const Value def = d ? *d : Value::integer(0);
  if (v.is_undefined()) in.undefined_error(v);  // int(Undefined) raises, not caught by the filter
  if (v.is_integer()) return Value::integer(v.i);
  if (v.kind == Kind::kFloat) {
    if (!std::isfinite(v.f) || std::fabs(v.f) >= 9.2e18) return def;
    return Value::integer(static_cast<int64_t>(v.f));
  }
  if (v.is_string()) {
    int64_t x;
    if (parse_py_int(v.text(), x)) return Value::integer(x);
    double f;
    if (parse_py_float(v.text(), f) && std::isfinite(f) && std::fabs(f) < 9.2e18) return Value::integer(static_cast<int64_t>(f));
  }
  return def;
}
Value f_float(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "float", 1, {"default"});
  const Value* d = arg(a, 0, "default");
  const Value def = d ? *d : Value::number(0.0);
  if (v.is_undefined()) in.undefined_error(v);
  if (v.is_number()) return Value::number(v.as_double());
  double f;
  if (v.is_string() && parse_py_float(v.text(), f)) return Value::number(f);
  return def;
}
Value f_list(Interp& in, const Value& v, CallArgs&) {
  List items = in.iterate(v);
  in.charge_list(items.size());
  return Value::make_list(std::move(items));
}
Value f_items(Interp& in, const Value& v, CallArgs&) {
  if (v.is_undefined()) return Value::generator({});
  if (!v.is_dict()) throw Error("Can only get item pairs from a mapping.");
  List out;
  for (const auto& [k, x] : v.dict->items) out.push_back(Value::make_list({k, x}, true));
  in.charge_list(out.size());
  return Value::generator(std::move(out));
}

void sort_values(Interp& in, List& items, bool reverse, const std::function<Value(const Value&)>& key) {
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t k = 0; k < items.size(); ++k) keyed.emplace_back(key(items[k]), k);
  in.charge(items.size() * 4);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(y.first, x.first, in.depth()) < 0 : compare(x.first, y.first, in.depth()) < 0;
  });
  List out;
  for (const auto& [k, idx] : keyed) out.push_back(items[idx]);
  items = std::move(out);
}

Value f_dictsort(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "dictsort", 3, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) throw Error("dictsort requires a mapping");
  const bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* by = arg(a, 1, "by");
  const bool by_value = by && by->is_string() && by->text() == "value";
  if (by && !(by->is_string() && (by->text() == "key" || by->text() == "value")))
    throw Error("You can only sort by either \"key\" or \"value\"");
  List items;
  for (const auto& [k, x] : v.dict->items) items.push_back(Value::make_list({k, x}, true));
  sort_values(in, items, arg_bool(a, 2, "reverse", false), [&](const Value& p) {
    const Value& x = (*p.list)[by_value ? 1 : 0];
    return cs ? x : lower_key(x);
  });
  return Value::make_list(std::move(items));
}

Value f_sort(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "sort", 3, {"reverse", "case_sensitive", "attribute"});
  List items = in.iterate(v);
  const bool cs = arg_bool(a, 1, "case_sensitive", false);
  const Value* attribute = arg(a, 2, "attribute");
  sort_values(in, items, arg_bool(a, 0, "reverse", false), [&](const Value& x) {
    const Value k = attribute && !attribute->is_none() ? attr_path(in, x, *attribute) : x;
    return cs ? k : lower_key(k);
  });
  return Value::make_list(std::move(items));
}

Value f_unique(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "unique", 2, {"case_sensitive", "attribute"});
  const bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* attribute = arg(a, 1, "attribute");
  std::map<std::string, bool> seen;
  List out;
  for (const Value& x : in.iterate(v)) {
    Value k = attribute && !attribute->is_none() ? attr_path(in, x, *attribute) : x;
    if (!cs) k = lower_key(k);
    if (seen.emplace(hash_key(k), true).second) out.push_back(x);
  }
  return Value::generator(std::move(out));
}

Value min_max(Interp& in, const Value& v, CallArgs& a, bool want_max) {
  check_args(a, want_max ? "max" : "min", 2, {"case_sensitive", "attribute"});
  const bool cs = arg_bool(a, 0, "case_sensitive", false);
  const Value* attribute = arg(a, 1, "attribute");
  const List items = in.iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key;
  for (size_t k = 0; k < items.size(); ++k) {
    Value key = attribute && !attribute->is_none() ? attr_path(in, items[k], *attribute) : items[k];
    if (!cs) key = lower_key(key);
    if (k == 0 || (want_max ? compare(key, best_key, in.depth()) > 0 : compare(key, best_key, in.depth()) < 0)) {
      best = k;
      best_key = key;
    }
  }
  return items[best];
}
Value f_min(Interp& in, const Value& v, CallArgs& a) { return min_max(in, v, a, false); }
Value f_max(Interp& in, const Value& v, CallArgs& a) { return min_max(in, v, a, true); }

Value add_values(const Value& l, const Value& r) {
  if (l.is_integer() && r.is_integer()) {
    int64_t x;
    if (__builtin_add_overflow(l.i, r.i, &x)) throw Error("integer overflow (fathom's integers are 64-bit)");
    return Value::integer(x);
  }
  if (l.is_number() && r.is_number()) return Value::number(l.as_double() + r.as_double());
  throw Error("unsupported operand type(s) for +: '" + type_name(l) + "' and '" + type_name(r) + "'");
}
Value f_sum(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "sum", 2, {"attribute", "start"});
  const Value* attribute = arg(a, 0, "attribute");
  const Value* start = arg(a, 1, "start");
  Value total = start ? *start : Value::integer(0);
  for (const Value& x : in.iterate(v)) total = add_values(total, attribute && !attribute->is_none() ? attr_path(in, x, *attribute) : x);
  return total;
}
Value f_abs(Interp&, const Value& v, CallArgs&) {
  if (v.kind == Kind::kFloat) return Value::number(std::fabs(v.f));
  if (v.is_integer()) {
    if (v.i == INT64_MIN) throw Error("integer overflow (fathom's integers are 64-bit)");
    return Value::integer(v.i < 0 ? -v.i : v.i);
  }
  throw Error("bad operand type for abs(): '" + type_name(v) + "'");
}
Value f_round(Interp&, const Value& v, CallArgs& a) {
  check_args(a, "round", 2, {"precision", "method"});
  const Value* p = arg(a, 0, "precision");
  const int64_t precision = p && p->is_integer() ? p->i : 0;
  const Value* m = arg(a, 1, "method");
  const std::string method = m && m->is_string() ? m->text() : "common";
  if (!v.is_number()) throw Error("round() requires a number");
  if (method != "common" && method != "ceil" && method != "floor") throw Error("method must be common, ceil or floor");
  if (precision < -300 || precision > 300) throw Error("round() precision out of range");
  if (method == "common") {
    if (v.is_integer()) {
      if (precision >= 0) return Value::integer(v.i);
    }
    const double x = v.as_double();
    if (!std::isfinite(x)) return Value::number(x);
    if (precision >= 0) {
      char buf[512];
      std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(std::min<int64_t>(precision, 300)), x);
      const double r = std::strtod(buf, nullptr);
      return v.is_integer() ? Value::integer(static_cast<int64_t>(r)) : Value::number(r);
    }
    const double scale = std::pow(10.0, static_cast<double>(-precision));
    const double r = std::nearbyint(x / scale) * scale;
    return v.is_integer() ? Value::integer(static_cast<int64_t>(r)) : Value::number(r);
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_double() * scale;
  return Value::number((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}
Value f_reverse(Interp& in, const Value& v, CallArgs&) {
  if (v.is_string()) {
    TString out;
    const std::string& t = v.text();
    std::vector<size_t> offs;
    for (size_t i = 0; i < t.size();) {
      offs.push_back(i);
      utf8_next(t, i);
    }
    offs.push_back(t.size());
    for (size_t k = offs.size() - 1; k > 0; --k) out.append(v.s->substr(offs[k - 1], offs[k] - offs[k - 1]));
    return Value::string(std::move(out));
  }
  List items = in.iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::generator(std::move(items));  // reversed(): an iterator
}
Value f_batch(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "batch", 2, {"linecount", "fill_with"});
  const Value* n = arg(a, 0, "linecount");
  if (!n || !n->is_integer() || n->i <= 0) throw Error("batch() linecount must be a positive integer");
  const Value* fill = arg(a, 1, "fill_with");
  List out, cur;
  for (const Value& x : in.iterate(v)) {
    cur.push_back(x);
    if (static_cast<int64_t>(cur.size()) == n->i) {
      out.push_back(Value::make_list(std::move(cur)));
      cur.clear();
    }
  }
  if (!cur.empty()) {
    if (fill && !fill->is_none())
      while (static_cast<int64_t>(cur.size()) < n->i) {
        in.charge(1);
        cur.push_back(*fill);
      }
    out.push_back(Value::make_list(std::move(cur)));
  }
  return Value::generator(std::move(out));
}
Value f_wordcount(Interp& in, const Value& v, CallArgs&) {
  const std::string t = str_of(in, v).text;
  int64_t n = 0;
  bool in_word = false;
  for (size_t i = 0; i < t.size();) {
    const uint32_t cp = utf8_next(t, i);
    // Python's \w, roughly: letters, digits, _; not spaces, punctuation blocks or symbols/emoji.
    const bool non_word = py_isspace(cp) || (cp >= 0x80 && cp <= 0xbf) || cp == 0xd7 || cp == 0xf7 ||
                          (cp >= 0x2000 && cp <= 0x2bff) || (cp >= 0x3000 && cp <= 0x303f) ||
                          (cp >= 0xfe30 && cp <= 0xfe4f) || (cp >= 0xff00 && cp <= 0xff0f) || cp >= 0x1f000;
    const bool w = cp >= 0x80 ? !non_word : ((cp >= '0' && cp <= '9') || (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') || cp == '_');
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::integer(n);
}
Value f_indent(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "indent", 3, {"width", "first", "blank"});
  const Value* w = arg(a, 0, "width");
  TString pad;
  if (w && w->is_string()) {
    pad = *w->s;
  } else {
    const int64_t n = w && w->is_integer() ? w->i : 4;
    if (n > 4096) throw Error("indent width too large");
    pad = TString(std::string(static_cast<size_t>(std::max<int64_t>(n, 0)), ' '));
  }
  const bool first = arg_bool(a, 1, "first", false);
  const bool blank = arg_bool(a, 2, "blank", false);
  if (!v.is_string()) throw Error("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
  TString s = *v.s;
  s.append("\n");
  const std::vector<TString> lines = py_splitlines(s);
  TString out;
  for (size_t k = 0; k < lines.size(); ++k) {
    if (k > 0) {
      out.append("\n");
      if (blank || !lines[k].text.empty()) out.append(pad);
    }
    out.append(lines[k]);
    in.charge_string(out.size());
  }
  if (first) {
    TString r = pad;
    r.append(out);
    return Value::string(std::move(r));
  }
  return Value::string(std::move(out));
}
Value f_center(Interp& in, const Value& v, CallArgs& a) {
  const Value* w = arg(a, 0, "width");
  const int64_t width = w && w->is_integer() ? w->i : 80;
  CallArgs c;
  c.pos.push_back(Value::integer(width));
  const Value s = Value::string(str_of(in, v));
  if (auto m = bound_method(s, "center")) return in.call(*m, c);
  return s;
}
Value f_truncate(Interp& in, const Value& v, CallArgs& a) {
  check_args(a, "truncate", 4, {"length", "killwords", "end", "leeway"});
  const Value* l = arg(a, 0, "length");
  const int64_t length = l && l->is_integer() ? l->i : 255;
  const bool killwords = arg_bool(a, 1, "killwords", false);
  const Value* e = arg(a, 2, "end");
  const TString end = e ? str_of(in, *e) : TString("...");
  const Value* lw = arg(a, 3, "leeway");
  const int64_t leeway = lw && lw->is_integer() ? lw->i : 5;
  if (v.is_undefined()) return v;  // len(Undefined) is 0: returned as it is
  if (!v.is_string()) {
    if (len_of(v) <= length + leeway) return v;
    throw Error("truncate() of a long " + type_name(v) + " is not supported");
  }
  const TString& s = *v.s;
  const auto n = static_cast<int64_t>(utf8_len(s.text));
  const auto end_len = static_cast<int64_t>(utf8_len(end.text));
  if (length < end_len) throw Error("expected length >= " + std::to_string(end_len) + ", got " + std::to_string(length));
  if (leeway < 0) throw Error("expected leeway >= 0");
  if (n <= length + leeway) return Value::string(s);
  const size_t cut = utf8_offset(s.text, static_cast<size_t>(length - end_len));
  TString head = s.substr(0, cut);
  if (!killwords) {
    const size_t sp = head.text.rfind(' ');
    if (sp != std::string::npos) head = head.substr(0, sp);
  }
  head.append(end);
  return Value::string(std::move(head));
}
Value f_attr(Interp& in, const Value& v, CallArgs& a) {
  if (a.pos.empty() || !a.pos[0].is_string()) throw Error("attr() requires a name");
  // Python getattr only: a dict's keys are not attributes (jinja2's do_attr).
  const std::string& name = a.pos[0].text();
  if (v.is_undefined()) in.undefined_error(v);
  if (v.kind == Kind::kObject) {
    if (auto x = v.obj->getattr(name)) return *x;
  } else if (auto m = bound_method(v, name)) {
    return *m;
  }
  std::string why = "'";
  why.append(type_name(v)).append(" object' has no attribute '").append(name).append("'");
  return Value::undefined(std::move(why));
}
Value f_tojson(Interp& in, const Value& v, CallArgs& a) {
  // Hugging Face: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
  check_args(a, "tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  const Value* ind = arg(a, 1, "indent");
  const Value indent = ind ? *ind : Value::none();
  std::string item_sep = indent.is_none() ? ", " : ",", key_sep = ": ";
  if (const Value* seps = arg(a, 2, "separators"); seps && !seps->is_none()) {
    if (!seps->is_list() || seps->list->size() != 2 || !(*seps->list)[0].is_string() || !(*seps->list)[1].is_string())
      throw Error("tojson separators must be a pair of strings");
    item_sep = (*seps->list)[0].text();
    key_sep = (*seps->list)[1].text();
  }
  return Value::string(to_json(in, v, indent, item_sep, key_sep, arg_bool(a, 3, "sort_keys", false),
                               arg_bool(a, 0, "ensure_ascii", false)));
}

const std::map<std::string, FilterFn>& filters() {
  static const std::map<std::string, FilterFn> f{
      {"length", f_length}, {"count", f_length}, {"first", f_first}, {"last", f_last}, {"join", f_join},
      {"map", f_map}, {"select", f_select}, {"reject", f_reject}, {"selectattr", f_selectattr},
      {"rejectattr", f_rejectattr}, {"default", f_default}, {"d", f_default}, {"upper", f_upper},
      {"lower", f_lower}, {"capitalize", f_capitalize}, {"title", f_title}, {"trim", f_trim},
      {"replace", f_replace}, {"string", f_string}, {"safe", f_safe}, {"escape", f_escape}, {"e", f_escape},
      {"forceescape", f_escape}, {"int", f_int}, {"float", f_float}, {"list", f_list}, {"items", f_items},
      {"dictsort", f_dictsort}, {"sort", f_sort}, {"unique", f_unique}, {"min", f_min}, {"max", f_max},
      {"sum", f_sum}, {"abs", f_abs}, {"round", f_round}, {"reverse", f_reverse}, {"batch", f_batch},
      {"wordcount", f_wordcount}, {"indent", f_indent}, {"center", f_center}, {"truncate", f_truncate},
      {"attr", f_attr}, {"tojson", f_tojson},
  };
  return f;
}

// ---- tests ----

bool t_defined(Interp&, const Value& v, CallArgs&) { return !v.is_undefined(); }
bool t_undefined(Interp&, const Value& v, CallArgs&) { return v.is_undefined(); }
bool t_none(Interp&, const Value& v, CallArgs&) { return v.is_none(); }
bool t_string(Interp&, const Value& v, CallArgs&) { return v.is_string(); }
bool t_number(Interp&, const Value& v, CallArgs&) { return v.is_number(); }
bool t_integer(Interp&, const Value& v, CallArgs&) { return v.kind == Kind::kInt; }
bool t_float(Interp&, const Value& v, CallArgs&) { return v.kind == Kind::kFloat; }
bool t_mapping(Interp&, const Value& v, CallArgs&) { return v.is_dict(); }
bool t_iterable(Interp&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_sequence(Interp&, const Value& v, CallArgs&) {
  return v.is_undefined() || v.is_string() || (v.is_list() && !v.lazy) || v.is_dict();
}
bool t_boolean(Interp&, const Value& v, CallArgs&) { return v.kind == Kind::kBool; }
bool t_true(Interp&, const Value& v, CallArgs&) { return v.kind == Kind::kBool && v.i; }
bool t_false(Interp&, const Value& v, CallArgs&) { return v.kind == Kind::kBool && !v.i; }
// value % n as Python computes it for ints and floats (odd/even/divisibleby).
double py_mod(const Value& v, const Value& n, const char* test) {
  if (v.is_undefined()) throw Error("value is undefined");
  if (!v.is_number() || !n.is_number()) throw Error(std::string("'") + test + "' test requires numbers");
  if (v.is_integer() && n.is_integer()) {
    if (n.i == 0) throw Error("integer division or modulo by zero");
    if (n.i == -1) return 0;
    int64_t m = v.i % n.i;
    if (m != 0 && ((m < 0) != (n.i < 0))) m += n.i;
    return static_cast<double>(m);
  }
  if (n.as_double() == 0) throw Error("float modulo");
  double m = std::fmod(v.as_double(), n.as_double());
  if (m != 0 && ((m < 0) != (n.as_double() < 0))) m += n.as_double();
  return m;
}
bool t_odd(Interp&, const Value& v, CallArgs&) { return py_mod(v, Value::integer(2), "odd") == 1; }
bool t_even(Interp&, const Value& v, CallArgs&) { return py_mod(v, Value::integer(2), "even") == 0; }
bool t_divisibleby(Interp&, const Value& v, CallArgs& a) {
  const Value* n = arg(a, 0, "num");
  if (!n) throw Error("divisibleby requires an argument");
  return py_mod(v, *n, "divisibleby") == 0;
}
const Value& other(const CallArgs& a, const char* name) {
  const Value* v = arg(a, 0, name);
  if (!v) throw Error(std::string(name) + " test requires an argument");
  return *v;
}
bool t_eq(Interp& in, const Value& v, CallArgs& a) { return equals(v, other(a, "other"), in.depth()); }
bool t_ne(Interp& in, const Value& v, CallArgs& a) { return !equals(v, other(a, "other"), in.depth()); }
bool t_lt(Interp& in, const Value& v, CallArgs& a) { return compare(v, other(a, "other"), in.depth()) < 0; }
bool t_le(Interp& in, const Value& v, CallArgs& a) { return compare(v, other(a, "other"), in.depth()) <= 0; }
bool t_gt(Interp& in, const Value& v, CallArgs& a) { return compare(v, other(a, "other"), in.depth()) > 0; }
bool t_ge(Interp& in, const Value& v, CallArgs& a) { return compare(v, other(a, "other"), in.depth()) >= 0; }
bool t_in(Interp& in, const Value& v, CallArgs& a) { return contains(in, other(a, "seq"), v); }
bool t_callable(Interp&, const Value& v, CallArgs&) {
  return v.is_undefined() || (v.kind == Kind::kObject && v.obj->callable());  // Undefined has __call__
}
bool t_sameas(Interp&, const Value& v, CallArgs& a) {
  const Value& o = other(a, "other");
  if (v.kind != o.kind) return false;
  switch (v.kind) {
    case Kind::kNone:
    case Kind::kUndefined: return v.kind == Kind::kNone;
    case Kind::kBool: return v.i == o.i;
    case Kind::kInt: return v.i == o.i && v.i >= -5 && v.i <= 256;
    case Kind::kString: return v.s == o.s;
    case Kind::kList: return v.list == o.list;
    case Kind::kDict: return v.dict == o.dict;
    case Kind::kObject: return v.obj == o.obj;
    default: return false;
  }
}
bool t_lower(Interp& in, const Value& v, CallArgs&) { return py_is("islower", str_of(in, v).text); }
bool t_upper(Interp& in, const Value& v, CallArgs&) { return py_is("isupper", str_of(in, v).text); }
bool t_escaped(Interp&, const Value&, CallArgs&) { return false; }
bool t_filter(Interp&, const Value& v, CallArgs&) { return v.is_string() && filter_exists(v.text()); }
bool t_test(Interp&, const Value& v, CallArgs&) { return v.is_string() && test_exists(v.text()); }

const std::map<std::string, TestFn>& tests() {
  static const std::map<std::string, TestFn> t{
      {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"string", t_string},
      {"number", t_number}, {"integer", t_integer}, {"float", t_float}, {"mapping", t_mapping},
      {"iterable", t_iterable}, {"sequence", t_sequence}, {"boolean", t_boolean}, {"true", t_true},
      {"false", t_false}, {"odd", t_odd}, {"even", t_even}, {"divisibleby", t_divisibleby}, {"eq", t_eq},
      {"equalto", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne}, {"lt", t_lt}, {"lessthan", t_lt},
      {"<", t_lt}, {"le", t_le}, {"<=", t_le}, {"gt", t_gt}, {"greaterthan", t_gt}, {">", t_gt},
      {"ge", t_ge}, {">=", t_ge}, {"in", t_in}, {"callable", t_callable}, {"sameas", t_sameas},
      {"lower", t_lower}, {"upper", t_upper}, {"escaped", t_escaped}, {"filter", t_filter}, {"test", t_test},
  };
  return t;
}

// ---- globals ----

class Cycler : public Object, public std::enable_shared_from_this<Cycler> {
 public:
  explicit Cycler(List items) : items_(std::move(items)) {}
  std::string type_name() const override { return "Cycler"; }
  std::optional<Value> getattr(const std::string& name) override {
    if (name == "current") return items_[pos_];
    if (name == "next") {
      return Value::object(std::make_shared<NativeFunction>("next", [self = shared_from_this()](Interp&, CallArgs&) {
        Value v = self->items_[self->pos_];
        self->pos_ = (self->pos_ + 1) % self->items_.size();
        return v;
      }));
    }
    if (name == "reset") {
      return Value::object(std::make_shared<NativeFunction>("reset", [self = shared_from_this()](Interp&, CallArgs&) {
        self->pos_ = 0;
        return Value::none();
      }));
    }
    return std::nullopt;
  }
  void clear() override {
    items_ = {Value()};
    pos_ = 0;
  }

 private:
  List items_;
  size_t pos_ = 0;
};

void check_ns_name(const std::string& name) {
  if (!name.empty() && name[0] == '_')
    throw Error("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + name + "'");
}

Dict dict_from_args(Interp& in, const CallArgs& a) {
  Dict d;
  if (a.pos.size() > 1) throw Error("dict expected at most 1 argument");
  if (!a.pos.empty()) {
    const Value& src = a.pos[0];
    if (src.is_dict()) {
      d = *src.dict;
    } else {
      for (const Value& pair : in.iterate(src)) {
        if (!pair.is_list() || pair.list->size() != 2) throw Error("dictionary update sequence element has wrong length");
        d.set((*pair.list)[0], (*pair.list)[1]);
      }
    }
  }
  for (const auto& [k, v] : a.kw) d.set(Value::string(k), v);
  return d;
}

}  // namespace

Value call_filter(Interp& in, const std::string& name, const Value& input, CallArgs& args) {
  const auto& f = filters();
  const auto it = f.find(name);
  if (it == f.end()) throw Error("No filter named '" + name + "'.");
  return it->second(in, input, args);
}
bool call_test(Interp& in, const std::string& name, const Value& input, CallArgs& args) {
  const auto& t = tests();
  const auto it = t.find(name);
  if (it == t.end()) throw Error("No test named '" + name + "'.");
  return it->second(in, input, args);
}
bool filter_exists(const std::string& name) { return filters().count(name) != 0; }
bool test_exists(const std::string& name) { return tests().count(name) != 0; }

std::unordered_map<std::string, Value> make_globals() {
  std::unordered_map<std::string, Value> g;
  auto fn = [&](const char* name, NativeFunction::Fn f) {
    g[name] = Value::object(std::make_shared<NativeFunction>(name, std::move(f)));
  };
  fn("range", [](Interp& in, CallArgs& a) {
    if (!a.kw.empty() || a.pos.empty() || a.pos.size() > 3) throw Error("range expected 1 to 3 integer arguments");
    for (const Value& v : a.pos)
      if (!v.is_integer()) throw Error("'" + type_name(v) + "' object cannot be interpreted as an integer");
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) {
      stop = a.pos[0].i;
    } else {
      start = a.pos[0].i;
      stop = a.pos[1].i;
      if (a.pos.size() == 3) step = a.pos[2].i;
    }
    if (step == 0) throw Error("range() arg 3 must not be zero");
    // The length as Python computes it, without overflow.
    const __int128 span = step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
    const __int128 st = step > 0 ? step : -static_cast<__int128>(step);
    const __int128 n = span <= 0 ? 0 : (span + st - 1) / st;
    // jinja2's sandbox refuses ranges over MAX_RANGE (100000) items.
    if (n > 100000) throw Error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    in.charge_list(static_cast<size_t>(n));
    List out;
    for (__int128 k = 0; k < n; ++k) out.push_back(Value::integer(static_cast<int64_t>(start + k * step)));
    return Value::make_list(std::move(out));
  });
  fn("dict", [](Interp& in, CallArgs& a) { return Value::make_dict(dict_from_args(in, a)); });
  fn("namespace", [](Interp& in, CallArgs& a) {
    Dict d = dict_from_args(in, a);
    for (const auto& [k, v] : d.items)
      if (k.is_string()) check_ns_name(k.text());
    return in.make_namespace(std::move(d));
  });
  fn("cycler", [](Interp& in, CallArgs& a) {
    if (a.pos.empty()) throw Error("cycler requires at least one item");
    auto c = std::make_shared<Cycler>(a.pos);
    in.register_object(c);
    return Value::object(c);
  });
  fn("joiner", [](Interp&, CallArgs& a) {
    const Value* s = arg(a, 0, "sep");
    Value sep = s ? *s : Value::string(", ");
    auto used = std::make_shared<bool>(false);
    auto j = std::make_shared<NativeFunction>("joiner", [sep, used](Interp&, CallArgs&) {
      if (!*used) {
        *used = true;
        return Value::string("");
      }
      return sep;
    });
    if (sep.depth + 1 > kMaxBuiltDepth) throw Error("value nesting too deep");
    j->depth = sep.depth + 1;
    return Value::object(j);
  });
  fn("raise_exception", [](Interp& in, CallArgs& a) -> Value {
    const Value* m = arg(a, 0, "message");
    throw Error(m ? to_str(*m, in.depth()).text : "");
  });
  fn("strftime_now", [](Interp& in, CallArgs& a) {
    const Value* f = arg(a, 0, "format");
    if (!f || !f->is_string()) throw Error("strftime_now() requires a format string");
    const std::string& fmt = f->text();
    if (fmt.size() > 1024) throw Error("strftime_now() format too long");
    std::string buf(fmt.size() * 64 + 64, '\0');
    const std::tm t = in.now();
    const size_t n = fmt.empty() ? 0 : std::strftime(buf.data(), buf.size(), fmt.c_str(), &t);
    buf.resize(n);
    return Value::string(f->s->derived(buf));
  });
  return g;
}

}  // namespace fathom::jinja
