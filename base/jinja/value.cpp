#include "base/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "base/jinja/error.h"

namespace fathom::jinja {

namespace {

void check_depth(int depth) {
  if (depth < 0) throw Error("value nesting too deep (or a reference cycle)");
}

}  // namespace

std::optional<Value> Object::getattr(const std::string&) { return std::nullopt; }
bool Object::setattr(const std::string&, const Value&) { return false; }
Value Object::call(Interp&, CallArgs&) { throw Error("'" + type_name() + "' object is not callable"); }
TString Object::repr(int) const { return TString(std::string("<").append(type_name()).append(" object>")); }

Value Value::undefined(std::string why) {
  Value v;
  if (!why.empty()) v.hint = std::make_shared<const std::string>(std::move(why));
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::boolean(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.i = b ? 1 : 0;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::string(TString s) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::make_shared<const TString>(std::move(s));
  return v;
}
namespace {

int checked_depth(int d) {
  if (d > kMaxBuiltDepth) throw Error("value nesting too deep (limit " + std::to_string(kMaxBuiltDepth) + ")");
  return d;
}

}  // namespace

Value Value::make_list(List items, bool tuple) {
  Value v;
  int d = 0;
  for (const Value& x : items) d = std::max(d, x.depth);
  v.depth = checked_depth(d + 1);
  v.kind = Kind::kList;
  v.tuple = tuple;
  v.list = std::make_shared<const List>(std::move(items));
  return v;
}
Value Value::generator(List items) {
  Value v = make_list(std::move(items));
  v.lazy = true;
  return v;
}
Value Value::make_dict(Dict d) {
  Value v;
  int deepest = 0;
  for (const auto& [k, x] : d.items) deepest = std::max({deepest, k.depth, x.depth});
  v.depth = checked_depth(deepest + 1);
  v.kind = Kind::kDict;
  v.dict = std::make_shared<const Dict>(std::move(d));
  return v;
}
Value Value::object(std::shared_ptr<Object> o) {
  Value v;
  v.kind = Kind::kObject;
  v.depth = o->depth;
  v.obj = std::move(o);
  return v;
}

std::string hash_key(const Value& v) {
  // Built with append: GCC 12 warns falsely (-Wrestrict) on "x" + std::to_string(...) at -O3.
  std::string k;
  switch (v.kind) {
    case Kind::kString: return k.append("s").append(v.text());
    case Kind::kBool:
    case Kind::kInt: return k.append("i").append(std::to_string(v.i));
    case Kind::kFloat:
      if (std::isfinite(v.f) && v.f == std::floor(v.f) && std::fabs(v.f) < 9e18)
        return k.append("i").append(std::to_string(static_cast<int64_t>(v.f)));
      return k.append("f").append(py_float_repr(v.f));
    case Kind::kNone: return "n";
    case Kind::kUndefined: return "u";  // jinja2's Undefined hashes by its type
    case Kind::kList:
      if (v.tuple) {
        k.append("t").append(std::to_string(v.list->size()));
        for (const Value& x : *v.list) {
          const std::string e = hash_key(x);
          k.append(std::to_string(e.size())).append(":").append(e);
        }
        return k;
      }
      break;
    default: break;
  }
  throw Error("unhashable type: '" + type_name(v) + "'");
}

const Value* Dict::find(const Value& key) const {
  if (key.kind == Kind::kList && !key.tuple) return nullptr;
  if (key.kind == Kind::kDict || key.kind == Kind::kObject) return nullptr;
  const auto it = index.find(hash_key(key));
  return it == index.end() ? nullptr : &items[it->second].second;
}
const Value* Dict::find(const std::string& key) const {
  const auto it = index.find("s" + key);
  return it == index.end() ? nullptr : &items[it->second].second;
}
void Dict::set(const Value& key, Value v) {
  const std::string k = hash_key(key);
  const auto it = index.find(k);
  if (it != index.end()) {
    items[it->second].second = std::move(v);
    return;
  }
  index.emplace(k, items.size());
  items.emplace_back(key, std::move(v));
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool:
    case Kind::kInt: return v.i != 0;
    case Kind::kFloat: return v.f != 0;
    case Kind::kString: return !v.s->text.empty();
    case Kind::kList: return v.lazy || !v.list->empty();
    case Kind::kDict: return v.dict->size() != 0;
    case Kind::kObject: return true;
  }
  return false;
}

std::string type_name(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return v.lazy ? "generator" : v.tuple ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kObject: return v.obj->type_name();
  }
  return "object";
}

std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci: [-]D[.DDD]e[+-]XX
  const size_t epos = sci.find('e');
  const int exp = std::atoi(sci.c_str() + epos + 1);
  std::string mant = sci.substr(0, epos);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {  // Python repr: fixed notation for 1e-4 <= |d| < 1e16
    if (exp < 0) {
      out.append("0.").append(static_cast<size_t>(-exp - 1), '0').append(digits);
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out.append(".").append(digits, 1, std::string::npos);
  char e[16];
  std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + e;
}

namespace {

bool py_printable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) return false;
  if (cp >= 0x600 && cp <= 0x605) return false;
  if (cp == 0x61c || cp == 0x6dd || cp == 0x70f || cp == 0x180e || cp == 0x1680) return false;
  if ((cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) || (cp >= 0x205f && cp <= 0x206f))
    return false;
  if (cp == 0x3000 || cp == 0xfeff || (cp >= 0xfff9 && cp <= 0xfffb)) return false;
  if (cp >= 0xd800 && cp <= 0xf8ff) return false;  // surrogates, private use
  if (cp >= 0xe0000) return false;                 // tags, private use planes
  return true;
}

}  // namespace

std::string py_str_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t cp = utf8_next(s, i);
    if (cp == '\\') out += "\\\\";
    else if (cp == static_cast<uint32_t>(q)) (out += '\\') += q;
    else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else if (!py_printable(cp)) {
      char buf[16];
      if (cp < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", cp);
      else if (cp < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      else std::snprintf(buf, sizeof buf, "\\U%08x", cp);
      out += buf;
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  out += q;
  return out;
}

bool any_taint(const Value& v, int depth) {
  check_depth(depth);
  switch (v.kind) {
    case Kind::kString: return v.s->tainted();
    case Kind::kList:
      for (const Value& x : *v.list)
        if (any_taint(x, depth - 1)) return true;
      return false;
    case Kind::kDict:
      for (const auto& [k, x] : v.dict->items)
        if (any_taint(k, depth - 1) || any_taint(x, depth - 1)) return true;
      return false;
    case Kind::kObject: return v.obj->repr(depth - 1).tainted();
    default: return false;
  }
}

TString repr(const Value& v, int depth) {
  check_depth(depth);
  switch (v.kind) {
    case Kind::kUndefined: return TString("Undefined");
    case Kind::kNone: return TString("None");
    case Kind::kBool: return TString(v.i ? "True" : "False");
    case Kind::kInt: return TString(std::to_string(v.i));
    case Kind::kFloat: return TString(py_float_repr(v.f));
    case Kind::kString:
      if (v.markup) return v.s->derived("Markup(" + py_str_repr(v.s->text) + ")");
      return v.s->derived(py_str_repr(v.s->text));
    case Kind::kList: {
      if (v.lazy) return TString("<generator object>");
      TString out(v.tuple ? "(" : "[");
      bool tainted = false;
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out.append(", ");
        const TString e = repr((*v.list)[k], depth - 1);
        tainted = tainted || e.tainted();
        out.append(e.text);
      }
      if (v.tuple && v.list->size() == 1) out.append(",");
      out.append(v.tuple ? ")" : "]");
      return TString(out.text, tainted);
    }
    case Kind::kDict: {
      TString out("{");
      bool tainted = false;
      bool first = true;
      for (const auto& [k, x] : v.dict->items) {
        if (!first) out.append(", ");
        first = false;
        const TString ks = repr(k, depth - 1), xs = repr(x, depth - 1);
        tainted = tainted || ks.tainted() || xs.tainted();
        out.append(ks.text);
        out.append(": ");
        out.append(xs.text);
      }
      out.append("}");
      return TString(out.text, tainted);
    }
    case Kind::kObject: return v.obj->repr(depth - 1);
  }
  return TString();
}

TString to_str(const Value& v, int depth) {
  if (v.kind == Kind::kString) return *v.s;
  if (v.kind == Kind::kUndefined) return TString();
  return repr(v, depth);
}

bool equals(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::kFloat || b.kind == Kind::kFloat) return a.as_double() == b.as_double();
    return a.i == b.i;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.text() == b.text();
    case Kind::kList:
      if (a.lazy || b.lazy) return a.list == b.list;
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k], depth - 1)) return false;
      return true;
    case Kind::kDict:
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, x] : a.dict->items) {
        const Value* y = b.dict->find(k);
        if (!y || !equals(x, *y, depth - 1)) return false;
      }
      return true;
    case Kind::kObject: return a.obj == b.obj;
    default: return false;
  }
}

int compare(const Value& a, const Value& b, int depth) {
  check_depth(depth);
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::kFloat || b.kind == Kind::kFloat) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return a.i < b.i ? -1 : a.i > b.i ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.text().compare(b.text());  // UTF-8 byte order is code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list() && a.tuple == b.tuple) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (equals((*a.list)[k], (*b.list)[k], depth - 1)) continue;
      return compare((*a.list)[k], (*b.list)[k], depth - 1);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  throw Error("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

}  // namespace fathom::jinja
