#include "kernels/cpu/cache_evict.h"

#include <cstdint>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace fathom::cpu {
namespace {

#if defined(__x86_64__)
bool has_clflushopt() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 23)) != 0;
}

__attribute__((target("clflushopt"))) void flush_opt(const char* p, const char* end) {
  for (; p < end; p += 64) _mm_clflushopt(const_cast<char*>(p));
}

void flush(const char* p, const char* end) {
  for (; p < end; p += 64) _mm_clflush(p);
}
#endif

}  // namespace

void evict_from_cache(const void* p, size_t bytes) {
#if defined(__x86_64__)
  if (bytes == 0) return;
  static const bool opt = has_clflushopt();
  const char* first = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63});
  const char* end = static_cast<const char*>(p) + bytes;
  if (opt) flush_opt(first, end);
  else flush(first, end);
  _mm_mfence();
#else
  (void)p;
  (void)bytes;
#endif
}

}  // namespace fathom::cpu
