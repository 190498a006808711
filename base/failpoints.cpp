#include "base/failpoints.h"

#include <array>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <mutex>

#include "base/error.h"

namespace fathom::failpoints {
namespace {

constexpr size_t kPoints = std::size(kFailpointNames);

struct Point {
  std::atomic<bool> armed{false};
  std::atomic<uint64_t> every{1};  // fires on hits that are multiples of this
  std::atomic<uint64_t> hits{0};
};

std::array<Point, kPoints> g_points;
std::atomic<bool> g_any{false};

int index_of(std::string_view name) {
  for (size_t i = 0; i < kPoints; ++i)
    if (kFailpointNames[i] == name) return static_cast<int>(i);
  return -1;
}

std::string known_names() {
  std::string s;
  for (std::string_view n : kFailpointNames) {
    if (!s.empty()) s += ", ";
    s += n;
  }
  return s;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

void configure(std::string_view spec) {
  struct Entry {
    int point;
    uint64_t every;
  };
  std::array<Entry, kPoints> entries{};
  size_t n = 0;
  std::string_view rest = spec;
  while (!trim(rest).empty()) {
    const size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    const std::string where = "FATHOM_FAILPOINTS entry '" + std::string(item) + "': ";
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos) throw Error(where + "expected point:action[@N]");
    const int point = index_of(item.substr(0, colon));
    if (point < 0) throw Error(where + "unknown point (known: " + known_names() + ")");
    std::string_view action = item.substr(colon + 1);
    uint64_t every = 1;
    if (const size_t at = action.find('@'); at != std::string_view::npos) {
      const std::string_view num = action.substr(at + 1);
      const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), every);
      if (ec != std::errc() || end != num.data() + num.size() || every < 1)
        throw Error(where + "N in @N must be a positive integer");
      action = action.substr(0, at);
    }
    if (action != "throw") throw Error(where + "unknown action '" + std::string(action) + "' (known: throw)");
    if (n == kPoints) throw Error(where + "a point is named twice");
    for (size_t i = 0; i < n; ++i)
      if (entries[i].point == point) throw Error(where + "a point is named twice");
    entries[n++] = Entry{point, every};
  }
  for (Point& p : g_points) {
    p.armed.store(false);
    p.hits.store(0);
  }
  for (size_t i = 0; i < n; ++i) {
    Point& p = g_points[entries[i].point];
    p.every.store(entries[i].every);
    p.armed.store(true);
  }
  g_any.store(n > 0);
}

void configure_from_environment() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (const char* spec = std::getenv("FATHOM_FAILPOINTS")) configure(spec);
  });
}

void hit(std::string_view point) {
  if (!g_any.load(std::memory_order_relaxed)) return;
  const int i = index_of(point);
  FATHOM_CHECK(i >= 0, "unknown failpoint");
  Point& p = g_points[i];
  if (!p.armed.load(std::memory_order_relaxed)) return;
  const uint64_t h = p.hits.fetch_add(1) + 1;
  if (h % p.every.load() == 0) throw Error("failpoint " + std::string(point) + " fired (hit " + std::to_string(h) + ")");
}

std::string describe() {
  std::string s;
  for (size_t i = 0; i < kPoints; ++i) {
    if (!g_points[i].armed.load()) continue;
    if (!s.empty()) s += ',';
    s += kFailpointNames[i];
    s += ":throw@" + std::to_string(g_points[i].every.load());
  }
  return s;
}

}  // namespace fathom::failpoints
