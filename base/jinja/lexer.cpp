#include "base/jinja/lexer.h"

#include <cerrno>
#include <cstdlib>

#include "base/jinja/error.h"
#include "base/jinja/tstring.h"
#include "base/utf8.h"

namespace fathom::jinja {

namespace {

bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ident(char c) { return is_ident_start(c) || is_digit(c); }

// Python's str.rstrip() (Unicode whitespace).
size_t rstrip_end(std::string_view s) {
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    const uint32_t cp = utf8_next(s, i);
    if (!py_isspace(cp)) end = i;
  }
  return end;
}
// Length of the Unicode whitespace run starting at s[pos] (regex \s*).
size_t space_run(std::string_view s, size_t pos) {
  size_t i = pos;
  while (i < s.size()) {
    size_t j = i;
    if (!py_isspace(utf8_next(s, j))) break;
    i = j;
  }
  return i - pos;
}

class Lexer {
 public:
  Lexer(std::string src, const Limits& limits) : src_(std::move(src)), limits_(limits) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const size_t start = find_tag(pos_);
      std::string text = src_.substr(pos_, start - pos_);
      if (start == src_.size()) {
        emit_data(std::move(text), pos_);
        break;
      }
      const char kind = src_[start + 1];  // '{', '%' or '#'
      size_t p = start + 2;
      const char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : 0;
      if (sign == '-') {
        text.resize(rstrip_end(text));
      } else if (sign != '+' && kind != '{') {  // lstrip_blocks
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && l_pos < text.size() &&
            space_run(text, l_pos) == text.size() - l_pos)
          text.resize(l_pos);
      }
      if (sign) ++p;
      emit_data(std::move(text), pos_);
      const int tag_line = line_at(start);
      if (kind == '#') {
        const size_t end = src_.find("#}", p);
        if (end == std::string::npos) throw Error("missing end of comment tag", tag_line);
        // -#} strips what follows; #} drops one newline (trim_blocks); +#} keeps it.
        pos_ = end + 2;
        const char esign = end > p && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
        line_starting = after_tag_end(esign, true);
        continue;
      }
      if (kind == '%' && raw_begin(p)) {
        pos_ = p;
        line_starting = lex_raw(tag_line);
        continue;
      }
      line_starting = lex_tag(kind == '{' ? Tok::kVarBegin : Tok::kBlockBegin, p, tag_line);
    }
    tokens_.push_back({Tok::kEof, "", line_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  std::string src_;
  const Limits& limits_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
  size_t line_pos_ = 0;
  int line_ = 1;

  int line_at(size_t pos) {  // positions are asked for in increasing order
    if (pos < line_pos_) {
      line_pos_ = 0;
      line_ = 1;
    }
    for (; line_pos_ < pos && line_pos_ < src_.size(); ++line_pos_)
      if (src_[line_pos_] == '\n') ++line_;
    return line_;
  }

  size_t find_tag(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return src_.size();
  }

  void emit_data(std::string text, size_t at) {
    if (text.empty()) return;
    tokens_.push_back({Tok::kData, std::move(text), line_at(at)});
  }

  // After a tag's closing delimiter at pos_ (already past it): applies -, + or trim_blocks and
  // returns whether the consumed text ended with a newline (jinja2's line_starting).
  bool after_tag_end(char sign, bool trim) {
    if (sign == '-') {
      const size_t n = space_run(src_, pos_);
      pos_ += n;
      return n > 0 && src_[pos_ - 1] == '\n';
    }
    if (sign != '+' && trim && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
      return true;
    }
    return false;
  }

  // {% raw %}: p is just past "{%" and its sign.
  bool raw_begin(size_t p) const {
    p += space_run(src_, p);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    p += space_run(src_, p);
    if (p < src_.size() && src_[p] == '-') ++p;  // jinja2 takes `raw -%}` and `raw %}`, not `raw +%}`
    return src_.compare(p, 2, "%}") == 0;
  }

  bool lex_raw(int line) {
    size_t p = src_.find("%}", pos_) + 2;
    const char bsign = src_[p - 3] == '-' ? '-' : 0;
    pos_ = p;
    if (bsign == '-') pos_ += space_run(src_, pos_);
    // Find {%[-+]? endraw [-+]?%}
    for (size_t i = src_.find("{%", pos_); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t q = i + 2;
      const char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (sign) ++q;
      q += space_run(src_, q);
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      q += space_run(src_, q);
      const char esign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
      if (esign) ++q;
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string body = src_.substr(pos_, i - pos_);
      if (sign == '-') {
        body.resize(rstrip_end(body));
      } else if (sign != '+') {
        const size_t nl = body.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 && l_pos < body.size() && space_run(body, l_pos) == body.size() - l_pos) body.resize(l_pos);
      }
      emit_data(std::move(body), pos_);
      pos_ = q + 2;
      return after_tag_end(esign, true);
    }
    throw Error("missing end of raw directive", line);
  }

  bool lex_tag(Tok begin, size_t p, int line) {
    tokens_.push_back({begin, "", line});
    const bool block = begin == Tok::kBlockBegin;
    const char close = block ? '%' : '}';
    std::vector<char> brackets;
    while (true) {
      p += space_run(src_, p);
      if (p >= src_.size()) throw Error(block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'", line);
      const int tok_line = line_at(p);
      if (brackets.empty()) {
        char sign = 0;
        size_t q = p;
        if (src_[q] == '-' || (block && src_[q] == '+')) sign = src_[q++];
        if (q + 1 < src_.size() && src_[q] == close && src_[q + 1] == '}') {
          tokens_.push_back({block ? Tok::kBlockEnd : Tok::kVarEnd, "", tok_line});
          pos_ = q + 2;
          return after_tag_end(sign, block);
        }
      }
      if (tokens_.size() > limits_.max_source_bytes) throw Error("too many tokens", tok_line);
      const char c = src_[p];
      if (is_ident_start(c)) {
        size_t q = p;
        while (q < src_.size() && is_ident(src_[q])) ++q;
        tokens_.push_back({Tok::kName, src_.substr(p, q - p), tok_line});
        p = q;
      } else if (is_digit(c)) {
        p = lex_number(p, tok_line);
      } else if (c == '\'' || c == '"') {
        p = lex_string(p, tok_line);
      } else {
        static const char* const ops2[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* o : ops2)
          if (src_.compare(p, 2, o) == 0) op = o;
        if (op.empty()) {
          if (std::string_view("+-/*%~<>=.,:|()[]{};").find(c) == std::string_view::npos)
            throw Error(std::string("unexpected char '") + c + "'", tok_line);
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") brackets.push_back(op[0]);
        if (op == ")" || op == "]" || op == "}") {
          const char want = op == ")" ? '(' : op == "]" ? '[' : '{';
          if (brackets.empty() || brackets.back() != want) throw Error("unexpected '" + op + "'", tok_line);
          brackets.pop_back();
        }
        tokens_.push_back({Tok::kOp, op, tok_line});
        p += op.size();
      }
    }
  }

  size_t lex_number(size_t p, int line) {
    size_t q = p;
    auto digits = [&](size_t& r) {  // (\d+_)*\d+
      const size_t s = r;
      while (r < src_.size() && (is_digit(src_[r]) || (src_[r] == '_' && r + 1 < src_.size() && is_digit(src_[r + 1]) && r > s)))
        ++r;
      return r > s;
    };
    digits(q);
    bool is_float = false;
    size_t r = q;
    if (r < src_.size() && src_[r] == '.' && r + 1 < src_.size() && is_digit(src_[r + 1])) {
      ++r;
      digits(r);
      is_float = true;
      q = r;
    }
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t e = q + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && is_digit(src_[e])) {
        digits(e);
        is_float = true;
        q = e;
      }
    }
    std::string text;
    for (size_t k = p; k < q; ++k)
      if (src_[k] != '_') text += src_[k];
    Token t{is_float ? Tok::kFloat : Tok::kInt, text, line};
    errno = 0;
    if (is_float) {
      t.fval = std::strtod(text.c_str(), nullptr);
    } else {
      if (text.size() > 1 && text[0] == '0' && text.find_first_not_of('0') != std::string::npos)
        throw Error("invalid integer literal '" + text + "'", line);
      char* end = nullptr;
      t.ival = std::strtoll(text.c_str(), &end, 10);
      if (errno == ERANGE) throw Error("integer literal too large: " + text, line);
    }
    tokens_.push_back(std::move(t));
    return q;
  }

  static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // A string literal, decoded as Python's unicode-escape codec does.
  size_t lex_string(size_t p, int line) {
    const char q = src_[p];
    std::string out;
    size_t i = p + 1;
    while (true) {
      if (i >= src_.size()) throw Error("unexpected end of string", line);
      const char c = src_[i];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) throw Error("unexpected end of string", line);
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int k = 0; k < n; ++k) {
            const int h = i < src_.size() ? hexval(src_[i]) : -1;
            if (h < 0) throw Error(std::string("truncated \\") + e + " escape in string", line);
            cp = cp * 16 + static_cast<uint32_t>(h);
            ++i;
          }
          if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) throw Error("invalid code point in string escape", line);
          utf8_append(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k, ++i)
              cp = cp * 8 + static_cast<uint32_t>(src_[i] - '0');
            utf8_append(out, cp);
          } else if (e == 'N') {
            throw Error("\\N{...} escapes are not supported", line);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    tokens_.push_back({Tok::kString, std::move(out), line});
    return i + 1;
  }
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const Limits& limits) {
  if (source.size() > limits.max_source_bytes)
    throw Error("template too large (" + std::to_string(source.size()) + " bytes, limit " +
                std::to_string(limits.max_source_bytes) + ")");
  if (!is_valid_utf8(source)) throw Error("template is not valid UTF-8");
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  return Lexer(std::move(src), limits).run();
}

}  // namespace fathom::jinja
