#include "engine/attention/decode_attention.h"

namespace fathom {

int64_t dense_kv_bytes(const KvLayout& kv, int64_t keys) {
  return 2 * keys * static_cast<int64_t>(kv_row_bytes(kv.dtype, kv.head_dim)) * kv.n_kv_heads;
}

}  // namespace fathom
