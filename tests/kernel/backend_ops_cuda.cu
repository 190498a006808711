// The op-test grid's CUDA runner (tests/kernel/backend_ops.h): the same source compiled by the host
// compiler against kernels/cuda/emu (test_backend_ops) and by nvcc against the CUDA runtime
// (test_backend_ops_cuda). Host code only: it uploads, calls the launchers and downloads.
#include "tests/kernel/backend_ops.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/activation.h"
#include "kernels/cuda/bifurcated_attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/hip_attention.h"
#include "kernels/cuda/kv_append.h"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/quant_gemv.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/sparq_attention.h"
#include "kernels/cuda/swa_attention.h"
#include "kernels/cuda/swa_mass.h"

namespace fathom::grid {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// A launch, then the device's own report of it (a real device reports kernel faults on sync).
void launched(cudaError_t e, const char* what) {
  check(e, what);
  check(cudaDeviceSynchronize(), what);
}

template <typename T>
struct Dev {
  T* ptr = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) {
    check(cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<size_t>(1, n) * sizeof(T)), "cudaMalloc");
  }
  explicit Dev(const std::vector<T>& host) : Dev(host.size()) {
    if (n > 0) check(cudaMemcpy(ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  Dev(const T* host, size_t count) : Dev(count) {
    if (n > 0) check(cudaMemcpy(ptr, host, n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  ~Dev() { cudaFree(ptr); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  std::vector<T> get() const {
    std::vector<T> host(n);
    if (n > 0) check(cudaMemcpy(host.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return host;
  }
};

// The fixture's planes on the device.
struct DevKv {
  Dev<uint8_t> k, v, k_t;
  Dev<KvInt8Row> k_rows, v_rows;
  Dev<float> v_sum, k_moments;
  Dev<int32_t> table;
  explicit DevKv(const testing::PagedKvFixture& f)
      : k(f.k), v(f.v), k_t(f.k_t), k_rows(f.k_rows), v_rows(f.v_rows), v_sum(f.v_sum), k_moments(f.k_moments),
        table(f.table) {}
  PagedKvView view(const testing::PagedKvFixture& f, KvPlanes p) const {
    PagedKvView kv = f.view(p.k_t, p.v_sum);
    kv.k = k.ptr;
    kv.v = v.ptr;
    kv.k_t = p.k_t ? k_t.ptr : nullptr;
    kv.v_sum = p.v_sum ? v_sum.ptr : nullptr;
    kv.k_moments = k_moments.ptr;
    kv.block_table = table.ptr;
    if (f.dtype == KvDtype::kI8) {
      kv.k_rows = k_rows.ptr;
      kv.v_rows = v_rows.ptr;
    }
    return kv;
  }
};

Bytes bytes_of(const cuda::AttnBytes& b) { return {b.kv_read, b.other_read, b.written}; }

void reset_counters() {
#ifdef FATHOM_CUDA_EMULATION
  cuda::attn_common::reset_byte_counters();
#endif
}

void counted(LaunchBytes* b) {
#ifdef FATHOM_CUDA_EMULATION
  b->counted = bytes_of(cuda::attn_common::counted_bytes());
  b->has_counted = true;
#else
  (void)b;
#endif
}

}  // namespace

CudaDevice cuda_device() {
  CudaDevice d;
#ifdef FATHOM_CUDA_EMULATION
  d.name = "cuda_emu";
  d.emulated = true;
  d.present = true;
  d.detail = "kernels/cuda/emu on the host";
#else
  d.name = "cuda";
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    d.detail = e != cudaSuccess ? std::string("no CUDA device: ") + cudaGetErrorString(e) : "no CUDA device";
    return d;
  }
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  d.present = true;
  d.detail = std::string(prop.name) + ", sm_" + std::to_string(prop.major) + std::to_string(prop.minor);
#endif
  return d;
}

std::vector<float> cuda_dense(const testing::PagedKvFixture& f, KvPlanes planes, const AttentionArgs& a,
                              int32_t keys_per_split, LaunchBytes* bytes) {
  const size_t n = static_cast<size_t>(a.n_q) * a.n_heads * f.d;
  DevKv dkv(f);
  const PagedKvView kv = dkv.view(f, planes);
  Dev<float> q(a.q, n), out(n), sinks(a.sinks, a.sinks != nullptr ? a.n_heads : 0);
  AttentionArgs d = a;
  d.q = q.ptr;
  d.out = out.ptr;
  d.sinks = a.sinks != nullptr ? sinks.ptr : nullptr;
  const cuda::DecodeAttentionPlan plan = cuda::plan_paged_decode_attention(kv, d, keys_per_split);
  Dev<float> workspace(plan.workspace_floats);
  reset_counters();
  launched(cuda::paged_decode_attention(kv, d, plan, plan.workspace_floats ? workspace.ptr : nullptr, nullptr),
           "paged_decode_attention");
  counted(bytes);
  bytes->formula = bytes_of(cuda::paged_decode_attention_bytes(kv, d, plan));
  return out.get();
}

CudaSparqResult cuda_sparq(const testing::PagedKvFixture& f, KvPlanes planes, const DecodeArgs& a, const SparqLaunch& c) {
  const size_t n = static_cast<size_t>(a.n_heads) * f.d;
  DevKv dkv(f);
  const PagedKvView kv = dkv.view(f, planes);
  Dev<float> q(a.q, n), out(n);
  DecodeArgs d = a;
  d.q = q.ptr;
  d.out = out.ptr;
  const cuda::SparqPlan plan = cuda::plan_sparq_decode_attention(
      kv, d, cuda::SparqConfig{c.k, c.l, c.r, c.reallocation, c.key_spread}, c.score_keys_per_split,
      c.attend_keys_per_split);
  Dev<int32_t> workspace(plan.workspace_words);
  CudaSparqResult r;
  reset_counters();
  launched(cuda::sparq_decode_attention(kv, d, plan, workspace.ptr, nullptr), "sparq_decode_attention");
  counted(&r.bytes);
  r.bytes.formula = bytes_of(cuda::sparq_decode_attention_bytes(kv, d, plan));
  r.out = out.get();
  r.k = plan.k;
  r.l = plan.l;
  r.r = plan.r;
  const std::vector<int32_t> words = workspace.get();
  for (int32_t g = 0; g < f.n_kv_heads; ++g) {
    r.i1.emplace_back(words.begin() + plan.i1 + g * plan.r, words.begin() + plan.i1 + (g + 1) * plan.r);
    r.i2.emplace_back(words.begin() + plan.i2 + g * plan.k, words.begin() + plan.i2 + (g + 1) * plan.k);
  }
  r.alpha.resize(a.n_heads);
  std::memcpy(r.alpha.data(), &words[plan.alpha], a.n_heads * sizeof(float));
  return r;
}

CudaHipResult cuda_hip(const testing::PagedKvFixture& f, KvPlanes planes, const DecodeArgs& est, const DecodeArgs& a,
                   const ref::HipParams& p, int32_t keys_per_split) {
  const size_t n = static_cast<size_t>(a.n_heads) * f.d;
  DevKv dkv(f);
  const PagedKvView kv = dkv.view(f, planes);
  Dev<float> q_est(est.q, n), q(a.q, n), out(n);
  const cuda::HipConfig hc{p.mask_k, p.block_size_k, p.sink, p.window, p.per_kv_head};
  const DecodeArgs dest{q_est.ptr, nullptr, est.n_heads, est.pos, est.scale};
  const cuda::HipMaskInfo info = cuda::plan_hip_mask(kv, dest, hc);
  Dev<int32_t> starts(static_cast<size_t>(a.n_heads) * std::max(1, info.n_keep));
  CudaHipResult r;
  r.dense = info.dense;
  reset_counters();
  launched(cuda::hip_estimate_mask(kv, dest, hc, info, starts.ptr, nullptr), "hip_estimate_mask");
  counted(&r.estimate);
  r.estimate.formula = bytes_of(cuda::hip_estimate_mask_bytes_bound(kv, dest, hc, info));
  if (!info.dense) {
    const std::vector<int32_t> host = starts.get();
    for (int32_t h = 0; h < a.n_heads; ++h)
      r.block_starts.emplace_back(host.begin() + h * info.n_keep, host.begin() + (h + 1) * info.n_keep);
  }
  const DecodeArgs d{q.ptr, out.ptr, a.n_heads, a.pos, a.scale};
  const cuda::HipAttentionPlan plan = cuda::plan_hip_sparse_attention(kv, d, hc, info, keys_per_split);
  Dev<float> workspace(plan.workspace_floats);
  reset_counters();
  launched(cuda::hip_sparse_attention(kv, d, hc, info, starts.ptr, plan, workspace.ptr, nullptr),
           "hip_sparse_attention");
  counted(&r.attend);
  r.attend.formula = bytes_of(cuda::hip_sparse_attention_bytes(kv, d, hc, info, plan));
  r.out = out.get();
  return r;
}

CudaSwaResult cuda_swa(const testing::PagedKvFixture& f, KvPlanes planes, const DecodeArgs& a,
                   const std::vector<int32_t>& kept, int32_t keys_per_split) {
  const size_t n = static_cast<size_t>(a.n_heads) * f.d;
  DevKv dkv(f);
  const PagedKvView kv = dkv.view(f, planes);
  Dev<float> q(a.q, n), out(n), weights(kept.size());
  Dev<int32_t> dkept(kept);
  const DecodeArgs d{q.ptr, out.ptr, a.n_heads, a.pos, a.scale};
  const cuda::SwaPlan plan = cuda::plan_swa_attention(kv, d, static_cast<int32_t>(kept.size()), keys_per_split);
  Dev<float> workspace(plan.workspace_floats);
  CudaSwaResult r;
  reset_counters();
  launched(cuda::swa_attention(kv, d, dkept.ptr, plan, weights.ptr, workspace.ptr, nullptr), "swa_attention");
  counted(&r.bytes);
  r.bytes.formula = bytes_of(cuda::swa_attention_bytes(kv, d, plan));
  r.out = out.get();
  r.weights = weights.get();
  return r;
}

std::vector<int32_t> cuda_swa_select(const std::vector<float>& mass, int32_t radius, int32_t k_local, int32_t k_global) {
  const int32_t n = static_cast<int32_t>(mass.size());
  Dev<float> dmass(mass), ws(cuda::swa_select_workspace_floats(n));
  Dev<int32_t> kept(static_cast<size_t>(k_local + k_global));
  launched(cuda::swa_select(dmass.ptr, n, radius, k_local, k_global, ws.ptr, kept.ptr, nullptr), "swa_select");
  return kept.get();
}

std::vector<float> cuda_swa_fold(const std::vector<float>& mass, float keep, const std::vector<int32_t>& kept,
                                 const std::vector<float>& weights) {
  Dev<float> dmass(mass), dweights(weights);
  Dev<int32_t> dkept(kept);
  launched(cuda::swa_fold(dmass.ptr, static_cast<int32_t>(mass.size()), keep, dkept.ptr, dweights.ptr,
                          static_cast<int32_t>(weights.size()), nullptr),
           "swa_fold");
  return dmass.get();
}

std::vector<float> cuda_bifurcated(const testing::PagedKvFixture& pool, const std::vector<std::vector<int32_t>>& tables,
                                   const std::vector<BifSegment>& segments, const std::vector<int32_t>& pos,
                                   const std::vector<float>& q, int32_t n_heads, LogitScale scale,
                                   const std::vector<float>& sinks, int32_t keys_per_split, LaunchBytes* bytes) {
  const int32_t n_seqs = static_cast<int32_t>(tables.size());
  DevKv dkv(pool);
  const PagedKvView kv = dkv.view(pool, {false, false});
  std::vector<std::unique_ptr<Dev<int32_t>>> dtables;
  std::vector<cuda::BifSequence> seqs;
  for (int32_t i = 0; i < n_seqs; ++i) {
    dtables.push_back(std::make_unique<Dev<int32_t>>(tables[i]));
    seqs.push_back({dtables.back()->ptr, pos[i]});
  }
  std::vector<cuda::BifSegment> segs;
  for (const BifSegment& s : segments) segs.push_back({dtables[s.members[0]]->ptr, s.begin, s.end, s.members});
  Dev<float> dq(q), dout(q.size()), dsinks(sinks);
  const cuda::BifurcatedPlan plan = cuda::plan_bifurcated_attention(segs, seqs, n_heads, kv, keys_per_split);
  Dev<uint8_t> dplan(plan.device_bytes);
  Dev<float> workspace(plan.workspace_floats);
  reset_counters();
  launched(cuda::bifurcated_attention(plan, kv, dq.ptr, dout.ptr, dplan.ptr, workspace.ptr, scale,
                                      sinks.empty() ? nullptr : dsinks.ptr, nullptr),
           "bifurcated_attention");
  counted(bytes);
  bytes->formula = bytes_of(cuda::bifurcated_attention_bytes(plan, kv, !sinks.empty()));
  return dout.get();
}

std::vector<float> cuda_rms_norm(const std::vector<float>& x, const std::vector<float>& w, int64_t rows, int64_t n,
                                 float eps, bool in_place) {
  Dev<float> dx(x), dw(w), dy(in_place ? 0 : x.size());
  launched(cuda::rms_norm(dx.ptr, dw.ptr, in_place ? dx.ptr : dy.ptr, rows, n, eps, nullptr), "rms_norm");
  return in_place ? dx.get() : dy.get();
}

std::vector<float> cuda_glu(GluKind kind, const std::vector<float>& gate, const std::vector<float>& up, int64_t offset,
                            int64_t n, bool in_place) {
  const cuda::GluKind k = kind == GluKind::kSwiGlu      ? cuda::GluKind::kSwiGlu
                          : kind == GluKind::kGeGluTanh ? cuda::GluKind::kGeGluTanh
                                                        : cuda::GluKind::kSwiGluOai;
  Dev<float> dg(gate), du(up), dout(in_place ? 0 : gate.size());
  float* out = in_place ? dg.ptr : dout.ptr;
  launched(cuda::glu(k, dg.ptr + offset, du.ptr + offset, out + offset, n, nullptr), "glu");
  return in_place ? dg.get() : dout.get();
}

std::vector<float> cuda_rope(const std::vector<float>& x, const std::vector<int32_t>& pos, int64_t token_stride,
                             int32_t n_heads, int32_t head_dim, int32_t rope_dim, bool neox, const std::vector<float>& cos,
                             const std::vector<float>& sin) {
  Dev<float> dx(x), dc(cos), ds(sin);
  Dev<int32_t> dp(pos);
  launched(cuda::rope(dx.ptr, dp.ptr, static_cast<int64_t>(pos.size()), token_stride, n_heads, head_dim, rope_dim, neox,
                      dc.ptr, ds.ptr, nullptr),
           "rope");
  return dx.get();
}

std::vector<float> cuda_embedding(const std::vector<uint8_t>& table, GgmlType type, int64_t n_rows, int64_t dim,
                                  const std::vector<int32_t>& ids, float scale) {
  Dev<uint8_t> dt(table);
  Dev<int32_t> di(ids);
  Dev<float> dout(ids.size() * dim);
  launched(cuda::embedding_lookup(dt.ptr, type, n_rows, dim, di.ptr, static_cast<int64_t>(ids.size()), scale, dout.ptr,
                                  nullptr),
           "embedding_lookup");
  return dout.get();
}

std::vector<uint16_t> cuda_embedding_f16(const std::vector<uint8_t>& table, GgmlType type, int64_t n_rows, int64_t dim,
                                         const std::vector<int32_t>& ids, float scale) {
  Dev<uint8_t> dt(table);
  Dev<int32_t> di(ids);
  Dev<uint16_t> dout(ids.size() * dim);
  launched(cuda::embedding_lookup_f16(dt.ptr, type, n_rows, dim, di.ptr, static_cast<int64_t>(ids.size()), scale,
                                      reinterpret_cast<__half*>(dout.ptr), nullptr),
           "embedding_lookup_f16");
  return dout.get();
}

std::vector<uint16_t> cuda_to_f16(const std::vector<float>& x) {
  Dev<float> dx(x);
  Dev<uint16_t> dout(x.size());
  launched(cuda::convert_f32_to_f16(dx.ptr, reinterpret_cast<__half*>(dout.ptr), static_cast<int64_t>(x.size()), nullptr),
           "convert_f32_to_f16");
  return dout.get();
}

std::vector<float> cuda_quant_gemv(GgmlType type, const std::vector<uint8_t>& w, int64_t n_out, int64_t k,
                                   const std::vector<float>& x, int32_t n_x) {
  Dev<uint8_t> dw(w);
  Dev<float> dx(x), dy(static_cast<size_t>(n_x) * n_out);
  launched(cuda::quant_gemv(type, dw.ptr, n_out, k, dx.ptr, n_x, dy.ptr, nullptr), "quant_gemv");
  return dy.get();
}

std::vector<float> cuda_gemm(bool bf16, bool tiled, const std::vector<uint16_t>& a, int64_t lda,
                             const std::vector<uint16_t>& b, int64_t ldb, const std::vector<float>& c, int64_t ldc,
                             int32_t m, int32_t n, int32_t k) {
  static_assert(sizeof(__half) == 2 && sizeof(__nv_bfloat16) == 2, "16-bit storage types");
  Dev<uint16_t> da(a), db(b);
  Dev<float> dc(c);
  cuda::GemmHandle* handle = nullptr;
  check(cuda::gemm_create(&handle), "gemm_create");
  cudaError_t e;
  if (!bf16) {
    const auto* pa = reinterpret_cast<const __half*>(da.ptr);
    const auto* pb = reinterpret_cast<const __half*>(db.ptr);
    e = tiled ? cuda::gemm_f16_tiled(pa, lda, pb, ldb, dc.ptr, ldc, m, n, k, nullptr)
              : cuda::gemm_f16(handle, pa, lda, pb, ldb, dc.ptr, ldc, m, n, k, nullptr);
  } else {
    const auto* pa = reinterpret_cast<const __nv_bfloat16*>(da.ptr);
    const auto* pb = reinterpret_cast<const __nv_bfloat16*>(db.ptr);
    e = tiled ? cuda::gemm_bf16_tiled(pa, lda, pb, ldb, dc.ptr, ldc, m, n, k, nullptr)
              : cuda::gemm_bf16(handle, pa, lda, pb, ldb, dc.ptr, ldc, m, n, k, nullptr);
  }
  const cudaError_t synced = cudaDeviceSynchronize();
  cuda::gemm_destroy(handle);
  check(e, "gemm");
  check(synced, "gemm");
  return dc.get();
}

std::vector<int32_t> cuda_sample(const std::vector<float>& logits, int64_t row_stride, int32_t vocab,
                                 const std::vector<SampleParams>& params) {
  std::vector<cuda::SampleParams> p;
  for (const SampleParams& x : params) p.push_back({x.temperature, x.top_k, x.top_p, 0, x.uniform});
  Dev<float> dl(logits);
  Dev<cuda::SampleParams> dp(p);
  Dev<int32_t> dout(params.size());
  launched(cuda::sample_top_k_top_p(dl.ptr, row_stride, vocab, static_cast<int32_t>(params.size()), dp.ptr, dout.ptr,
                                    nullptr),
           "sample_top_k_top_p");
  return dout.get();
}

KvAppendResult cuda_kv_append(const KvLayer& layer, const KvBatch& batch, int32_t rollback_block) {
  const bool i8 = layer.dtype == KvStore::kI8;
  Dev<uint8_t> dk(layer.k), dv(layer.v), dkt(layer.k_t);
  Dev<KvInt8Row> dkr(layer.k_rows), dvr(layer.v_rows);
  Dev<float> dsum(layer.v_sum), dmoments(layer.k_moments), dkv(batch.kv);
  Dev<int32_t> dpos(batch.positions), dstart(batch.seq_token_start), dtab(batch.block_tables), drow(batch.running_row);
  const size_t per_row = static_cast<size_t>(layer.n_kv_heads) * 3 * layer.head_dim;
  Dev<float> djournal(std::vector<float>(batch.journal_rows * per_row, -1.0f));
  cuda::KvCacheLayer c;
  c.k = dk.ptr;
  c.v = dv.ptr;
  c.k_t = dkt.ptr;
  c.k_rows = i8 ? dkr.ptr : nullptr;
  c.v_rows = i8 ? dvr.ptr : nullptr;
  c.v_sum = dsum.ptr;
  c.k_moments = dmoments.ptr;
  c.dtype = layer.dtype == KvStore::kF32    ? cuda::KvStoreType::kF32
            : layer.dtype == KvStore::kF16  ? cuda::KvStoreType::kF16
            : layer.dtype == KvStore::kBF16 ? cuda::KvStoreType::kBF16
                                            : cuda::KvStoreType::kI8;
  c.block_size = layer.block_size;
  c.n_kv_heads = layer.n_kv_heads;
  c.head_dim = layer.head_dim;
  cuda::KvAppendBatch b;
  b.k = dkv.ptr;
  b.v = dkv.ptr + batch.v_offset;
  b.k_token_stride = b.v_token_stride = batch.token_stride;
  b.positions = dpos.ptr;
  b.seq_token_start = dstart.ptr;
  b.block_tables = dtab.ptr;
  b.table_stride = batch.table_stride;
  b.n_tokens = static_cast<int32_t>(batch.positions.size());
  b.n_seqs = static_cast<int32_t>(batch.seq_token_start.size()) - 1;
  b.running = djournal.ptr;
  b.running_row = drow.ptr;
  launched(cuda::kv_append(c, b, nullptr), "kv_append");
  KvAppendResult r;
  r.after = layer;
  r.after.k = dk.get();
  r.after.v = dv.get();
  r.after.k_t = dkt.get();
  r.after.k_rows = dkr.get();
  r.after.v_rows = dvr.get();
  r.after.v_sum = dsum.get();
  r.after.k_moments = dmoments.get();
  r.journal = djournal.get();
  if (batch.journal_rows > 0) {
    launched(cuda::kv_set_running(c, rollback_block, djournal.ptr, nullptr), "kv_set_running");
    r.v_sum_rolled = dsum.get();
    r.k_moments_rolled = dmoments.get();
    Dev<float> dgot(per_row);
    launched(cuda::kv_get_running(c, rollback_block, dgot.ptr, nullptr), "kv_get_running");
    r.running_read = dgot.get();
  }
  return r;
}

}  // namespace fathom::grid
