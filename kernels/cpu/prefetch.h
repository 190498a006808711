#pragma once
// Software prefetch of a byte range, shared by the CPU kernels (any x86 level: prefetcht0/t1 are
// SSE). Internal linkage, each including file its own copy (scripts/check_isa_isolation.py).
#include <cstdint>

namespace fathom::cpu {
namespace {

// __builtin_prefetch's locality: 3 is prefetcht0 (into L1), 2 is prefetcht1 (into L2).
constexpr int kIntoL1 = 3;
constexpr int kIntoL2 = 2;

// Prefetches every 64-byte line of [p, p + bytes) (bytes 1: the line holding p).
template <int Locality>
inline void prefetch_lines(const void* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(static_cast<const char*>(p) + o, /*rw=*/0, Locality);
}

}  // namespace
}  // namespace fathom::cpu
