// Bifurcated decode attention: work units over (keys, kv head, row tile) + a CSR merge.
// See bifurcated_attention.h.
#include "kernels/cuda/bifurcated_attention.h"

#include <algorithm>
#include <cstring>

namespace fathom::cuda {
namespace bifurcated_detail {  // named: the kernels' names stay unique across the .cu files

using namespace attn_common;

constexpr int kUnitWarps = 8;
constexpr int kUnitThreads = kUnitWarps * 32;
constexpr int kTile = 16;  // keys staged per step

__host__ __device__ constexpr int rows_per_warp(int dims_per_lane) { return dims_per_lane >= 8 ? 4 : 8; }

struct UnitParams {
  KvDev kv;
  const BifUnit* units;
  const int32_t* rows;
  const float* q;  // [n_seqs·n_heads][head_dim]
  float* part_acc;  // [n_slots][head_dim]
  float* part_ml;   // [n_slots][2]
  LogitScale scale;
};

// grid (n_units), kUnitThreads. Warp w owns rows w·kRpw .. of the unit (q in registers).
template <typename T, int kDpl>
__global__ void __launch_bounds__(kUnitThreads, 1) bif_unit_kernel(UnitParams p) {
  constexpr int kRpw = rows_per_warp(kDpl), kW = 32 * kDpl;
  __shared__ float k_s[kTile * kW];
  __shared__ float v_s[kTile * kW];
  __shared__ int64_t row_s[kTile];
  __shared__ KvInt8Row kp_s[kTile], vp_s[kTile];
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const BifUnit u = p.units[blockIdx.x];
  if (tid == 0) count_other(sizeof(BifUnit));
  const int d = p.kv.head_dim;
  const int first_row = warp * kRpw;
  const int my_rows = max(0, min(kRpw, u.n_rows - first_row));
  float q[kRpw][kDpl];
  int32_t row_id[kRpw];
FATHOM_UNROLL
  for (int r = 0; r < kRpw; ++r) {
    row_id[r] = 0;
    if (r < my_rows) {
      row_id[r] = load_uniform(p.rows + u.row_begin + first_row + r, lane);
    }
FATHOM_UNROLL
    for (int j = 0; j < kDpl; ++j) {
      const int c = lane + 32 * j;
      q[r][j] = 0.0f;
      if (r < my_rows && c < d) {
        q[r][j] = p.q[static_cast<int64_t>(row_id[r]) * d + c];
        count_other(sizeof(float));
      }
    }
  }
  float acc[kRpw][kDpl], m[kRpw], l[kRpw];
FATHOM_UNROLL
  for (int r = 0; r < kRpw; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
FATHOM_UNROLL
    for (int j = 0; j < kDpl; ++j) acc[r][j] = 0.0f;
  }
  int64_t from_host = 0;  // this thread's row lookups in the host tier, bytes of K and V
  for (int t0 = u.key_begin; t0 < u.key_end; t0 += kTile) {
    const int n_keys = min(kTile, u.key_end - t0);
    if (tid < n_keys) {
      const int t = t0 + tid;
      const int64_t ref = kv_row(p.kv, u.table, t, u.g, 0);
      row_s[tid] = ref;
      if (ref < 0) from_host += 2 * kv_row_bytes_of<T>(p.kv);
      if constexpr (std::is_same_v<T, uint8_t>) {
        kp_s[tid] = (ref >= 0 ? p.kv.k_rows : p.kv.host.k_rows)[row_of_ref(ref)];
        vp_s[tid] = (ref >= 0 ? p.kv.v_rows : p.kv.host.v_rows)[row_of_ref(ref)];
        count_kv(2 * sizeof(KvInt8Row));
      }
    }
    __syncthreads();
    for (int e = tid; e < kTile * kW; e += kUnitThreads) {
      const int i = e / kW, c = e % kW;
      float kx = 0.0f, vx = 0.0f;
      if (i < n_keys && c < d) {
        const int64_t ref = row_s[i], off = row_of_ref(ref) * d + c;
        kx = to_f32(static_cast<const T*>(ref >= 0 ? p.kv.k : p.kv.host.k)[off]);
        vx = to_f32(static_cast<const T*>(ref >= 0 ? p.kv.v : p.kv.host.v)[off]);
        count_kv(2 * sizeof(T));
        if constexpr (std::is_same_v<T, uint8_t>) {
          kx = kp_s[i].scale * kx + kp_s[i].min;
          vx = vp_s[i].scale * vx + vp_s[i].min;
        }
      }
      k_s[e] = kx;
      v_s[e] = vx;
    }
    __syncthreads();
    if (my_rows > 0) {  // warp-uniform
      for (int i = 0; i < n_keys; ++i) {
        float kx[kDpl], vx[kDpl];
FATHOM_UNROLL
        for (int j = 0; j < kDpl; ++j) {
          kx[j] = k_s[i * kW + lane + 32 * j];
          vx[j] = v_s[i * kW + lane + 32 * j];
        }
FATHOM_UNROLL
        for (int r = 0; r < kRpw; ++r) {
          float dot = 0.0f;
FATHOM_UNROLL
          for (int j = 0; j < kDpl; ++j) dot += q[r][j] * kx[j];
          const float logit = apply_logit_scale(warp_sum(dot), p.scale);
          const float m_new = fmaxf(m[r], logit);
          const float correction = expf(m[r] - m_new);
          const float weight = expf(logit - m_new);
          l[r] = l[r] * correction + weight;
FATHOM_UNROLL
          for (int j = 0; j < kDpl; ++j) acc[r][j] = acc[r][j] * correction + weight * vx[j];
          m[r] = m_new;
        }
      }
    }
    __syncthreads();
  }
FATHOM_UNROLL
  for (int r = 0; r < kRpw; ++r) {
    if (r < my_rows) {
      const int64_t slot = u.slot_base + first_row + r;
FATHOM_UNROLL
      for (int j = 0; j < kDpl; ++j) {
        const int c = lane + 32 * j;
        if (c < d) {
          p.part_acc[slot * d + c] = acc[r][j];
          count_write(sizeof(float));
        }
      }
      if (lane == 0) {
        p.part_ml[slot * 2 + 0] = m[r];
        p.part_ml[slot * 2 + 1] = l[r];
        count_write(2 * sizeof(float));
      }
    }
  }
  add_host_bytes_lanes(p.kv, from_host, lane);
}

template <typename T>
cudaError_t launch_units(const UnitParams& p, int n_units, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(n_units));
  switch (dims_per_lane(p.kv.head_dim)) {
    case 1: FATHOM_LAUNCH((bif_unit_kernel<T, 1>), grid, dim3(kUnitThreads), 0, stream, p); break;
    case 2: FATHOM_LAUNCH((bif_unit_kernel<T, 2>), grid, dim3(kUnitThreads), 0, stream, p); break;
    case 4: FATHOM_LAUNCH((bif_unit_kernel<T, 4>), grid, dim3(kUnitThreads), 0, stream, p); break;
    default: FATHOM_LAUNCH((bif_unit_kernel<T, 8>), grid, dim3(kUnitThreads), 0, stream, p); break;
  }
  return cudaGetLastError();
}

size_t align8(size_t n) { return (n + 7) / 8 * 8; }

}  // namespace bifurcated_detail

BifurcatedPlan plan_bifurcated_attention(const std::vector<BifSegment>& segments, const std::vector<BifSequence>& seqs,
                                         int32_t n_heads, const PagedKvView& kv, int32_t keys_per_split) {
  using namespace bifurcated_detail;
  BifurcatedPlan plan;
  plan.n_seqs = static_cast<int32_t>(seqs.size());
  plan.n_heads = n_heads;
  plan.n_kv_heads = kv.n_kv_heads;
  plan.head_dim = kv.head_dim;
  plan.rows_per_cta = kUnitWarps * rows_per_warp(attn_common::dims_per_lane(kv.head_dim));
  plan.keys_per_split = std::max(1, keys_per_split);
  const int32_t group = kv.n_kv_heads > 0 ? n_heads / kv.n_kv_heads : 1;
  std::vector<std::vector<int32_t>> slots_of(static_cast<size_t>(plan.n_seqs) * n_heads);
  // Units for keys [begin, end) of `table`, kv head g, the given query rows.
  auto add = [&](const int32_t* table, int32_t g, int32_t begin, int32_t end, const std::vector<int32_t>& rows) {
    for (size_t r0 = 0; r0 < rows.size(); r0 += plan.rows_per_cta) {
      const int32_t n_rows = static_cast<int32_t>(std::min<size_t>(plan.rows_per_cta, rows.size() - r0));
      for (int32_t k0 = begin; k0 < end; k0 += plan.keys_per_split) {
        BifUnit u{table, g, k0, std::min(end, k0 + plan.keys_per_split), static_cast<int32_t>(plan.rows.size()),
                  n_rows, plan.n_slots};
        for (int32_t i = 0; i < n_rows; ++i) {
          plan.rows.push_back(rows[r0 + i]);
          slots_of[rows[r0 + i]].push_back(plan.n_slots + i);
        }
        plan.n_slots += n_rows;
        plan.units.push_back(u);
      }
    }
  };
  std::vector<int32_t> suffix_begin(seqs.size(), 0), rows;
  for (const BifSegment& seg : segments) {
    for (int32_t i : seg.members) suffix_begin[i] = std::max(suffix_begin[i], seg.end);
    for (int32_t g = 0; g < kv.n_kv_heads; ++g) {
      rows.clear();
      for (int32_t i : seg.members)
        for (int32_t j = 0; j < group; ++j) rows.push_back(i * n_heads + g * group + j);
      add(seg.block_table, g, seg.begin, seg.end, rows);
    }
  }
  for (int32_t i = 0; i < plan.n_seqs; ++i) {
    for (int32_t g = 0; g < kv.n_kv_heads; ++g) {
      rows.clear();
      for (int32_t j = 0; j < group; ++j) rows.push_back(i * n_heads + g * group + j);
      add(seqs[i].block_table, g, suffix_begin[i], seqs[i].pos + 1, rows);
    }
  }
  plan.slot_begin.push_back(0);
  for (const std::vector<int32_t>& s : slots_of) {
    plan.slot_ids.insert(plan.slot_ids.end(), s.begin(), s.end());
    plan.slot_begin.push_back(static_cast<int32_t>(plan.slot_ids.size()));
  }
  plan.device_bytes = align8(plan.units.size() * sizeof(BifUnit)) + align8(plan.rows.size() * 4) +
                      align8(plan.slot_begin.size() * 4) + align8(plan.slot_ids.size() * 4);
  plan.workspace_floats = static_cast<size_t>(plan.n_slots) * (static_cast<size_t>(kv.head_dim) + 2);
  return plan;
}

AttnBytes bifurcated_attention_bytes(const BifurcatedPlan& plan, const PagedKvView& kv, bool sinks) {
  const int64_t d = kv.head_dim;
  const int64_t row_bytes = static_cast<int64_t>(kv_row_bytes(kv.dtype, kv.head_dim));
  AttnBytes b;
  for (const BifUnit& u : plan.units) {
    const int64_t keys = u.key_end - u.key_begin;
    b.kv_read += keys * 2 * row_bytes;
    b.other_read += static_cast<int64_t>(sizeof(BifUnit)) + keys * 4 + u.n_rows * (4 + d * 4);
    b.written += u.n_rows * (d + 2) * 4;
  }
  const int64_t out_rows = static_cast<int64_t>(plan.n_seqs) * plan.n_heads;
  b.other_read += out_rows * (sinks ? 12 : 8) + static_cast<int64_t>(plan.slot_ids.size()) * (12 + d * 4);
  b.written += out_rows * d * 4;
  return b;
}

cudaError_t bifurcated_attention(const BifurcatedPlan& plan, const PagedKvView& kv, const float* q, float* out,
                                 void* device_plan, float* workspace, LogitScale scale, const float* sinks,
                                 cudaStream_t stream) {
  using namespace attn_common;
  using namespace bifurcated_detail;
  if (plan.n_seqs == 0 || plan.n_heads == 0) return cudaSuccess;
  if (kv.head_dim <= 0 || kv.head_dim > kMaxHeadDim || kv.n_kv_heads <= 0 || plan.n_heads % kv.n_kv_heads != 0 ||
      kv.head_dim != plan.head_dim || kv.n_kv_heads != plan.n_kv_heads || device_plan == nullptr ||
      (plan.n_slots > 0 && workspace == nullptr) ||
      (kv.dtype == KvDtype::kI8 && (kv.k_rows == nullptr || kv.v_rows == nullptr))) {
    return cudaErrorInvalidValue;
  }
  unsigned char* dev = static_cast<unsigned char*>(device_plan);
  size_t off = 0;
  auto upload = [&](const void* src, size_t bytes) {
    unsigned char* dst = dev + off;
    if (bytes > 0) cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream);
    off += align8(bytes);
    return dst;
  };
  const BifUnit* units = reinterpret_cast<const BifUnit*>(upload(plan.units.data(), plan.units.size() * sizeof(BifUnit)));
  const int32_t* rows = reinterpret_cast<const int32_t*>(upload(plan.rows.data(), plan.rows.size() * 4));
  const int32_t* slot_begin = reinterpret_cast<const int32_t*>(upload(plan.slot_begin.data(), plan.slot_begin.size() * 4));
  const int32_t* slot_ids = reinterpret_cast<const int32_t*>(upload(plan.slot_ids.data(), plan.slot_ids.size() * 4));
  UnitParams up{};
  up.kv = make_kv_dev(kv);
  up.units = units;
  up.rows = rows;
  up.q = q;
  up.part_acc = workspace;
  up.part_ml = workspace + static_cast<size_t>(plan.n_slots) * kv.head_dim;
  up.scale = scale;
  cudaError_t err = cudaSuccess;
  if (!plan.units.empty()) {
    switch (kv.dtype) {
      case KvDtype::kF32: err = launch_units<float>(up, static_cast<int>(plan.units.size()), stream); break;
      case KvDtype::kF16: err = launch_units<__half>(up, static_cast<int>(plan.units.size()), stream); break;
      case KvDtype::kI8: err = launch_units<uint8_t>(up, static_cast<int>(plan.units.size()), stream); break;
    }
  }
  if (err != cudaSuccess) return err;
  MergeParams mp{};
  mp.part_acc = up.part_acc;
  mp.part_ml = up.part_ml;
  mp.out = out;
  mp.slot_begin = slot_begin;
  mp.slot_ids = slot_ids;
  mp.head_dim = kv.head_dim;
  mp.kv = up.kv;
  mp.group = 1;
  mp.sinks = sinks;
  mp.n_heads = plan.n_heads;
  FATHOM_LAUNCH(merge_kernel<0>, dim3(static_cast<unsigned>(plan.n_seqs * plan.n_heads)), dim3(kThreads), 0, stream,
                mp);
  return cudaGetLastError();
}

}  // namespace fathom::cuda
