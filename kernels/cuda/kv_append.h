#pragma once
// Appending new tokens' K and V rows to the paged KV cache on the device. Spec: the engine's
// one-token append (engine/backend/cpu/kv_storage.cpp CpuKvStorage::append) repeated token by token:
// rows stored as the cache dtype (cpu::kv_store / cpu::kv_store_int8_row), the transposed-K
// slot, and the running V sum and K moments carried from the previous block's.
#include <cstdint>

#include "kernels/cuda/emu/cuda_emu.h"
#include "base/kv_dtype.h"

namespace fathom::cuda {

// Storage element of the cache on the device. kBF16 exists only here (KvDtype has no bf16):
// round to nearest even, as __float2bfloat16_rn.
enum class KvStoreType { kF32, kF16, kBF16, kI8 };

inline KvStoreType kv_store_type(KvDtype t) {
  switch (t) {
    case KvDtype::kF32: return KvStoreType::kF32;
    case KvDtype::kF16: return KvStoreType::kF16;
    case KvDtype::kI8: return KvStoreType::kI8;
  }
  return KvStoreType::kF32;
}

// One layer of the paged cache (device pointers), the layout of PagedKvView.
struct KvCacheLayer {
  void* k = nullptr;           // [num_blocks][n_kv_heads][block_size][head_dim], `dtype`
  void* v = nullptr;           // same layout as k
  void* k_t = nullptr;         // optional: [num_blocks][n_kv_heads][head_dim][block_size], `dtype`
  KvInt8Row* k_rows = nullptr;  // kI8 only: [num_blocks][n_kv_heads][block_size]
  KvInt8Row* v_rows = nullptr;  // kI8 only: same
  float* v_sum = nullptr;      // optional: [num_blocks][n_kv_heads][head_dim] running sums of V
  float* k_moments = nullptr;  // optional: [num_blocks][n_kv_heads][2][head_dim] running K mean, M2
  KvStoreType dtype = KvStoreType::kF32;
  int32_t block_size = 16, n_kv_heads = 0, head_dim = 0;
};

// A batch of n_tokens new tokens from n_seqs sequences (device pointers). Tokens of one
// sequence are contiguous and in increasing, consecutive positions (a prefill chunk or one
// decode token), and the sequence's earlier positions are already in the cache.
struct KvAppendBatch {
  const float* k = nullptr;  // token i's rows: k + i * k_token_stride, [n_kv_heads][head_dim] f32
  const float* v = nullptr;  // likewise with v_token_stride
  int64_t k_token_stride = 0, v_token_stride = 0;  // elements; >= n_kv_heads * head_dim
  const int32_t* positions = nullptr;        // [n_tokens] absolute position of each token
  const int32_t* seq_token_start = nullptr;  // [n_seqs + 1] CSR: sequence s owns tokens [start[s], start[s+1])
  const int32_t* block_tables = nullptr;     // [n_seqs][table_stride] logical -> physical block
  int32_t table_stride = 0;
  int32_t n_tokens = 0, n_seqs = 0;
  // Optional, for speculative decoding's rollback (engine/backend/backend.h rollback_kv): every
  // token of sequence s with running_row[s] >= 0 writes its running planes after its append — V
  // sum, K mean, K M2, head_dim floats each, per kv head — to
  // running + ((running_row[s] + i - seq_token_start[s]) * n_kv_heads + h) * 3 * head_dim.
  float* running = nullptr;
  const int32_t* running_row = nullptr;  // [n_seqs]
};

// Writes every token's K/V rows (and INT8 row parameters, transposed K, V sums and K moments when
// present). The V sums and K moments equal n_tokens one-by-one appends exactly (same f32
// operations, same order: key_moments_update).
cudaError_t kv_append(const KvCacheLayer& cache, const KvAppendBatch& batch, cudaStream_t stream);

// Sets block `block`'s running planes (V sum, K moments; those the layer has) from `running`
// ([n_kv_heads][3][head_dim]: V sum, K mean, K M2, as KvAppendBatch::running holds them).
cudaError_t kv_set_running(const KvCacheLayer& cache, int32_t block, const float* running, cudaStream_t stream);
// Copies them out into `running` in the same layout (sparse drafting keeps them while its steps
// append at positions a verify step writes again).
cudaError_t kv_get_running(const KvCacheLayer& cache, int32_t block, float* running, cudaStream_t stream);

}  // namespace fathom::cuda
