#include "server/auth.h"

namespace fathom {

namespace {

bool same_bytes(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

bool api_key_accepted(const std::string& authorization_header, const std::vector<std::string>& keys) {
  if (keys.empty()) return true;
  static const std::string kPrefix = "Bearer ";
  if (authorization_header.size() <= kPrefix.size() || authorization_header.compare(0, kPrefix.size(), kPrefix) != 0)
    return false;
  const std::string key = authorization_header.substr(kPrefix.size());
  bool accepted = false;
  for (const std::string& k : keys) accepted |= same_bytes(key, k);
  return accepted;
}

}  // namespace fathom
