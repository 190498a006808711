#pragma once
#include <cstdint>

// Whether this process may run AMX tile instructions: the CPU has the extension (CPUID) and Linux
// granted the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once per process; refused on
// kernels before 5.16 or when the hypervisor hides AMX). Plain code: callable on any x86-64 CPU.
namespace fathom::cpu {

bool amx_bf16_usable();  // AMX-TILE + AMX-BF16 + AVX512-BF16 (the attention rows kernel)
bool amx_int8_usable();  // AMX-TILE + AMX-INT8 + AVX-512 VNNI (the packed matmul kernels)

// The LDTILECFG memory operand, palette 1: tile t has rows[t] rows of colsb[t] bytes.
struct AmxTileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace fathom::cpu
