#include "base/jinja/strings.h"

#include "base/jinja/error.h"
#include "base/jinja/interp.h"

#include <cstdio>

namespace fathom::jinja {

namespace {

// Code points of `chars` (for strip(chars)).
std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) out.push_back(utf8_next(s, i));
  return out;
}

bool is_line_break(uint32_t cp) {
  return cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e || cp == 0x85 ||
         cp == 0x2028 || cp == 0x2029;
}

bool is_lower(char c) { return c >= 'a' && c <= 'z'; }
bool is_upper(char c) { return c >= 'A' && c <= 'Z'; }

}  // namespace

TString py_strip(const TString& s, const std::string* chars, bool left, bool right) {
  const std::string& t = s.text;
  std::vector<uint32_t> set;
  if (chars) set = code_points(*chars);
  const auto strip_it = [&](uint32_t cp) {
    if (!chars) return py_isspace(cp);
    for (uint32_t c : set)
      if (c == cp) return true;
    return false;
  };
  size_t b = 0, e = t.size();
  if (left) {
    while (b < e) {
      size_t n = b;
      if (!strip_it(utf8_next(t, n))) break;
      b = n;
    }
  }
  if (right) {
    // Walk forward remembering where the last kept code point ends.
    size_t last = b;
    for (size_t i = b; i < e;) {
      const uint32_t cp = utf8_next(t, i);
      if (!strip_it(cp)) last = i;
    }
    e = last;
  }
  return s.substr(b, e - b);
}

std::vector<TString> py_split(const TString& s, const std::string* sep, int64_t maxsplit, bool from_right) {
  const std::string& t = s.text;
  std::vector<TString> out;
  if (sep) {
    if (sep->empty()) throw Error("empty separator");
    if (!from_right) {
      size_t start = 0;
      for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
        const size_t p = t.find(*sep, start);
        if (p == std::string::npos) break;
        out.push_back(s.substr(start, p - start));
        start = p + sep->size();
      }
      out.push_back(s.substr(start));
      return out;
    }
    size_t end = t.size();
    std::vector<TString> rev;
    for (int64_t n = 0; maxsplit < 0 || n < maxsplit; ++n) {
      if (end < sep->size()) break;
      const size_t p = t.rfind(*sep, end - sep->size());
      if (p == std::string::npos) break;
      rev.push_back(s.substr(p + sep->size(), end - p - sep->size()));
      end = p;
    }
    rev.push_back(s.substr(0, end));
    return {rev.rbegin(), rev.rend()};
  }
  // Whitespace split: positions of words.
  std::vector<std::pair<size_t, size_t>> words;
  size_t i = 0;
  while (i < t.size()) {
    size_t n = i;
    if (py_isspace(utf8_next(t, n))) {
      i = n;
      continue;
    }
    const size_t b = i;
    while (i < t.size()) {
      n = i;
      if (py_isspace(utf8_next(t, n))) break;
      i = n;
    }
    words.push_back({b, i});
  }
  if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit) {
    if (!from_right) {
      const size_t rest = words[static_cast<size_t>(maxsplit)].first;
      words.resize(static_cast<size_t>(maxsplit));
      const TString tail = s.substr(rest);
      for (const auto& [b, e] : words) out.push_back(s.substr(b, e - b));
      out.push_back(tail);
      return out;
    }
    const size_t keep_from = words.size() - static_cast<size_t>(maxsplit);
    const size_t head_end = words[keep_from - 1].second;
    out.push_back(s.substr(0, head_end));
    for (size_t k = keep_from; k < words.size(); ++k) out.push_back(s.substr(words[k].first, words[k].second - words[k].first));
    return out;
  }
  for (const auto& [b, e] : words) out.push_back(s.substr(b, e - b));
  return out;
}

std::vector<TString> py_splitlines(const TString& s) {
  const std::string& t = s.text;
  std::vector<TString> out;
  size_t start = 0;
  for (size_t i = 0; i < t.size();) {
    const size_t at = i;
    const uint32_t cp = utf8_next(t, i);
    if (!is_line_break(cp)) continue;
    out.push_back(s.substr(start, at - start));
    if (cp == '\r' && i < t.size() && t[i] == '\n') ++i;
    start = i;
  }
  if (start < t.size()) out.push_back(s.substr(start));
  return out;
}

TString py_replace(Interp& in, const TString& s, const std::string& old, const TString& repl, int64_t count) {
  const std::string& t = s.text;
  TString out;
  if (old.empty()) {  // inserts repl between every code point (and at both ends)
    size_t i = 0;
    int64_t n = 0;
    while (true) {
      if (count < 0 || n < count) {
        out.append(repl);
        ++n;
      }
      if (i >= t.size()) break;
      const size_t b = i;
      utf8_next(t, i);
      out.append(s.substr(b, i - b));
      in.charge_string(out.size());
    }
    return out;
  }
  size_t start = 0;
  for (int64_t n = 0; count < 0 || n < count; ++n) {
    const size_t p = t.find(old, start);
    if (p == std::string::npos) break;
    out.append(s.substr(start, p - start));
    out.append(repl);
    in.charge_string(out.size());
    start = p + old.size();
  }
  out.append(s.substr(start));
  in.charge_string(out.size());
  return out;
}

TString py_format(Interp& in, const TString& s, const CallArgs& args) {
  const std::string& t = s.text;
  TString out;
  bool tainted = s.tainted();
  size_t auto_index = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '{' && i + 1 < t.size() && t[i + 1] == '{') {
      out.append("{");
      ++i;
    } else if (c == '}' && i + 1 < t.size() && t[i + 1] == '}') {
      out.append("}");
      ++i;
    } else if (c == '{') {
      const size_t end = t.find('}', i);
      if (end == std::string::npos) throw Error("Single '{' encountered in format string");
      std::string field = t.substr(i + 1, end - i - 1);
      bool as_repr = false;
      if (field.size() >= 2 && field[field.size() - 2] == '!') {
        as_repr = field.back() == 'r';
        field.resize(field.size() - 2);
      }
      if (field.find(':') != std::string::npos) throw Error("format specs in str.format are not supported");
      const Value* v = nullptr;
      if (field.empty() || (field.find_first_not_of("0123456789") == std::string::npos)) {
        const size_t k = field.empty() ? auto_index++ : static_cast<size_t>(std::stoul(field.substr(0, 9)));
        if (k >= args.pos.size()) throw Error("Replacement index " + std::to_string(k) + " out of range for positional args tuple");
        v = &args.pos[k];
      } else {
        for (const auto& [name, x] : args.kw)
          if (name == field) v = &x;
        if (!v) throw Error("KeyError: '" + field + "'");
      }
      const TString piece = as_repr ? repr(*v, in.depth()) : to_str(*v, in.depth());
      tainted = tainted || piece.tainted();
      out.append(piece.text);
      in.charge_string(out.size());
      i = end;
    } else if (c == '}') {
      throw Error("Single '}' encountered in format string");
    } else {
      out.text += c;
    }
  }
  return TString(std::move(out.text), tainted);
}

TString py_percent_format(Interp& in, const TString& fmt, const Value& args) {
  const List items = args.is_list() && args.tuple ? *args.list : List{args};
  const std::string& t = fmt.text;
  std::string out;
  bool tainted = fmt.tainted();
  size_t next = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] != '%') {
      out += t[i];
      continue;
    }
    size_t j = i + 1;
    std::string spec = "%";
    while (j < t.size() && std::string_view("-+ #0123456789.").find(t[j]) != std::string_view::npos) spec += t[j++];
    if (j >= t.size()) throw Error("incomplete format");
    const char conv = t[j];
    i = j;
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (spec.size() > 12) throw Error("format spec too long");
    if (next >= items.size()) throw Error("not enough arguments for format string");
    const Value& v = items[next++];
    std::string piece;
    if (conv == 's' || conv == 'r') {
      const TString s = conv == 's' ? to_str(v, in.depth()) : repr(v, in.depth());
      tainted = tainted || s.tainted();
      if (spec.size() > 1) {
        size_t width = 0;
        for (size_t k = 1; k < spec.size() && spec[k] != '.'; ++k)
          if (spec[k] >= '0' && spec[k] <= '9') width = width * 10 + static_cast<size_t>(spec[k] - '0');
        if (width > 4096) throw Error("format width too large");
        const size_t len = utf8_len(s.text);
        piece = s.text;
        if (len < width) {
          if (spec.find('-') != std::string::npos) piece += std::string(width - len, ' ');
          else piece = std::string(width - len, ' ') + piece;
        }
      } else {
        piece = s.text;
      }
    } else if (conv == 'd' || conv == 'i' || conv == 'f' || conv == 'F' || conv == 'e' || conv == 'g' || conv == 'x') {
      if (!v.is_number()) throw Error("%" + std::string(1, conv) + " format: a real number is required, not " + type_name(v));
      char buf[512];
      if (conv == 'd' || conv == 'i' || conv == 'x') {
        const int64_t n = v.kind == Kind::kFloat ? static_cast<int64_t>(v.f) : v.i;
        std::snprintf(buf, sizeof buf, (spec + "ll" + (conv == 'x' ? "x" : "d")).c_str(), static_cast<long long>(n));
      } else {
        std::snprintf(buf, sizeof buf, (spec + conv).c_str(), v.as_double());
      }
      piece = buf;
    } else {
      throw Error(std::string("unsupported format character '") + conv + "'");
    }
    out += piece;
    in.charge_string(out.size());
  }
  // Python takes a list or dict argument as a mapping: unused, it is no error.
  const bool mapping = (args.is_list() && !args.tuple) || args.is_dict() || args.is_undefined();
  if (next < items.size() && !mapping) throw Error("not all arguments converted during string formatting");
  return TString(std::move(out), tainted);
}

TString html_escape(const TString& s) {
  std::string out;
  for (const char c : s.text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  if (out.size() == s.text.size()) return s;
  return s.derived(std::move(out));
}

bool py_is(const std::string& m, const std::string& s) {
  if (s.empty()) return false;
  if (m == "isspace") {
    for (size_t i = 0; i < s.size();)
      if (!py_isspace(utf8_next(s, i))) return false;
    return true;
  }
  bool any_cased = false;
  for (const char c : s) {
    const bool d = c >= '0' && c <= '9', l = is_lower(c), u = is_upper(c);
    if (m == "isdigit" || m == "isnumeric" || m == "isdecimal") {
      if (!d) return false;
    } else if (m == "isalpha") {
      if (!l && !u) return false;
    } else if (m == "isalnum") {
      if (!l && !u && !d) return false;
    } else if (m == "islower") {
      if (u) return false;
      any_cased = any_cased || l;
    } else if (m == "isupper") {
      if (l) return false;
      any_cased = any_cased || u;
    }
  }
  return (m == "islower" || m == "isupper") ? any_cased : true;
}

namespace {

// Simple case mappings of the scripts chat content mostly uses: ASCII, Latin-1, Latin
// Extended-A, Greek and Cyrillic (Python maps every script; others are left as they are).
uint32_t cp_upper(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 32;
  if (c == 0xff) return 0x178;
  if (c == 0xb5) return 0x39c;
  if (c >= 0x100 && c <= 0x17f) {
    if (c == 0x131) return 'I';
    if (c == 0x17f) return 'S';
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return (c & 1) == 0 ? c - 1 : c;
    if (c == 0x130 || c == 0x138 || c == 0x149) return c;
    return (c & 1) ? c - 1 : c;
  }
  if (c >= 0x3b1 && c <= 0x3c9) return c == 0x3c2 ? 0x3a3 : c - 32;
  if (c >= 0x3ac && c <= 0x3af) return c == 0x3ac ? 0x386 : c - 37;
  if (c >= 0x3cc && c <= 0x3ce) return c == 0x3cc ? 0x38c : c - 63;
  if (c >= 0x430 && c <= 0x44f) return c - 32;
  if (c >= 0x450 && c <= 0x45f) return c - 80;
  return c;
}
uint32_t cp_lower(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 32;
  if (c == 0x178) return 0xff;
  if (c >= 0x100 && c <= 0x17f) {
    if (c == 0x130) return 'i';  // Python: 'i' + U+0307
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return (c & 1) ? c + 1 : c;
    if (c == 0x131 || c == 0x138 || c == 0x149 || c == 0x17f) return c;
    return (c & 1) == 0 ? c + 1 : c;
  }
  if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 32;
  if (c == 0x386) return 0x3ac;
  if (c >= 0x388 && c <= 0x38a) return c + 37;
  if (c == 0x38c) return 0x3cc;
  if (c == 0x38e || c == 0x38f) return c + 63;
  if (c >= 0x410 && c <= 0x42f) return c + 32;
  if (c >= 0x400 && c <= 0x40f) return c + 80;
  return c;
}
bool cp_cased(uint32_t c) { return cp_upper(c) != c || cp_lower(c) != c || c == 0xdf || c == 0x138 || c == 0x149; }

std::string map_case(const std::string& s, int mode) {  // 0 lower, 1 upper, 2 swap
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const uint32_t c = utf8_next(s, i);
    const bool up = mode == 1 || (mode == 2 && cp_lower(c) != c);
    if (mode != 0 && c == 0xdf && (mode == 1 || mode == 2)) {
      out += "SS";
      continue;
    }
    utf8_append(out, up ? (mode == 2 ? cp_lower(c) : cp_upper(c)) : (mode == 2 ? cp_upper(c) : cp_lower(c)));
  }
  return out;
}

}  // namespace

std::string py_upper(const std::string& s) { return map_case(s, 1); }
std::string py_lower(const std::string& s) { return map_case(s, 0); }
std::string py_swapcase(const std::string& s) { return map_case(s, 2); }

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    const uint32_t c = utf8_next(s, i);
    const bool cased = cp_cased(c);
    if (!cased) {
      utf8_append(out, c);
    } else if (prev_cased) {
      utf8_append(out, cp_lower(c));
    } else if (c == 0xdf) {
      out += "Ss";
    } else {
      utf8_append(out, cp_upper(c));
    }
    prev_cased = cased;
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  if (s.empty()) return s;
  size_t i = 0;
  const uint32_t first = utf8_next(s, i);
  std::string out;
  if (first == 0xdf) out = "Ss";
  else utf8_append(out, cp_upper(first));
  return out + py_lower(s.substr(i));
}

}  // namespace fathom::jinja
