#pragma once
#include <cstddef>
#include <string>

namespace fathom {

// Element type of the paged KV cache (kernels read it in place; the backend owns the storage).
//   kI8: asymmetric per-row INT8 (ALISA): one row = one token of one kv head (head_dim values),
//        x ≈ scale·x_q + min with x_q ∈ [0, 255]; the (scale, min) pairs live beside the tiles
//        (PagedKvView::k_rows / v_rows).
enum class KvDtype { kF32, kF16, kI8 };

// Quantization parameters of one INT8 row: x = scale·x_q + min (scale = (max − min)/255,
// 0 for a constant row). Same meaning as ref::Int8Group with group = one row.
struct KvInt8Row {
  float scale = 0.0f;
  float min = 0.0f;
};

// Bytes per stored element (INT8 rows also carry one KvInt8Row each, see kv_row_bytes).
inline size_t kv_dtype_bytes(KvDtype t) {
  switch (t) {
    case KvDtype::kF32: return 4;
    case KvDtype::kF16: return 2;
    case KvDtype::kI8: return 1;
  }
  return 0;
}

// Bytes a kernel reads for one K or V row of `head_dim` elements, including INT8's parameters.
inline size_t kv_row_bytes(KvDtype t, int head_dim) {
  return kv_dtype_bytes(t) * static_cast<size_t>(head_dim) + (t == KvDtype::kI8 ? sizeof(KvInt8Row) : 0);
}

inline const char* kv_dtype_name(KvDtype t) {
  switch (t) {
    case KvDtype::kF32: return "f32";
    case KvDtype::kF16: return "f16";
    case KvDtype::kI8: return "int8";
  }
  return "?";
}

// Throws fathom::Error for anything but "f32" / "f16" / "int8".
KvDtype parse_kv_dtype(const std::string& name);

}  // namespace fathom
