#include "kernels/ref/attention_state.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/ref/dequant.h"

namespace fathom::ref {

AttentionState empty_state(int32_t head_dim) {
  AttentionState st;
  st.o.assign(head_dim, 0.0f);
  return st;
}

AttentionState merge_states(const AttentionState& a, const AttentionState& b) {
  if (b.s == -INFINITY) return a;  // the −inf guard: an empty subset is the identity
  if (a.s == -INFINITY) return b;
  const double s_max = std::max(a.s, b.s);
  const double wa = std::exp(a.s - s_max), wb = std::exp(b.s - s_max);
  AttentionState r;
  r.o.resize(a.o.size());
  for (size_t c = 0; c < a.o.size(); ++c) r.o[c] = static_cast<float>((wa * a.o[c] + wb * b.o[c]) / (wa + wb));
  r.m = std::max(a.m, b.m);
  r.s = static_cast<float>(s_max + std::log(wa + wb));
  return r;
}

void load_kv_row(const PagedKvView& kv, const void* base, int32_t t, int32_t kv_head, float* dst) {
  const int32_t d = kv.head_dim;
  const int64_t off = kv.tile_offset(t / kv.block_size, kv_head) + static_cast<int64_t>(t % kv.block_size) * d;
  switch (kv.dtype) {
    case KvDtype::kF32: std::copy_n(static_cast<const float*>(base) + off, d, dst); return;
    case KvDtype::kF16:
      for (int32_t c = 0; c < d; ++c) dst[c] = fp16_to_fp32(static_cast<const uint16_t*>(base)[off + c]);
      return;
    case KvDtype::kI8: {
      const KvInt8Row& r = (base == kv.k ? kv.k_rows : kv.v_rows)[kv.row_index(t, kv_head)];
      for (int32_t c = 0; c < d; ++c) dst[c] = r.scale * static_cast<float>(static_cast<const uint8_t*>(base)[off + c]) + r.min;
      return;
    }
  }
}

int64_t partial_attention(const PagedKvView& kv, int32_t kv_head, const float* q, int32_t n_rows,
                          LogitScale scale, const int32_t* positions, int64_t n, AttentionState* states) {
  const int32_t d = kv.head_dim;
  for (int32_t r = 0; r < n_rows; ++r) states[r] = empty_state(d);
  if (n == 0) return 0;
  std::vector<double> logits(static_cast<size_t>(n_rows) * n);  // [n_rows][n]
  std::vector<float> row(d);
  for (int64_t j = 0; j < n; ++j) {  // pass 1: K, one read per position for all rows
    load_kv_row(kv, kv.k, positions[j], kv_head, row.data());
    for (int32_t r = 0; r < n_rows; ++r) {
      double dot = 0;
      for (int32_t c = 0; c < d; ++c) dot += static_cast<double>(q[static_cast<int64_t>(r) * d + c]) * row[c];
      logits[r * n + j] = reference_logit(dot, scale);
    }
  }
  std::vector<double> denom(n_rows), maxl(n_rows, -INFINITY);
  for (int32_t r = 0; r < n_rows; ++r) {
    double* l = &logits[r * n];
    for (int64_t j = 0; j < n; ++j) maxl[r] = std::max(maxl[r], l[j]);
    for (int64_t j = 0; j < n; ++j) denom[r] += (l[j] = std::exp(l[j] - maxl[r]));
  }
  std::vector<double> acc(static_cast<size_t>(n_rows) * d, 0.0);
  for (int64_t j = 0; j < n; ++j) {  // pass 2: V, one read per position for all rows
    load_kv_row(kv, kv.v, positions[j], kv_head, row.data());
    for (int32_t r = 0; r < n_rows; ++r)
      for (int32_t c = 0; c < d; ++c) acc[r * d + c] += logits[r * n + j] * row[c];
  }
  for (int32_t r = 0; r < n_rows; ++r) {
    for (int32_t c = 0; c < d; ++c) states[r].o[c] = static_cast<float>(acc[r * d + c] / denom[r]);
    states[r].m = static_cast<float>(maxl[r]);
    states[r].s = static_cast<float>(maxl[r] + std::log(denom[r]));
  }
  return 2 * n * d * static_cast<int64_t>(kv_dtype_bytes(kv.dtype));
}

std::vector<int32_t> position_range(int32_t begin, int32_t end) {
  std::vector<int32_t> p(std::max(0, end - begin));
  std::iota(p.begin(), p.end(), begin);
  return p;
}

}  // namespace fathom::ref
