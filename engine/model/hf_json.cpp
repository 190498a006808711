#include "engine/model/hf_json.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/json_depth.h"

namespace fathom::hf {

Json parse_json(std::string_view text, const std::string& path, int max_depth) {
  if (json_nesting_depth(text, max_depth) > max_depth)
    throw Error(path + ": JSON nests deeper than " + std::to_string(max_depth) + " levels");
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Error(path + ": not valid JSON");
  return j;
}

std::optional<std::string> read_text_file(const std::string& path, size_t max_bytes) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  if (!std::filesystem::is_regular_file(path, ec)) throw Error(path + ": not a regular file");
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw Error(path + ": cannot stat: " + ec.message());
  if (size > max_bytes)
    throw Error(path + ": " + std::to_string(size) + " bytes, over the limit of " + std::to_string(max_bytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open");
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().size() > max_bytes) throw Error(path + ": grew past the limit while read");
  return text.str();
}

std::string shown(std::string_view s) {
  constexpr size_t kMax = 80;
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    out += (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '?';
  }
  return out + (s.size() > kMax ? "...'" : "'");
}

std::string shown(const Json& v) {
  if (v.is_string()) return shown(v.get_ref<const std::string&>());
  const std::string s = shown(std::string_view(v.dump()));  // a number or structure: unquoted
  return s.substr(1, s.size() - 2);
}

std::vector<int64_t> token_ids(const Json* v, const std::string& path, const char* key) {
  std::vector<int64_t> ids;
  if (!v) return ids;
  auto one = [&](const Json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0)
      throw Error(path + ": " + key + " = " + shown(x) + " is not a token id");
    ids.push_back(x.get<int64_t>());
  };
  if (v->is_array()) {
    for (const Json& x : *v) one(x);
  } else {
    one(*v);
  }
  return ids;
}

void Reader::fail(const std::string& what) const { throw Error(path_ + ": " + what); }

const Json* Reader::field(const Json& obj, const char* key) const {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

bool Reader::flag(const Json& obj, const char* key, bool fallback, const std::string& where) const {
  const Json* v = field(obj, key);
  if (!v) return fallback;
  if (!v->is_boolean()) fail(where + " " + key + " = " + shown(*v) + " is not true or false");
  return v->get<bool>();
}

std::string Reader::type_of(const Json& obj, const std::string& where) const {
  const Json* t = field(obj, "type");
  if (!t || !t->is_string()) fail(where + " has no type");
  return t->get<std::string>();
}

std::pair<std::string, std::string> merge_parts(const Reader& r, const Json& m) {
  std::pair<std::string, std::string> parts;
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    if (space == std::string::npos) r.fail("merge " + shown(m) + " is not \"left right\"");
    parts = {s.substr(0, space), s.substr(space + 1)};
  } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    parts = {m[0].get<std::string>(), m[1].get<std::string>()};
  } else {
    r.fail("merge " + shown(m) + " is neither \"left right\" nor [left, right]");
  }
  if (parts.first.empty() || parts.second.empty() || parts.first.find(' ') != std::string::npos ||
      parts.second.find(' ') != std::string::npos)
    r.fail("merge " + shown(m) + " has an empty part or a space in a part");
  return parts;
}

}  // namespace fathom::hf
