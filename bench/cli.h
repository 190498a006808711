// Command-line lists the benches share: "--depths 1024,4096", "--attention dense,sparq".
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace fathom::bench {

// The comma-separated items of a flag's value, in order ("a,,b" keeps the empty item: callers
// that need non-empty items check them).
inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

// The comma-separated integers of a flag's value, each a whole base-10 integer in [lo, hi].
// Throws std::invalid_argument naming the flag on an empty list, a non-integer item ("12x", "")
// or one out of range: a typo must not run an hour-long benchmark on a default.
template <typename Int = int64_t>
std::vector<Int> parse_int_list(const std::string& s, const char* flag, int64_t lo, int64_t hi) {
  std::vector<Int> out;
  for (const std::string& item : split_list(s)) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi)
      throw std::invalid_argument(std::string(flag) + ": expected comma-separated integers in [" + std::to_string(lo) +
                                  ", " + std::to_string(hi) + "], got '" + s + "'");
    out.push_back(static_cast<Int>(v));
  }
  if (out.empty()) throw std::invalid_argument(std::string(flag) + " is empty");
  return out;
}

// One integer flag value in [lo, hi], with parse_int_list's checks.
template <typename Int = int64_t>
Int parse_int(const std::string& s, const char* flag, int64_t lo, int64_t hi) {
  const std::vector<Int> v = parse_int_list<Int>(s, flag, lo, hi);
  if (v.size() != 1) throw std::invalid_argument(std::string(flag) + ": expected one integer, got '" + s + "'");
  return v[0];
}

}  // namespace fathom::bench
