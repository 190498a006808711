#include "kernels/cpu/amx.h"

#if defined(__x86_64__) && defined(__linux__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace fathom::cpu {
namespace {

struct AmxBits {
  bool tile = false, bf16 = false, int8 = false, avx512_bf16 = false;
};

AmxBits cpu_bits() {
  AmxBits b;
#if defined(__x86_64__) && defined(__linux__)
  unsigned a, bx, c, d;
  if (!__get_cpuid_count(7, 0, &a, &bx, &c, &d)) return b;
  b.tile = (d >> 24) & 1;
  b.bf16 = (d >> 22) & 1;
  b.int8 = (d >> 25) & 1;
  if (__get_cpuid_count(7, 1, &a, &bx, &c, &d)) b.avx512_bf16 = (a >> 5) & 1;
#endif
  return b;
}

// The tile data state, once per process (the permission covers every thread).
bool tiles_permitted() {
  static const bool ok = [] {
#if defined(__x86_64__) && defined(__linux__)
    if (!cpu_bits().tile) return false;
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return ok;
}

}  // namespace

bool amx_bf16_usable() {
  static const bool ok = [] {
    const AmxBits b = cpu_bits();
    return b.bf16 && b.avx512_bf16 && __builtin_cpu_supports("avx512bw") && tiles_permitted();
  }();
  return ok;
}

bool amx_int8_usable() {
  static const bool ok = [] {
    const AmxBits b = cpu_bits();
    return b.int8 && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni") && tiles_permitted();
  }();
  return ok;
}

}  // namespace fathom::cpu
