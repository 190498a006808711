#include "engine/model/unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <vector>

#include "base/utf8.h"

namespace fathom {
namespace {

struct CccRange {
  uint32_t first, last;
  uint8_t ccc;
};
struct Decomp {
  uint32_t cp;
  uint16_t offset;
  uint8_t length;
};
struct Compose {
  uint32_t first, second, composite;
};

constexpr CccRange kCcc[] = {
#define NFC_CCC
#include "engine/model/unicode_nfc.inc"
#undef NFC_CCC
};
constexpr Decomp kDecomp[] = {
#define NFC_DECOMP
#include "engine/model/unicode_nfc.inc"
#undef NFC_DECOMP
};
constexpr uint32_t kDecompData[] = {
#define NFC_DECOMP_DATA
#include "engine/model/unicode_nfc.inc"
#undef NFC_DECOMP_DATA
};
constexpr Compose kCompose[] = {
#define NFC_COMPOSE
#include "engine/model/unicode_nfc.inc"
#undef NFC_COMPOSE
};

// Hangul syllables (Unicode 3.12): S = SBase + (L * VCount + V) * TCount + T.
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t ccc_of(uint32_t cp) {
  const auto it = std::upper_bound(std::begin(kCcc), std::end(kCcc), cp,
                                   [](uint32_t c, const CccRange& r) { return c < r.first; });
  if (it == std::begin(kCcc)) return 0;
  const CccRange& r = *std::prev(it);
  return cp <= r.last ? r.ccc : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto it = std::lower_bound(std::begin(kDecomp), std::end(kDecomp), cp,
                                   [](const Decomp& d, uint32_t c) { return d.cp < c; });
  if (it != std::end(kDecomp) && it->cp == cp) {
    out.insert(out.end(), kDecompData + it->offset, kDecompData + it->offset + it->length);
  } else {
    out.push_back(cp);
  }
}

// The primary composite of (a, b), or 0.
uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto it = std::lower_bound(std::begin(kCompose), std::end(kCompose), std::pair(a, b),
                                   [](const Compose& c, std::pair<uint32_t, uint32_t> k) {
                                     return c.first != k.first ? c.first < k.first : c.second < k.second;
                                   });
  return it != std::end(kCompose) && it->first == a && it->second == b ? it->composite : 0;
}

bool decode_utf8(std::string_view s, std::vector<uint32_t>& out) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    size_t n = b0 < 0x80 ? 1 : b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : b0 >= 0xC2 ? 2 : 0;
    if (n == 0 || b0 > 0xF4 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    for (size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    out.push_back(cp);
    i += n;
  }
  return true;
}


}  // namespace

std::string nfc(std::string_view text) {
  if (std::all_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return std::string(text);
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  if (!decode_utf8(text, cps)) return std::string(text);
  std::vector<uint32_t> d;
  d.reserve(cps.size() + 8);
  for (uint32_t cp : cps) decompose(cp, d);
  // Canonical ordering: each run of non-starters stably sorted by combining class.
  for (size_t i = 0; i < d.size();) {
    if (ccc_of(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && ccc_of(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + i, d.begin() + j, [](uint32_t a, uint32_t b) { return ccc_of(a) < ccc_of(b); });
    i = j;
  }
  // Canonical composition: a character joins the last starter unless blocked (something between
  // them has a combining class of 0 or not below its own).
  std::vector<uint32_t> out;
  out.reserve(d.size());
  size_t starter = SIZE_MAX;
  uint8_t last_ccc = 0;  // of the last character kept after the starter
  for (uint32_t cp : d) {
    const uint8_t cc = ccc_of(cp);
    if (starter != SIZE_MAX) {
      const bool blocked = out.size() - 1 != starter && last_ccc >= cc;
      if (!blocked) {
        if (const uint32_t c = compose(out[starter], cp); c != 0) {
          out[starter] = c;
          continue;
        }
      }
    }
    if (cc == 0) {
      starter = out.size();
      last_ccc = 0;
    } else {
      last_ccc = cc;
    }
    out.push_back(cp);
  }
  std::string s;
  s.reserve(text.size());
  for (uint32_t cp : out) append_utf8(cp, s);
  return s;
}

}  // namespace fathom
