// json.dumps(x, ensure_ascii=False, indent=..., separators=..., sort_keys=...) byte for byte, as
// Hugging Face's tojson filter calls it. The result is tainted wholly when any string in x was.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "base/jinja/error.h"
#include "base/jinja/interp.h"

namespace fathom::jinja {

namespace {

void json_string(std::string& out, bool ensure_ascii, const std::string& s) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t cp = utf8_next(s, i);
    if (ensure_ascii && cp >= 0x7f) {  // json.dumps(ensure_ascii=True): \uXXXX, surrogate pairs past the BMP
      char buf[16];
      if (cp < 0x10000) {
        std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      } else {
        const uint32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
      }
      out += buf;
      continue;
    }
    if (cp >= 0x80) {
      out.append(s, start, i - start);
      continue;
    }
    const auto c = static_cast<unsigned char>(cp);
    const char ch = static_cast<char>(c);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return py_float_repr(d);
}

struct JsonWriter {
  Interp& in;
  std::string indent;  // per level
  bool pretty;
  std::string item_sep, key_sep;
  bool sort_keys;
  bool ensure_ascii;
  std::string out;

  void newline(int level) {
    out += '\n';
    for (int k = 0; k < level; ++k) out += indent;
  }

  std::string key_text(const Value& k) {
    switch (k.kind) {
      case Kind::kString: return k.text();
      case Kind::kBool: return k.i ? "true" : "false";
      case Kind::kInt: return std::to_string(k.i);
      case Kind::kFloat: return json_float(k.f);
      case Kind::kNone: return "null";
      default: throw Error("keys must be str, int, float, bool or None, not " + type_name(k));
    }
  }

  void write(const Value& v, int level) {
    if (level > in.limits().max_value_depth) throw Error("value nesting too deep (or a reference cycle)");
    if (out.size() > in.limits().max_string_bytes) in.charge_string(out.size());
    in.charge(1);
    switch (v.kind) {
      case Kind::kNone: out += "null"; return;
      case Kind::kBool: out += v.i ? "true" : "false"; return;
      case Kind::kInt: out += std::to_string(v.i); return;
      case Kind::kFloat: out += json_float(v.f); return;
      case Kind::kString: json_string(out, ensure_ascii, v.text()); return;
      case Kind::kList: {
        if (v.lazy) throw Error("Object of type generator is not JSON serializable");
        if (v.list->empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t k = 0; k < v.list->size(); ++k) {
          if (k) out += item_sep;
          if (pretty) newline(level + 1);
          write((*v.list)[k], level + 1);
        }
        if (pretty) newline(level);
        out += ']';
        return;
      }
      case Kind::kDict: {
        if (v.dict->size() == 0) {
          out += "{}";
          return;
        }
        std::vector<std::pair<std::string, const Value*>> items;
        for (const auto& [k, x] : v.dict->items) items.emplace_back(key_text(k), &x);
        if (sort_keys) {
          for (const auto& [k, x] : v.dict->items)
            if (!k.is_string()) throw Error("'<' not supported between keys of different types in tojson(sort_keys=True)");
          std::stable_sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        }
        out += '{';
        bool first = true;
        for (const auto& [k, x] : items) {
          if (!first) out += item_sep;
          first = false;
          if (pretty) newline(level + 1);
          json_string(out, ensure_ascii, k);
          out += key_sep;
          write(*x, level + 1);
        }
        if (pretty) newline(level);
        out += '}';
        return;
      }
      case Kind::kUndefined: throw Error("Object of type Undefined is not JSON serializable");
      case Kind::kObject: throw Error("Object of type " + v.obj->type_name() + " is not JSON serializable");
    }
  }
};

}  // namespace

TString to_json(Interp& in, const Value& v, const Value& indent, const std::string& item_sep, const std::string& key_sep,
                bool sort_keys, bool ensure_ascii) {
  JsonWriter w{in, "", false, item_sep, key_sep, sort_keys, ensure_ascii, {}};
  if (!indent.is_none()) {
    w.pretty = true;
    if (indent.is_string()) {
      w.indent = indent.text();
    } else if (indent.is_integer()) {
      if (indent.i > 256) throw Error("tojson indent too large");
      w.indent = std::string(static_cast<size_t>(std::max<int64_t>(indent.i, 0)), ' ');
    } else {
      throw Error("tojson indent must be an integer or a string");
    }
  }
  w.write(v, 0);
  in.charge_string(w.out.size());
  return TString(std::move(w.out), any_taint(v, in.depth()));
}

}  // namespace fathom::jinja
