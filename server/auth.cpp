#include "server/auth.h"

#include <algorithm>
#include <fstream>

#include "base/error.h"

namespace fathom {

namespace {

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

bool same_bytes(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

bool api_key_accepted(const std::string& authorization_header, const std::vector<std::string>& keys) {
  return keys.empty() || api_key_index(authorization_header, keys).has_value();
}

std::optional<size_t> api_key_index(const std::string& authorization_header, const std::vector<std::string>& keys) {
  static const std::string kPrefix = "Bearer ";
  if (authorization_header.size() <= kPrefix.size() || authorization_header.compare(0, kPrefix.size(), kPrefix) != 0)
    return std::nullopt;
  const std::string key = authorization_header.substr(kPrefix.size());
  std::optional<size_t> index;
  for (size_t i = 0; i < keys.size(); ++i)  // every key compared, whichever matches
    if (same_bytes(key, keys[i]) && !index) index = i;
  return index;
}

std::vector<std::string> read_api_keys_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read the API key file '" + path + "'");
  std::vector<std::string> keys;
  for (std::string line; std::getline(in, line);) {
    const std::string key = trimmed(line);
    if (!key.empty() && key[0] != '#') keys.push_back(key);
  }
  if (keys.empty()) throw Error("the API key file '" + path + "' holds no key");
  return keys;
}

std::vector<std::string> split_api_keys(const std::string& list) {
  std::vector<std::string> keys;
  size_t at = 0;
  while (at <= list.size()) {
    const size_t comma = std::min(list.find(',', at), list.size());
    const std::string key = trimmed(list.substr(at, comma - at));
    if (!key.empty()) keys.push_back(key);
    at = comma + 1;
  }
  return keys;
}

}  // namespace fathom
