#pragma once
#include <cstddef>
#include <string>

namespace fathom {

// Element type of the paged KV cache (kernels read it in place; engine/kv owns the storage).
enum class KvDtype { kF32, kF16 };

inline size_t kv_dtype_bytes(KvDtype t) {
  switch (t) {
    case KvDtype::kF32: return 4;
    case KvDtype::kF16: return 2;
  }
  return 0;
}

inline const char* kv_dtype_name(KvDtype t) {
  switch (t) {
    case KvDtype::kF32: return "f32";
    case KvDtype::kF16: return "f16";
  }
  return "?";
}

// Throws fathom::Error for anything but "f32" / "f16".
KvDtype parse_kv_dtype(const std::string& name);

}  // namespace fathom
