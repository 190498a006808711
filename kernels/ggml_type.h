#pragma once
// GGML tensor element types as stored in GGUF files: ids, block sizes and bytes per block.
// Weights stay in these formats; kernels read them directly.
#include <cstddef>
#include <cstdint>

namespace fathom {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
  IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, IQ1_M = 29, BF16 = 30,
  TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct GgmlTypeInfo {
  const char* name;
  int64_t block_size;  // elements per block
  int64_t type_size;   // bytes per block
  bool kernels_read;   // true when fathom's kernels can read this type
};

// nullptr when `id` is not a GGML type this build knows.
const GgmlTypeInfo* ggml_type_info(uint32_t id);
inline const GgmlTypeInfo& ggml_info(GgmlType t) { return *ggml_type_info(static_cast<uint32_t>(t)); }
const char* ggml_type_name(GgmlType t);
// Bytes of a row of n elements; n must be a multiple of the block size.
size_t ggml_row_size(GgmlType t, int64_t n);

}  // namespace fathom
