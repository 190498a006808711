// The op-test grid: one table of op cases (op, shape, parameters, tolerance), built once, each case
// run on every backend present and compared with the reference, in the manner of llama.cpp's
// test-backend-ops. One gtest test per (op, shape, backend):
//   Grid/BackendOps.MatchesReference/<op>_<shape>_<backend>
// so `--gtest_filter='*sparq*cuda_emu*'` runs one op on one backend.
//
// Backends (chosen at run time; BackendOpsGrid.Backends prints which ran and why others did not):
//   reference        kernels/ref (double-precision scalar), or a plain formula written here where
//                    kernels/ref has none: the ground truth every other backend is compared with
//   cpu_portable, cpu_avx2, cpu_avx512
//                    kernels/cpu at each SIMD level this CPU has (cpu::set_simd_level_for_testing
//                    caps the run-time dispatch, as FATHOM_SIMD does for the server)
//   cpu_avx512_rows, cpu_amx
//                    bifurcated attention's many-rows kernels (AVX-512 rows GEMM; AMX tiles when
//                    the CPU and OS offer them)
//   cuda_emu         kernels/cuda through kernels/cuda/emu (this binary, test_backend_ops)
//   cuda             kernels/cuda on a device: test_backend_ops_cuda, built where nvcc is, runs
//                    the same table there when the CUDA runtime reports a device (skipped without)
// An op runs on the backends that implement it (Case::runs_on says which and why not).
//
// Ops: dense, sparq, hip, swa (decode attention policies; the loosest settings against dense
// attention too), bifurcated, swa_select / swa_fold (SWA's mass on the device), top_k /
// kth_largest_key / sparq_scores (the CPU's sparse building blocks), rms_norm, glu (SwiGLU, GeGLU,
// gpt-oss's), rope (adjacent pairs, NeoX, partial), embedding, matmul (per weight type; the CPU's
// 8-bit activations: matmul_q8), gemm (f16 / bf16), sampling, kv_append. BackendOpsGrid.Backends
// prints the table's size per op and backend.
//
// Tolerances: |backend − reference| ≤ atol + rtol·|reference| per element (matmul, gemm: atol +
// sum·Σ|w·x|), stated per op, dtype and backend family where the table is built (build_table,
// attention_tol, TableBuilder::bifurcated), each with why; where a device may differ from the
// emulator (an FMA the host compiler does not form, cuBLAS's summation order, expf's last ulp) the
// device's own bound is stated beside it. An op's second quantity (SparQ's α, SWA's weights) has
// its own absolute bound (aux). Selections computed in float by a backend
// and in double by the reference may differ on near-ties: a backend must share a stated part of
// the reference's selection (Overlap), and its output is checked against the reference
// recomputed over its own selection, and end to end where the selections agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_partial.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/sparse_attention.h"
#include "kernels/cpu/sparse_common.h"
#include "kernels/ggml_type.h"
#include "kernels/ref/attention.h"
#include "kernels/ref/hip.h"
#include "kernels/ref/sparq.h"
#include "kernels/ref/swa.h"
#include "kernels/ref/bifurcated.h"
#include "kernels/ref/dequant.h"
#include "tests/kernel/backend_ops.h"
#include "tests/kernel/bifurcated_fixture.h"
#include "tests/kernel/paged_kv_fixture.h"
#include "tests/kernel/random_rows.h"

namespace fathom::grid {
namespace {

using testing::normal_vector;
using testing::PagedKvFixture;

// ============================================================================================
// Backends
// ============================================================================================

enum class Family { kCpu, kCuda };

// CPU variants beyond the SIMD level: bifurcated attention's inner kernels for passes of many rows.
enum class CpuKernel { kLevel, kRowsAvx512, kRowsAmx };

struct Backend {
  std::string name;
  Family family = Family::kCpu;
  const char* level = nullptr;  // CPU: the SIMD level the run is capped at
  CpuKernel kernel = CpuKernel::kLevel;
  bool best = false;            // CPU: the widest level here (where the dispatched entry points are checked)
  bool device = false;          // CUDA on a device (not the emulator)
};

struct Backends {
  std::vector<Backend> present;
  std::vector<std::string> absent;  // "name: why"
  CudaDevice cuda;
};

const char* const kLevels[] = {"portable", "avx2", "avx512"};

const Backends& backends() {
  static const Backends all = [] {
    Backends b;
    b.cuda = cuda_device();
    // The CPU levels run beside the emulator (test_backend_ops); the device binary runs the device only.
    if (b.cuda.emulated) {
      const char* best = nullptr;
      for (const char* level : kLevels)
        if (cpu::set_simd_level_for_testing(level) && std::strcmp(cpu::simd_level(), level) == 0) best = level;
      for (const char* level : kLevels) {
        if (cpu::set_simd_level_for_testing(level) && std::strcmp(cpu::simd_level(), level) == 0)
          b.present.push_back({std::string("cpu_") + level, Family::kCpu, level, CpuKernel::kLevel, level == best});
        else
          b.absent.push_back(std::string("cpu_") + level + ": this CPU lacks it");
      }
      if (cpu::partial_attention_rows_avx512() != nullptr)
        b.present.push_back({"cpu_avx512_rows", Family::kCpu, "avx512", CpuKernel::kRowsAvx512});
      else
        b.absent.push_back("cpu_avx512_rows: this CPU lacks AVX-512");
      if (cpu::partial_attention_rows_amx() != nullptr)
        b.present.push_back({"cpu_amx", Family::kCpu, "avx512", CpuKernel::kRowsAmx});
      else
        b.absent.push_back("cpu_amx: the CPU or OS does not offer AMX");
      if (best != nullptr) cpu::set_simd_level_for_testing(best);
    } else {
      b.absent.push_back("cpu_*, cuda_emu: run by test_backend_ops");
    }
    if (b.cuda.present)
      b.present.push_back({b.cuda.name, Family::kCuda, nullptr, CpuKernel::kLevel, false, !b.cuda.emulated});
    else
      b.absent.push_back(b.cuda.name + ": " + b.cuda.detail);
    return b;
  }();
  return all;
}

const char* best_level() {
  for (const Backend& b : backends().present)
    if (b.best) return b.level;
  return "portable";
}

bool is_cpu_level(const Backend& b) { return b.family == Family::kCpu && b.kernel == CpuKernel::kLevel; }

// Pools for the CPU runs (2 threads as the engine's tests; 1 where a result must not depend on it).
ThreadPool& pool() {
  static ThreadPool p(2);
  return p;
}

// ============================================================================================
// Tolerances and cases
// ============================================================================================

// How much of the reference's selection a backend must make too: at most
// max(slack, ⌊(1 − share)·total⌋) of `total` may be missing, per kv / query head or over all heads.
struct Overlap {
  double share = 1.0;
  int64_t slack = 0;
  bool per_head = true;
};

struct Tol {
  double atol = 0, rtol = 0;
  double aux = 0;     // SparQ: |α − α_ref|; SWA: |weight − weight_ref| per query head; sampling: see there
  Overlap overlap{};  // SparQ's I2, HiP's blocks
  double sum = 0;     // matmul, gemm: the bound is atol + sum·Σ|w·x| (the products' magnitudes, not |ref|)
  double q8 = 0;      // matmul with 8-bit activations: + q8·B (B: the activation rounding's bound)
};

struct Case {
  std::string op, shape;
  int32_t id = 0, shape_id = 0;  // shape_id: cases of one shape share their inputs (built once)
  Tol cpu, cuda, amx;            // per backend family (amx: the CPU's AMX rows kernel)
  Tol device;                    // CUDA on a device where it differs from the emulator's (see the op)
  std::function<bool(const Backend&)> runs_on;  // null: every backend
  std::function<void(const Case&, const Backend&, const Tol&)> run;
  const Tol& tol(const Backend& b) const {
    return b.family == Family::kCuda ? (b.device ? device : cuda) : b.kernel == CpuKernel::kRowsAmx ? amx : cpu;
  }
};

// A deterministic generator per case or shape, whatever ran before it (filters, shuffles).
std::mt19937 rng_for(int64_t id, uint32_t salt) {
  std::seed_seq seq{static_cast<uint32_t>(id), static_cast<uint32_t>(id >> 32), salt, 0x67726964u};
  return std::mt19937(seq);
}

// Tests run case after case, backend after backend: one case's reference and one shape's inputs are
// kept while their tests run (recomputed when a filter or shuffle interleaves them).
template <typename T, typename Make>
const T& cached(int slot, int64_t key, Make make) {
  struct Slot {
    int64_t key = -1;
    std::shared_ptr<void> value;
  };
  static Slot slots[2];
  Slot& s = slots[slot];
  if (s.key != key) {
    s.value.reset();
    s.value = std::make_shared<T>(make());
    s.key = key;
  }
  return *static_cast<const T*>(s.value.get());
}
template <typename T, typename Make>
const T& shape_inputs(const Case& c, Make make) {
  return cached<T>(0, c.shape_id, make);
}
template <typename T, typename Make>
const T& reference(const Case& c, Make make) {
  return cached<T>(1, c.id, make);
}

// |got − want| ≤ bound(i) for every i (a non-finite got fails); one failure reported per call, with
// its index. Returns the worst |got − want|. `want`: floats or doubles.
template <typename Want, typename Bound>
double expect_within(const std::vector<float>& got, const std::vector<Want>& want, Bound bound, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  bool reported = false;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    worst = std::isfinite(got[i]) ? std::max(worst, err) : INFINITY;
    if ((!std::isfinite(got[i]) || err > bound(i)) && !reported) {
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << want[i] << " (|err| " << err
                    << ", bound " << bound(i) << ")";
      reported = true;
    }
  }
  return worst;
}

// Elementwise |got − want| ≤ atol + rtol·|want|.
double expect_close(const std::vector<float>& got, const std::vector<float>& want, double atol, double rtol,
                    const std::string& what) {
  return expect_within(got, want, [&](size_t i) { return atol + rtol * std::fabs(static_cast<double>(want[i])); }, what);
}
double expect_close(const std::vector<float>& got, const std::vector<float>& want, const Tol& t, const std::string& what) {
  return expect_close(got, want, t.atol, t.rtol, what);
}

void report(const char* what, double worst, const Tol& t) {
  std::printf("  %s: worst |err| %.3g (atol %.3g, rtol %.3g)\n", what, worst, t.atol, t.rtol);
}

bool overlap_ok(int64_t same, int64_t total, const Overlap& o) {
  const int64_t allowed = std::max<int64_t>(o.slack, static_cast<int64_t>(std::floor((1.0 - o.share) * total)));
  return total - same <= allowed;
}

int64_t shared_count(std::vector<int32_t> a, std::vector<int32_t> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<int32_t> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return static_cast<int64_t>(both.size());
}

// The emulator counts every global load and store of a launch: equal to the launcher's formula.
void expect_counted_bytes(const LaunchBytes& b, const char* what) {
  if (!b.has_counted) return;
  EXPECT_EQ(b.counted.kv_read, b.formula.kv_read) << what << ": KV bytes read";
  EXPECT_EQ(b.counted.other_read, b.formula.other_read) << what << ": other bytes read";
  EXPECT_EQ(b.counted.written, b.formula.written) << what << ": bytes written";
}

// ============================================================================================
// Attention: shapes and inputs
// ============================================================================================

struct AttnShape {
  int32_t d = 64, G = 1, S = 1;
  KvDtype dtype = KvDtype::kF32;
  int32_t bs = 16;
  bool k_t = false, v_sum = false;  // the view's side planes (k_moments always)
  int32_t spare = 2;                // physical blocks not in the table
  bool spread_keys = false;         // keys as Gemma 3's: half the components mean 3, spread 0.01
  int32_t n_kv = 2;
  bool emulated = true;             // run on cuda_emu too (see emulator_affordable)
  int32_t H() const { return G * n_kv; }
  float scale() const { return 1.0f / std::sqrt(static_cast<float>(d)); }
  KvPlanes planes() const { return {k_t, v_sum}; }
  std::string name() const {
    std::string s = "d" + std::to_string(d) + "_g" + std::to_string(G) + "_s" + std::to_string(S) + "_" +
                    kv_dtype_name(dtype) + "_bs" + std::to_string(bs);
    if (k_t) s += "_kt";
    if (v_sum) s += "_vsum";
    if (spread_keys) s += "_spreadkeys";
    if (spare != 2) s += "_spare" + std::to_string(spare);
    return s;
  }
};

struct AttnInputs {
  PagedKvFixture f;
  std::vector<float> q, q2;  // [H][d]: the decode query, and a second one (HiP estimates with it)
  mutable std::vector<float> dense;  // ref::paged_attention of q, computed once for the shape's ops
  PagedKvView view(const AttnShape& s) const { return f.view(s.k_t, s.v_sum); }
};

const AttnInputs& attn_inputs(const Case& c, const AttnShape& s) {
  return shape_inputs<AttnInputs>(c, [&] {
    std::mt19937 rng = rng_for(c.shape_id, 1);
    AttnInputs in;
    in.f = testing::make_paged_kv(s.d, s.n_kv, s.bs, s.dtype, s.S, s.spare, rng);
    in.q = normal_vector(static_cast<size_t>(s.H()) * s.d, rng);
    in.q2 = normal_vector(in.q.size(), rng);
    if (s.spread_keys) {  // the query largest along the low-spread components: the weights decide
      for (size_t i = 0; i < in.f.kf.size(); ++i)
        if (static_cast<int32_t>(i % s.d) < s.d / 2) in.f.kf[i] = 3.0f + 0.01f * in.f.kf[i];
      in.f.store();
      for (size_t i = 0; i < in.q.size(); ++i)
        if (static_cast<int32_t>(i % s.d) < s.d / 2) in.q[i] *= 3.0f;
    }
    return in;
  });
}

DecodeArgs decode_args(const AttnShape& s, const std::vector<float>& q, std::vector<float>& out, int32_t pos = -1) {
  out.assign(static_cast<size_t>(s.H()) * s.d, 0.0f);
  return DecodeArgs{q.data(), out.data(), s.H(), pos < 0 ? s.S - 1 : pos, s.scale()};
}

const std::vector<float>& dense_reference(const AttnShape& s, const AttnInputs& in) {
  if (in.dense.empty()) {
    in.dense.resize(static_cast<size_t>(s.H()) * s.d);
    ref::paged_attention(in.view(s), AttentionArgs{in.q.data(), in.dense.data(), 1, s.H(), s.S - 1, 0, s.scale()});
  }
  return in.dense;
}

int64_t row_bytes(const AttnShape& s) { return kv_row_bytes(s.dtype, s.d); }
int64_t elem_bytes(const AttnShape& s) { return static_cast<int64_t>(kv_dtype_bytes(s.dtype)); }

// ============================================================================================
// dense: cpu::paged_attention, cuda::paged_decode_attention vs ref::paged_attention
// ============================================================================================

struct DenseOp {
  int32_t n_q = 1, window = 0, keys_per_split = 256;
  float softcap = 0.0f;  // > 0: soft-capped logits (Gemma 2)
  bool sinks = false;    // attention sinks (gpt-oss), N(1, 1) per head
  std::string name() const {
    std::string n = "nq" + std::to_string(n_q);
    if (window) n += "_win" + std::to_string(window);
    if (keys_per_split != 256) n += "_split" + std::to_string(keys_per_split);
    if (softcap > 0) n += "_softcap";
    if (sinks) n += "_sinks";
    return n;
  }
};

void run_dense(const Case& c, const AttnShape& s, const DenseOp& p, const Backend& b, const Tol& t) {
  const AttnInputs& in = attn_inputs(c, s);
  std::mt19937 rng = rng_for(c.id, 2);
  const std::vector<float> q = p.n_q == 1 ? in.q : normal_vector(static_cast<size_t>(p.n_q) * s.H() * s.d, rng);
  std::vector<float> sinks(s.H());
  std::normal_distribution<float> sink(1.0f, 1.0f);
  for (float& x : sinks) x = sink(rng);
  AttentionArgs a{q.data(), nullptr, p.n_q, s.H(), s.S - p.n_q, p.window, s.scale(), p.softcap,
                  p.sinks ? sinks.data() : nullptr};
  const bool plain = p.n_q == 1 && p.window == 0 && p.softcap == 0.0f && !p.sinks;
  const std::vector<float>& want = plain ? dense_reference(s, in) : reference<std::vector<float>>(c, [&] {
    std::vector<float> out(q.size());
    AttentionArgs r = a;
    r.out = out.data();
    ref::paged_attention(in.view(s), r);
    return out;
  });
  std::vector<float> got(q.size(), NAN);
  if (b.family == Family::kCpu) {
    a.out = got.data();
    cpu::paged_attention(pool(), in.view(s), a);
  } else {
    LaunchBytes bytes;
    got = cuda_dense(in.f, s.planes(), a, p.keys_per_split, &bytes);
    expect_counted_bytes(bytes, "dense");
  }
  report("output", expect_close(got, want, t, "output"), t);
}

// ============================================================================================
// SparQ: cpu::sparq_decode, cuda::sparq_decode_attention vs ref::sparq_attention
// ============================================================================================

struct SparqOp {
  int32_t k = 128, l = -1, r = -1;
  bool reallocation = true, key_spread = false;
  int32_t score_keys_per_split = 1024, attend_keys_per_split = 64;  // CUDA launch sizes
  std::string name() const {
    std::string n = "k" + std::to_string(k) + "_l" + std::to_string(l) + "_r" + std::to_string(r);
    if (!reallocation) n += "_norealloc";
    if (key_spread) n += "_keyspread";
    if (score_keys_per_split != 1024 || attend_keys_per_split != 64)
      n += "_split" + std::to_string(score_keys_per_split) + "x" + std::to_string(attend_keys_per_split);
    return n;
  }
};

struct SparqRef {
  ref::SparqStats st;
  std::vector<float> out;
  std::vector<float> spread;  // σ [n_kv][d] (with key_spread), else empty
};

// What a backend's SparQ produced.
struct SparqGot {
  std::vector<float> out;
  int32_t k = 0, l = 0, r = 0;
  std::vector<std::vector<int32_t>> i1, i2;
  std::vector<float> alpha;
  bool sorted = false;      // the CPU promises I2 ascending
  int64_t cpu_bytes = -1;   // the CPU's own count
};

void run_sparq(const Case& c, const AttnShape& s, const SparqOp& p, const Backend& b, const Tol& t) {
  const AttnInputs& in = attn_inputs(c, s);
  const PagedKvView kv = in.view(s);
  const int32_t d = s.d, G = s.G, S = s.S, H = s.H();
  const ref::SparqParams params{p.k, p.l, p.r, p.reallocation};
  // v̄ as the kernels take it: the cache's running sum at pos (f32) when the view has it.
  std::vector<float> v_mean;
  if (kv.v_sum != nullptr)
    for (int32_t g = 0; g < s.n_kv; ++g)
      for (int32_t x = 0; x < d; ++x) v_mean.push_back(kv.v_sum[kv.sum_index(S - 1, g) + x] / static_cast<float>(S));
  const SparqRef& R = reference<SparqRef>(c, [&] {
    SparqRef r;
    if (p.key_spread) r.spread = ref::sparq_key_spread_of_moments(kv, S);  // what the CUDA kernel derives
    std::vector<float> out;
    const DecodeArgs a = decode_args(s, in.q, out);
    r.st = ref::sparq_attention(kv, a, params, v_mean.empty() ? nullptr : v_mean.data(),
                                p.key_spread ? r.spread.data() : nullptr);
    r.out = out;
    return r;
  });

  SparqGot got;
  if (b.family == Family::kCpu) {
    std::vector<float> out;
    const DecodeArgs a = decode_args(s, in.q, out);
    cpu::SparqTrace trace;
    const cpu::SparqResult res = cpu::sparq_decode(pool(), kv, a, params, &trace, p.key_spread ? R.spread.data() : nullptr);
    got = {out, res.k, res.l, res.r, trace.dims, trace.selected, trace.alpha, true, res.kv_bytes};
  } else {
    std::vector<float> unused;
    const CudaSparqResult r = cuda_sparq(in.f, s.planes(), decode_args(s, in.q, unused),
                                     {p.k, p.l, p.r, p.reallocation, p.key_spread, p.score_keys_per_split,
                                      p.attend_keys_per_split});
    expect_counted_bytes(r.bytes, "sparq");
    got = {r.out, r.k, r.l, r.r, r.i1, r.i2, r.alpha, false, -1};
  }
  ASSERT_EQ(got.k, R.st.k);
  ASSERT_EQ(got.l, R.st.l);
  ASSERT_EQ(got.r, R.st.r);
  ASSERT_EQ(static_cast<int32_t>(got.i2.size()), s.n_kv);
  const int32_t k = R.st.k, l = R.st.l, r = R.st.r;
  if (got.cpu_bytes >= 0) {  // sparse_attention.h: per kv head S·(r·elem + p) + 2·|I2|·row + v̄'s read
    const int64_t param = s.dtype == KvDtype::kI8 ? static_cast<int64_t>(sizeof(KvInt8Row)) : 0;
    const int64_t vbar = !p.reallocation ? 0 : kv.v_sum != nullptr ? 4LL * d : static_cast<int64_t>(S) * row_bytes(s);
    EXPECT_EQ(got.cpu_bytes, s.n_kv * (S * (r * elem_bytes(s) + param) + 2LL * k * row_bytes(s) + vbar));
  }

  // Per kv head: I1 is the top r of Σ_j |q_j[c]|·w[c] (w = √σ with key_spread, else 1) in rank order;
  // I2 has k distinct positions including the forced window; the reference is recomputed in double
  // over the backend's own I1 / I2 (α and output).
  std::vector<float> own(got.out.size());
  std::vector<double> alpha_own(H);
  std::vector<float> krow(d), vrow(d);
  int64_t same = 0, total = 0;
  int32_t i1_moved = 0;  // kv heads whose I1 the key spread changed
  bool all_same = true;
  for (int32_t g = 0; g < s.n_kv; ++g) {
    SCOPED_TRACE("kv head " + std::to_string(g));
    const std::vector<int32_t>& i1 = got.i1[g];
    std::vector<int32_t> i2 = got.i2[g];
    ASSERT_EQ(static_cast<int32_t>(i1.size()), r);
    ASSERT_EQ(static_cast<int32_t>(i2.size()), k);
    if (got.sorted) {
      EXPECT_TRUE(std::is_sorted(i2.begin(), i2.end())) << "I2 not ascending";
    }
    std::sort(i2.begin(), i2.end());
    EXPECT_TRUE(std::adjacent_find(i2.begin(), i2.end()) == i2.end()) << "duplicates in I2";
    for (int32_t x = S - l; x < S; ++x)
      EXPECT_TRUE(std::binary_search(i2.begin(), i2.end(), x)) << "forced position " << x << " missing";
    auto weight = [&](int32_t x) { return p.key_spread ? std::sqrt(static_cast<double>(R.spread[g * d + x])) : 1.0; };
    const float* qg = in.q.data() + static_cast<size_t>(g) * G * d;
    {
      std::vector<double> a(d, 0.0), a_plain(d, 0.0);
      for (int32_t j = 0; j < G; ++j)
        for (int32_t x = 0; x < d; ++x) {
          a[x] += std::fabs(qg[j * d + x]) * weight(x);
          a_plain[x] += std::fabs(qg[j * d + x]);
        }
      std::vector<int32_t> order(d), plain(d);
      std::iota(order.begin(), order.end(), 0);
      std::iota(plain.begin(), plain.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return a[x] > a[y]; });
      EXPECT_EQ(i1, std::vector<int32_t>(order.begin(), order.begin() + r)) << "I1";
      std::stable_sort(plain.begin(), plain.end(), [&](int32_t x, int32_t y) { return a_plain[x] > a_plain[y]; });
      i1_moved += !std::equal(order.begin(), order.begin() + r, plain.begin());
    }
    // Step 2 over the backend's I1, in double: ŝ [G][S].
    std::vector<double> approx(static_cast<size_t>(G) * S), factor(G);
    for (int32_t j = 0; j < G; ++j) {
      double l1 = 0, l1_r = 0;
      for (int32_t x = 0; x < d; ++x) l1 += std::fabs(qg[j * d + x]) * weight(x);
      for (int32_t x : i1) l1_r += std::fabs(qg[j * d + x]) * weight(x);
      factor[j] = s.scale() * (l1_r > 0 ? std::sqrt(l1 / l1_r) : 1.0);
    }
    for (int32_t x = 0; x < S; ++x) {
      ref::load_kv_row(kv, kv.k, x, g, krow.data());
      for (int32_t j = 0; j < G; ++j) {
        double dot = 0;
        for (int32_t e : i1) dot += static_cast<double>(qg[j * d + e]) * krow[e];
        approx[static_cast<size_t>(j) * S + x] = dot * factor[j];
      }
    }
    // Selection: shared with the reference's, and identical where the reference's boundary gap
    // (k-th vs k+1-th non-forced group score) exceeds 1e-4·(1 + max |score|).
    same += shared_count(i2, R.st.selected[g]);
    total += k;
    if (t.overlap.per_head) {
      EXPECT_TRUE(overlap_ok(shared_count(i2, R.st.selected[g]), k, t.overlap))
          << shared_count(i2, R.st.selected[g]) << " of " << k << " positions shared with the reference";
    }
    const int32_t first_forced = S - l, n_rest = k - l;
    if (n_rest > 0 && n_rest < first_forced) {
      std::vector<double> summed(first_forced, 0.0);
      for (int32_t x = 0; x < first_forced; ++x)
        for (int32_t j = 0; j < G; ++j) summed[x] += approx[static_cast<size_t>(j) * S + x];
      double mx = 0;
      for (double v : summed) mx = std::max(mx, std::fabs(v));
      std::sort(summed.begin(), summed.end(), std::greater<>());
      if (summed[n_rest - 1] - summed[n_rest] > 1e-4 * (1 + mx)) {
        EXPECT_EQ(i2, R.st.selected[g]) << "I2 (no near-tie)";
      }
    }
    all_same &= i2 == R.st.selected[g];
    // α and the output over the backend's own selection.
    std::vector<ref::AttentionState> y(G);
    ref::partial_attention(kv, g, qg, G, s.scale(), i2.data(), k, y.data());
    std::vector<double> vbar(d, 0.0);
    if (!v_mean.empty()) {
      for (int32_t x = 0; x < d; ++x) vbar[x] = v_mean[static_cast<size_t>(g) * d + x];
    } else {
      for (int32_t x = 0; x < S; ++x) {
        ref::load_kv_row(kv, kv.v, x, g, vrow.data());
        for (int32_t e = 0; e < d; ++e) vbar[e] += vrow[e];
      }
      for (double& v : vbar) v /= S;
    }
    for (int32_t j = 0; j < G; ++j) {
      const double* sc = &approx[static_cast<size_t>(j) * S];
      const double m = *std::max_element(sc, sc + S);
      double all = 0, chosen = 0;
      for (int32_t x = 0; x < S; ++x) all += std::exp(sc[x] - m);
      for (int32_t x : i2) chosen += std::exp(sc[x] - m);
      const double alpha = chosen / all, a = p.reallocation ? alpha : 1.0;
      alpha_own[g * G + j] = alpha;
      EXPECT_NEAR(got.alpha[g * G + j], alpha, t.aux) << "α of head " << g * G + j << " over its own selection";
      for (int32_t x = 0; x < d; ++x)
        own[static_cast<size_t>(g * G + j) * d + x] = static_cast<float>(a * y[j].o[x] + (1 - a) * vbar[x]);
    }
  }
  if (!t.overlap.per_head) {
    EXPECT_TRUE(overlap_ok(same, total, t.overlap)) << same << " of " << total << " positions shared with the reference";
  }
  // Keys as Gemma 3's make the spread weighting decide: I1 (checked above) is not the unweighted one.
  if (p.key_spread && s.spread_keys) {
    EXPECT_GT(i1_moved, 0) << "the key spread moved no kv head's I1";
  }
  report("output over its own selection", expect_close(got.out, own, t, "output over its own selection"), t);
  if (all_same) {  // end to end against the reference
    report("output", expect_close(got.out, R.out, t, "output"), t);
    for (int32_t h = 0; h < H; ++h) {
      EXPECT_NEAR(got.alpha[h], R.st.alpha[h], t.aux) << "α of head " << h;
    }
    if (got.cpu_bytes >= 0 && s.dtype != KvDtype::kI8) {
      EXPECT_EQ(got.cpu_bytes, R.st.kv_bytes);
    }
  }
  std::printf("  I2: %lld of %lld positions shared with the reference\n", static_cast<long long>(same),
              static_cast<long long>(total));
  if (p.k >= S) {  // every position, α = 1 (the CPU's exactly), dense attention
    for (int32_t h = 0; h < H; ++h) {
      if (b.family == Family::kCpu) {
        EXPECT_EQ(got.alpha[h], 1.0f) << "head " << h;
      } else {
        EXPECT_NEAR(got.alpha[h], 1.0, t.aux) << "head " << h;
      }
    }
    report("output vs dense", expect_close(got.out, dense_reference(s, in), t, "output vs dense attention"), t);
  }
}

// ============================================================================================
// HiP: cpu::hip_estimate_mask + hip_sparse_decode, cuda::hip_estimate_mask + hip_sparse_attention
// vs ref::hip_estimate_mask + ref::hip_sparse_attention
// ============================================================================================

struct HipOp {
  ref::HipParams p;
  int32_t reuse = 0;  // the mask is estimated `reuse` steps before the attention (a cached mask)
  int32_t keys_per_split = 256;  // CUDA launch size
  std::string name() const {
    std::string n = "mk" + std::to_string(p.mask_k) + "_bk" + std::to_string(p.block_size_k) + "_sink" +
                    std::to_string(p.sink) + "_win" + std::to_string(p.window) + "_reuse" + std::to_string(reuse);
    if (p.per_kv_head) n += "_perkv";
    if (keys_per_split != 256) n += "_split" + std::to_string(keys_per_split);
    return n;
  }
};

struct HipRef {
  ref::HipMask mask;
  ref::HipBytes est_bytes;
};

void run_hip(const Case& c, const AttnShape& s, const HipOp& p, const Backend& b, const Tol& t) {
  const AttnInputs& in = attn_inputs(c, s);
  const PagedKvView kv = in.view(s);
  const int32_t d = s.d, H = s.H(), pos = s.S - 1, est_pos = std::max(0, pos - p.reuse);
  std::vector<float> unused;
  const DecodeArgs est = decode_args(s, in.q2, unused, est_pos);
  const HipRef& R = reference<HipRef>(c, [&] {
    HipRef r;
    r.mask = ref::hip_estimate_mask(kv, est, p.p, &r.est_bytes);
    return r;
  });
  std::vector<float> out;
  const DecodeArgs a = decode_args(s, in.q, out);
  ref::HipMask mask;
  ref::HipBytes est_bytes, att_bytes;
  if (b.family == Family::kCpu) {
    cpu::hip_estimate_mask(pool(), kv, est, p.p, &mask, &est_bytes);
    cpu::hip_sparse_decode(pool(), kv, a, p.p, mask, &att_bytes);
    EXPECT_EQ(mask.pos, R.mask.pos);
  } else {
    const CudaHipResult r = cuda_hip(in.f, s.planes(), est, a, p.p, p.keys_per_split);
    mask.dense = r.dense;
    mask.pos = est_pos;
    mask.block_starts = r.dense ? R.mask.block_starts : r.block_starts;
    out = r.out;
    // The estimation's formula is an upper bound; the attention's is exact unless a selected block
    // reaches into the window (then fewer than block_size_k rows per head).
    if (r.estimate.has_counted) {
      EXPECT_LE(r.estimate.counted.kv_read, r.estimate.formula.kv_read);
      EXPECT_LE(r.estimate.counted.other_read, r.estimate.formula.other_read);
      EXPECT_EQ(r.estimate.counted.written, r.estimate.formula.written);
      const int64_t slack = static_cast<int64_t>(H) * (p.p.block_size_k - 1);
      EXPECT_LE(r.attend.counted.kv_read, r.attend.formula.kv_read);
      EXPECT_GE(r.attend.counted.kv_read, r.attend.formula.kv_read - slack * 2 * row_bytes(s));
      EXPECT_LE(r.attend.counted.other_read, r.attend.formula.other_read);
      EXPECT_GE(r.attend.counted.other_read, r.attend.formula.other_read - slack * 4);
      EXPECT_EQ(r.attend.counted.written, r.attend.formula.written);
    }
  }
  ASSERT_EQ(mask.dense, R.mask.dense);
  int64_t same = 0, total = 0;
  bool all_same = true;
  if (!mask.dense) {
    ASSERT_EQ(static_cast<int32_t>(mask.block_starts.size()), H);
    for (int32_t h = 0; h < H; ++h) {
      const std::vector<int32_t>& bc = mask.block_starts[h];
      const std::vector<int32_t>& br = R.mask.block_starts[h];
      ASSERT_EQ(bc.size(), br.size()) << "head " << h;
      EXPECT_TRUE(std::is_sorted(bc.begin(), bc.end())) << "head " << h;
      if (p.p.per_kv_head && h % s.G != 0) {
        EXPECT_EQ(bc, mask.block_starts[h - h % s.G]) << "head " << h;
      }
      const int64_t n = shared_count(bc, br);
      if (t.overlap.per_head) {
        EXPECT_TRUE(overlap_ok(n, static_cast<int64_t>(br.size()), t.overlap))
            << "head " << h << ": " << n << " of " << br.size() << " blocks shared with the reference";
      }
      same += n;
      total += static_cast<int64_t>(br.size());
      all_same &= bc == br;
    }
    if (!t.overlap.per_head) {
      EXPECT_TRUE(overlap_ok(same, total, t.overlap)) << same << " of " << total << " blocks shared with the reference";
    }
    std::printf("  mask: %lld of %lld blocks shared with the reference\n", static_cast<long long>(same),
                static_cast<long long>(total));
  }
  // Bytes (CPU): each row at kv_row_bytes, the reference's count of rows.
  const auto rows_of = [&](int64_t ref_bytes) { return ref_bytes / (d * elem_bytes(s)) * row_bytes(s); };
  if (b.family == Family::kCpu && all_same) {
    EXPECT_EQ(est_bytes.k_bytes, rows_of(R.est_bytes.k_bytes));
  }
  // The output vs the reference's attention over the backend's own mask.
  std::vector<float> want(out.size());
  DecodeArgs ar = a;
  ar.out = want.data();
  ref::HipBytes ref_att;
  ref::hip_sparse_attention(kv, ar, p.p, mask, &ref_att);
  if (b.family == Family::kCpu) {
    EXPECT_EQ(att_bytes.k_bytes, rows_of(ref_att.k_bytes));
    EXPECT_EQ(att_bytes.v_bytes, rows_of(ref_att.v_bytes));
  }
  report("output over its own mask", expect_close(out, want, t, "output over its own mask"), t);
  if (p.p.mask_k >= s.S) {  // a dense mask, dense attention
    EXPECT_TRUE(mask.dense);
    report("output vs dense", expect_close(out, dense_reference(s, in), t, "output vs dense attention"), t);
  }
}

// ============================================================================================
// SWA: cpu::swa_decode (selection + attention), cuda::swa_attention (over the reference's
// selection: on the device it is swa_select's, tested below) vs ref::swa_attention
// ============================================================================================

struct SwaOp {
  float ratio = 0.5f;
  bool coarse_mass = true;  // many exact ties (the lower-position rule); else uniform with one tie
  bool weights = true;      // the CPU returns each kept position's weight (its other path: without)
  int32_t keys_per_split = 64;  // CUDA launch size
  std::string name() const {
    char r[16];
    std::snprintf(r, sizeof r, "%g", ratio);
    std::string n = std::string("ratio") + r + (coarse_mass ? "_coarse" : "_uniform");
    std::replace(n.begin(), n.end(), '.', 'p');
    if (!weights) n += "_noweights";
    if (keys_per_split != 64) n += "_split" + std::to_string(keys_per_split);
    return n;
  }
};

struct SwaRef {
  std::vector<float> mass, out;
  ref::SwaStats st;
  std::vector<double> weights;  // [S]: softmax over the kept positions per head, summed over heads (0 elsewhere)
};

void run_swa(const Case& c, const AttnShape& s, const SwaOp& p, const Backend& b, const Tol& t) {
  const AttnInputs& in = attn_inputs(c, s);
  const PagedKvView kv = in.view(s);
  const int32_t d = s.d, S = s.S, H = s.H();
  const SwaRef& R = reference<SwaRef>(c, [&] {
    SwaRef r;
    std::mt19937 rng = rng_for(c.id, 3);
    r.mass.resize(S);
    std::uniform_int_distribution<int> coarse(0, 20);
    std::uniform_real_distribution<float> uni(0.0f, 1.0f);
    for (float& m : r.mass) m = p.coarse_mass ? 0.05f * static_cast<float>(coarse(rng)) : uni(rng);
    if (!p.coarse_mass) r.mass[S / 3] = r.mass[S / 2];
    std::vector<float> out;
    const DecodeArgs a = decode_args(s, in.q, out);
    r.st = ref::swa_attention(kv, a, ref::SwaParams{p.ratio}, r.mass.data());
    r.out = out;
    r.weights.assign(S, 0.0);
    const size_t n = r.st.kept.size();
    std::vector<float> krow(d);
    std::vector<double> logit(static_cast<size_t>(H) * n);
    for (int32_t g = 0; g < s.n_kv; ++g)
      for (size_t i = 0; i < n; ++i) {
        ref::load_kv_row(kv, kv.k, r.st.kept[i], g, krow.data());
        for (int32_t h = g * s.G; h < (g + 1) * s.G; ++h) {
          double dot = 0;
          for (int32_t e = 0; e < d; ++e) dot += static_cast<double>(in.q[static_cast<size_t>(h) * d + e]) * krow[e];
          logit[h * n + i] = dot * a.scale;
        }
      }
    for (int32_t h = 0; h < H; ++h) {  // softmax over the kept positions, per head
      double* lh = &logit[h * n];
      const double m = *std::max_element(lh, lh + n);
      double sum = 0;
      for (size_t i = 0; i < n; ++i) sum += (lh[i] = std::exp(lh[i] - m));
      for (size_t i = 0; i < n; ++i) r.weights[r.st.kept[i]] += lh[i] / sum;
    }
    return r;
  });
  std::vector<float> out;
  const DecodeArgs a = decode_args(s, in.q, out);
  std::vector<double> weights(S, 0.0);  // scattered over positions
  if (b.family == Family::kCpu) {
    std::vector<float> kept_weights;
    std::vector<int32_t> kept;
    const cpu::SwaResult res =
        cpu::swa_decode(pool(), kv, a, ref::SwaParams{p.ratio}, R.mass.data(), p.weights ? &kept_weights : nullptr, &kept);
    EXPECT_EQ(kept, R.st.kept);
    EXPECT_EQ(res.k_local, R.st.k_local);
    EXPECT_EQ(res.k_global, R.st.k_global);
    EXPECT_EQ(res.k_local + res.k_global, static_cast<int32_t>(kept.size()));
    EXPECT_EQ(res.kv_bytes, 2LL * static_cast<int64_t>(kept.size()) * row_bytes(s) * s.n_kv);
    if (s.dtype != KvDtype::kI8) {
      EXPECT_EQ(res.kv_bytes, R.st.kv_bytes);
    }
    if (p.weights) {
      ASSERT_EQ(kept_weights.size(), kept.size());
      for (size_t i = 0; i < kept.size(); ++i) weights[kept[i]] = kept_weights[i];
    }
  } else {
    const CudaSwaResult r = cuda_swa(in.f, s.planes(), a, R.st.kept, p.keys_per_split);
    expect_counted_bytes(r.bytes, "swa");
    out = r.out;
    for (size_t i = 0; i < R.st.kept.size(); ++i) weights[R.st.kept[i]] = r.weights[i];
  }
  report("output", expect_close(out, R.out, t, "output"), t);
  if (p.weights) {
    double worst = 0;
    for (int32_t x = 0; x < S; ++x) {
      worst = std::max(worst, std::fabs(weights[x] - R.weights[x]));
      EXPECT_NEAR(weights[x], R.weights[x], t.aux * H) << "weight of position " << x;
    }
    std::printf("  weights: worst |err| %.3g (bound %.3g)\n", worst, t.aux * H);
  }
  if (p.ratio >= 1.0f) {  // every position, dense attention
    EXPECT_EQ(R.st.k_local + R.st.k_global, S);
    report("output vs dense", expect_close(out, dense_reference(s, in), t, "output vs dense attention"), t);
  }
}

// ============================================================================================
// SWA's mass: the selection (cpu::max_pool + ref::swa_select; cuda::swa_select) vs a naive max-pool
// + ref::swa_select, and the fold (cuda::swa_fold) vs its two float operations: exact
// ============================================================================================

struct MassShape {
  int32_t n, radius;
  float ratio;
  std::string name() const {
    char r[16];
    std::snprintf(r, sizeof r, "%g", ratio);
    std::string s = "n" + std::to_string(n) + "_radius" + std::to_string(radius) + "_ratio" + r;
    std::replace(s.begin(), s.end(), '.', 'p');
    return s;
  }
};

struct MassRef {
  std::vector<float> mass;  // coarse: many exact ties
  ref::SwaStats want;
};

const MassRef& mass_reference(const Case& c, const MassShape& m) {
  return reference<MassRef>(c, [&] {
    MassRef r;
    std::mt19937 rng = rng_for(c.shape_id, 4);
    std::uniform_int_distribution<int> coarse(0, 12);
    r.mass.resize(m.n);
    for (float& x : r.mass) x = 0.25f * static_cast<float>(coarse(rng));
    const int32_t rad = std::min(m.radius, m.n);
    std::vector<float> pooled(m.n);
    for (int32_t x = 0; x < m.n; ++x) {
      pooled[x] = r.mass[std::max(0, x - rad)];
      for (int32_t i = std::max(0, x - rad); i <= std::min(m.n - 1, x + rad); ++i) pooled[x] = std::max(pooled[x], r.mass[i]);
    }
    r.want = ref::swa_select(m.n, m.ratio, pooled.data());
    return r;
  });
}

void run_swa_select(const Case& c, const MassShape& m, const Backend& b, const Tol&) {
  const MassRef& R = mass_reference(c, m);
  std::vector<int32_t> kept;
  if (b.family == Family::kCpu) {
    std::vector<float> pooled(m.n);
    cpu::max_pool(R.mass.data(), m.n, m.radius, pooled.data());
    kept = ref::swa_select(m.n, m.ratio, pooled.data()).kept;
  } else {
    kept = cuda_swa_select(R.mass, m.radius, R.want.k_local, R.want.k_global);
  }
  EXPECT_EQ(kept, R.want.kept);
}

void run_swa_fold(const Case& c, const MassShape& m, const Backend&, const Tol&) {
  const MassRef& R = mass_reference(c, m);
  std::mt19937 rng = rng_for(c.id, 5);
  std::vector<float> weights(R.want.kept.size());
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  for (float& w : weights) w = uni(rng);
  const float keep = 1.0f - 1.0f / static_cast<float>(R.want.k_local);
  std::vector<float> folded = R.mass;
  for (float& x : folded) x = x * keep;
  for (size_t i = 0; i < R.want.kept.size(); ++i) folded[R.want.kept[i]] = folded[R.want.kept[i]] + weights[i];
  const std::vector<float> got = cuda_swa_fold(R.mass, keep, R.want.kept, weights);
  ASSERT_EQ(got.size(), folded.size());
  EXPECT_EQ(std::memcmp(got.data(), folded.data(), got.size() * sizeof(float)), 0) << "not bitwise the host fold";
}

// ============================================================================================
// The CPU's sparse building blocks (kernels/cpu/sparse_common.h): no CUDA counterpart exposed
// ============================================================================================

// top_k: exactly the reference's ordering (score descending, index ascending), indices ascending.
// Shapes: continuous scores, coarse (ties), all equal, ascending, descending, spikes, and large
// values only where a strided sample looks (its threshold too high: the radix fallback answers).
void run_top_k(const Case& c, int32_t n, int kind, const Backend&, const Tol&) {
  std::mt19937 rng = rng_for(c.id, 6);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> s(n);
  for (int32_t i = 0; i < n; ++i) {
    const float x = normal(rng);
    s[i] = kind == 0 ? x : kind == 1 ? std::round(x * 4) / 4 : kind == 2 ? 1.5f : kind == 3 ? static_cast<float>(i)
           : kind == 4 ? static_cast<float>(-i) : kind == 5 ? (i % 97 == 5 ? 100.0f + x : x)
           : (i % std::max(1, n / 512) == 0 ? 1.0f + x * 0.01f : -1.0f);
  }
  if (n > 3) s[1] = -0.0f, s[2] = 0.0f;
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return s[x] > s[y]; });
  for (int32_t k : {0, 1, n / 16, n / 3, n - 1, n}) {
    std::vector<int32_t> got(std::max(k, 0));
    cpu::sparse::top_k(s.data(), n, k, got.data());
    std::vector<int32_t> want(order.begin(), order.begin() + std::max(k, 0));
    std::sort(want.begin(), want.end());
    ASSERT_EQ(got, want) << "k=" << k;
  }
}

// kth_largest_key: the k-th entry of the keys sorted descending, for every k: keys at the ends of
// the range (0, UINT32_MAX), many duplicates, lengths off the vector width.
void run_kth_largest(const Case& c, int32_t m, int kind, const Backend&, const Tol&) {
  std::mt19937 rng = rng_for(c.id, 7);
  std::vector<uint32_t> keys(m);
  for (uint32_t& x : keys) x = kind == 0 ? static_cast<uint32_t>(rng()) : kind == 1 ? rng() % 4 : 0xFFFFFFFFu - rng() % 3;
  if (m > 2) keys[0] = 0, keys[1] = 0xFFFFFFFFu;
  std::vector<uint32_t> sorted = keys;
  std::sort(sorted.begin(), sorted.end(), std::greater<uint32_t>());
  for (int32_t k = 1; k <= m; ++k)
    ASSERT_EQ(cpu::sparse::kernels().kth_largest_key(keys.data(), m, k), sorted[k - 1]) << "k=" << k;
}

// SparQ step 1's scores over a range of blocks (16-key tiles two at a time where the ISA has a pair
// kernel) equal them block by block, bit for bit, and both equal Σ_i qr[j][i]·K[t][dims[i]]
// (double) within 1e-5·(1 + |dot|), the group sum likewise.
void run_sparq_scores(const Case& c, int32_t bs, KvDtype dtype, int32_t G, int32_t S, const Backend&, const Tol& t) {
  std::mt19937 rng = rng_for(c.id, 8);
  constexpr int32_t d = 64, r = 8, n_kv = 2;
  const PagedKvFixture f = testing::make_paged_kv(d, n_kv, bs, dtype, S, 0, rng);
  const PagedKvView kv = f.view(true, true);
  const std::vector<int32_t> dims = {3, 9, 17, 22, 40, 41, 50, 63};
  const std::vector<float> qr = normal_vector(static_cast<size_t>(G) * r, rng);
  const int32_t n_blocks = (S + bs - 1) / bs;
  const cpu::sparse::Kernels& kern = cpu::sparse::kernels();
  std::vector<float> whole(static_cast<size_t>(G) * S, NAN), parts(whole.size(), NAN), whole_sum(S, NAN), parts_sum(S, NAN);
  kern.sparq_scores(kv, 1, dims.data(), r, qr.data(), G, 0, n_blocks, S, whole.data(), S, whole_sum.data());
  for (int32_t blk = 0; blk < n_blocks; ++blk)
    kern.sparq_scores(kv, 1, dims.data(), r, qr.data(), G, blk, blk + 1, S, parts.data(), S, parts_sum.data());
  ASSERT_EQ(0, std::memcmp(whole.data(), parts.data(), whole.size() * sizeof(float)));
  ASSERT_EQ(0, std::memcmp(whole_sum.data(), parts_sum.data(), whole_sum.size() * sizeof(float)));
  std::vector<float> row(d);
  for (int32_t x = 0; x < S; ++x) {
    ref::load_kv_row(kv, kv.k, x, 1, row.data());
    float total = 0;
    for (int32_t j = 0; j < G; ++j) {
      double dot = 0;
      for (int32_t i = 0; i < r; ++i) dot += static_cast<double>(qr[j * r + i]) * row[dims[i]];
      ASSERT_NEAR(whole[static_cast<size_t>(j) * S + x], dot, t.atol + t.rtol * std::fabs(dot)) << "t=" << x;
      total += whole[static_cast<size_t>(j) * S + x];
    }
    ASSERT_NEAR(whole_sum[x], total, t.atol + t.rtol * std::fabs(total)) << "t=" << x;
  }
}

// ============================================================================================
// Bifurcated attention: cpu::bifurcated_decode_with (each inner kernel; 1 and 2 threads) and
// cpu::bifurcated_decode (the dispatched kernels), cuda::bifurcated_attention vs
// ref::bifurcated_attention, and vs dense attention of each sequence alone through its own view
// (cpu::paged_attention at the widest level: a shared segment must change nothing but the reads)
// ============================================================================================

struct BifShape {
  std::string name;
  int32_t d = 64, G = 1;
  KvDtype dtype = KvDtype::kF32;
  std::vector<testing::SegmentSpec> specs;
  std::vector<int32_t> suffix;  // per sequence: tokens after the segments that cover it
  bool k_t = true;              // the Kᵀ plane as the engine keeps it (without: the row kernels)
  int32_t bs = 16;
  float softcap = 0.0f;         // > 0: soft-capped logits (Gemma 2)
  bool sinks = false;           // attention sinks (gpt-oss), N(1, 1) per head
  int32_t keys_per_split = 256;  // CUDA launch size
  bool emulated = true;         // run on cuda_emu too
};

struct BifRef {
  std::vector<float> out, dense;
  int64_t bytes = 0;
};

const testing::Group& bif_inputs(const Case& c, const BifShape& s) {
  return shape_inputs<testing::Group>(c, [&] {
    std::mt19937 rng = rng_for(c.shape_id, 9);
    testing::Group g = testing::make_group(s.d, s.G, s.dtype, s.specs, s.suffix, rng, s.k_t, s.bs);
    g.softcap = s.softcap;
    std::normal_distribution<float> sink(1.0f, 1.0f);
    if (s.sinks)
      for (int32_t h = 0; h < g.n_heads; ++h) g.sinks.push_back(sink(rng));
    return g;
  });
}

void run_bifurcated(const Case& c, const BifShape& s, const Backend& b, const Tol& t) {
  const testing::Group& g = bif_inputs(c, s);
  const BifRef& R = reference<BifRef>(c, [&] {
    BifRef r;
    std::vector<DecodeArgs> a = g.args(r.out);
    r.bytes = ref::bifurcated_attention(g.segments, g.views.data(), a.data(), g.size());
    std::vector<DecodeArgs> ad = g.args(r.dense);
    const char* level = cpu::simd_level();
    cpu::set_simd_level_for_testing(best_level());
    for (int32_t i = 0; i < g.size(); ++i)
      cpu::paged_attention(pool(), g.views[i], AttentionArgs{ad[i].q, ad[i].out, 1, g.n_heads, g.pos[i], 0, ad[i].scale,
                                                             ad[i].softcap, ad[i].sinks});
    cpu::set_simd_level_for_testing(level);
    return r;
  });
  // The reference counts elements only, without INT8's row parameters.
  if (s.dtype != KvDtype::kI8) {
    EXPECT_EQ(R.bytes, g.expect_bytes) << "the reference's bytes";
  }
  if (b.family == Family::kCpu) {
    static ThreadPool pool1(1);
    const cpu::PartialAttentionFn kernel = std::strcmp(b.level, "portable") == 0 ? cpu::partial_attention_portable()
                                           : std::strcmp(b.level, "avx2") == 0   ? cpu::partial_attention_avx2()
                                                                                 : cpu::partial_attention_avx512();
    const cpu::PartialAttentionFn many_rows = b.kernel == CpuKernel::kRowsAvx512 ? cpu::partial_attention_rows_avx512()
                                              : b.kernel == CpuKernel::kRowsAmx  ? cpu::partial_attention_rows_amx()
                                                                                 : nullptr;
    ASSERT_NE(kernel, nullptr);
    std::vector<float> got1, got2;
    std::vector<DecodeArgs> a1 = g.args(got1), a2 = g.args(got2);
    EXPECT_EQ(cpu::bifurcated_decode_with(kernel, many_rows, pool1, g.segments, g.views.data(), a1.data(), g.size()),
              g.expect_bytes);
    EXPECT_EQ(cpu::bifurcated_decode_with(kernel, many_rows, pool(), g.segments, g.views.data(), a2.data(), g.size()),
              g.expect_bytes);
    EXPECT_EQ(std::memcmp(got1.data(), got2.data(), got1.size() * sizeof(float)), 0) << "1 and 2 threads differ";
    report("output", expect_close(got1, R.out, t, "output"), t);
    report("output vs dense", expect_close(got1, R.dense, t, "output vs dense attention"), t);
    if (b.best) {  // the dispatched kernels (AVX-512: the many-rows ones, AMX where present)
      const Tol& td = cpu::partial_attention_rows_amx() != nullptr ? c.amx : c.cpu;
      std::vector<float> got;
      std::vector<DecodeArgs> a = g.args(got);
      EXPECT_EQ(cpu::bifurcated_decode(pool(), g.segments, g.views.data(), a.data(), g.size()), g.expect_bytes);
      report("dispatched output", expect_close(got, R.out, td, "dispatched kernels' output"), td);
    }
  } else {
    std::vector<BifSegment> segs;
    for (const ref::SharedSegment& x : g.segments) segs.push_back({x.begin, x.end, x.members});
    LaunchBytes bytes;
    const std::vector<float> got = cuda_bifurcated(g.pool, g.tables, segs, g.pos, g.q, g.n_heads,
                                                   LogitScale{1.0f / std::sqrt(static_cast<float>(g.d)), g.softcap},
                                                   g.sinks, s.keys_per_split, &bytes);
    expect_counted_bytes(bytes, "bifurcated");
    report("output", expect_close(got, R.out, t, "output"), t);
    report("output vs dense", expect_close(got, R.dense, t, "output vs dense attention"), t);
  }
}

// ============================================================================================
// Row and element-wise ops against their formulas in double: rms_norm, the gated activations,
// RoPE; embedding rows against ref::dequantize_row
// ============================================================================================

struct NormShape {
  int64_t rows, n;
  bool in_place = false;  // y = x's buffer (then x ~ N(0, 1), w = 0.5, eps 1e-5)
};

void run_rms_norm(const Case& c, const NormShape& sh, const Backend& b, const Tol& t) {
  std::mt19937 rng = rng_for(c.id, 10);
  const float eps = sh.in_place ? 1e-5f : 1e-6f;
  const std::vector<float> x = normal_vector(sh.rows * sh.n, rng, sh.in_place ? 1.0f : 3.0f);
  std::vector<float> w(sh.n, 0.5f);
  if (!sh.in_place)
    for (float& v : w) v = 1.0f + 0.1f * std::normal_distribution<float>(0.0f, 1.0f)(rng);
  std::vector<double> want(x.size());
  for (int64_t r = 0; r < sh.rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < sh.n; ++i) ss += static_cast<double>(x[r * sh.n + i]) * x[r * sh.n + i];
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(sh.n) + eps);
    for (int64_t i = 0; i < sh.n; ++i) want[r * sh.n + i] = x[r * sh.n + i] * inv * w[i];
  }
  std::vector<float> got;
  if (b.family == Family::kCpu) {
    got = sh.in_place ? x : std::vector<float>(x.size(), NAN);
    cpu::rms_norm(sh.in_place ? got.data() : x.data(), w.data(), got.data(), sh.rows, sh.n, eps);
  } else {
    got = cuda_rms_norm(x, w, sh.rows, sh.n, eps, sh.in_place);
  }
  report("output", expect_within(got, want, [&](size_t i) { return t.atol + t.rtol * std::fabs(want[i]); }, "output"), t);
}

struct GluShape {
  GluKind kind;
  int64_t n, offset;      // offset 1: unaligned pointers (the scalar path)
  bool in_place = false;  // out = gate
};

const char* glu_name(GluKind k) {
  return k == GluKind::kSwiGlu ? "swiglu" : k == GluKind::kGeGluTanh ? "geglu_tanh" : "swiglu_oai";
}

void run_glu(const Case& c, const GluShape& sh, const Backend& b, const Tol& t) {
  std::mt19937 rng = rng_for(c.id, 11);
  const std::vector<float> gate = normal_vector(sh.n + sh.offset, rng, 3.0f), up = normal_vector(sh.n + sh.offset, rng, 3.0f);
  std::vector<double> want(sh.n);
  for (int64_t i = 0; i < sh.n; ++i) {
    const double g = gate[sh.offset + i], u = up[sh.offset + i];
    if (sh.kind == GluKind::kSwiGlu) {
      want[i] = g / (1.0 + std::exp(-g)) * u;
    } else if (sh.kind == GluKind::kGeGluTanh) {
      want[i] = 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
    } else {  // gpt-oss: g = min(gate, 7), u = clamp(up, −7, 7), (u + 1)·g·σ(1.702·g)
      const double gc = std::min(g, 7.0), uc = std::clamp(u, -7.0, 7.0);
      want[i] = (uc + 1.0) * (gc / (1.0 + std::exp(-1.702 * gc)));
    }
  }
  std::vector<float> out;
  if (b.family == Family::kCpu) {
    out = gate;
    float* g = out.data() + sh.offset;
    const float* u = up.data() + sh.offset;
    if (sh.kind == GluKind::kSwiGlu) cpu::silu_mul(g, u, sh.n);
    else if (sh.kind == GluKind::kGeGluTanh) cpu::gelu_tanh_mul(g, u, sh.n);
    else cpu::swiglu_oai_mul(g, u, sh.n);
  } else {
    out = cuda_glu(sh.kind, gate, up, sh.offset, sh.n, sh.in_place);
  }
  const std::vector<float> got(out.begin() + sh.offset, out.end());
  // GeGLU: 1 + tanh(y) near −1 loses ~1.2e-7·|0.5·g| to f32 cancellation (aux·|g·u|).
  const double cancel = sh.kind == GluKind::kGeGluTanh ? t.aux : 0.0;
  report("output", expect_within(got, want, [&](size_t i) {
    return t.atol + t.rtol * std::fabs(want[i]) + cancel * std::fabs(static_cast<double>(gate[sh.offset + i]) * up[sh.offset + i]);
  }, "output"), t);
}

struct RopeShape {
  int32_t n_tokens, n_heads, head_dim, rope_dim, extra_stride;
  bool neox = false;
};

void run_rope(const Case& c, const RopeShape& sh, const Backend& b, const Tol& t) {
  std::mt19937 rng = rng_for(c.id, 12);
  constexpr int32_t kCacheRows = 5000;
  const int32_t half = sh.rope_dim / 2;
  std::vector<int32_t> all(kCacheRows);
  std::iota(all.begin(), all.end(), 0);
  std::vector<float> cos_cache(static_cast<size_t>(kCacheRows) * half), sin_cache(cos_cache.size());
  cpu::rope_table(all.data(), kCacheRows, sh.rope_dim, 10000.0f, 1.0f, cos_cache.data(), sin_cache.data());
  std::vector<int32_t> pos(sh.n_tokens);
  std::uniform_int_distribution<int32_t> pick(0, kCacheRows - 1);
  for (int32_t& p : pos) p = pick(rng);
  const int64_t stride = static_cast<int64_t>(sh.n_heads) * sh.head_dim + sh.extra_stride;
  const std::vector<float> x = normal_vector(static_cast<size_t>(sh.n_tokens) * stride, rng);
  // The rotation in double with the table's (f32) cos and sin; everything else unchanged.
  std::vector<double> want(x.begin(), x.end());
  for (int32_t tk = 0; tk < sh.n_tokens; ++tk)
    for (int32_t h = 0; h < sh.n_heads; ++h)
      for (int32_t i = 0; i < half; ++i) {
        const int64_t base = tk * stride + static_cast<int64_t>(h) * sh.head_dim;
        const int64_t ia = base + (sh.neox ? i : 2 * i), ib = base + (sh.neox ? i + half : 2 * i + 1);
        const double co = cos_cache[static_cast<size_t>(pos[tk]) * half + i], si = sin_cache[static_cast<size_t>(pos[tk]) * half + i];
        want[ia] = x[ia] * co - static_cast<double>(x[ib]) * si;
        want[ib] = x[ia] * si + static_cast<double>(x[ib]) * co;
      }
  std::vector<float> got;
  if (b.family == Family::kCpu) {  // cpu::rope_apply on each token's heads with its table row
    got = x;
    std::vector<float> heads(static_cast<size_t>(sh.n_heads) * sh.head_dim);
    for (int32_t tk = 0; tk < sh.n_tokens; ++tk) {
      std::copy_n(&got[tk * stride], heads.size(), heads.begin());
      cpu::rope_apply(heads.data(), 1, sh.n_heads, sh.head_dim, sh.rope_dim, sh.neox,
                      &cos_cache[static_cast<size_t>(pos[tk]) * half], &sin_cache[static_cast<size_t>(pos[tk]) * half]);
      std::copy(heads.begin(), heads.end(), &got[tk * stride]);
    }
  } else {
    got = cuda_rope(x, pos, stride, sh.n_heads, sh.head_dim, sh.rope_dim, sh.neox, cos_cache, sin_cache);
  }
  report("output", expect_within(got, want, [&](size_t i) { return t.atol + t.rtol * std::fabs(want[i]); }, "output"), t);
}

struct EmbShape {
  GgmlType type;
  int64_t dim;
  float scale;
};

void run_embedding(const Case& c, const EmbShape& sh, const Backend& b, const Tol& t) {
  std::mt19937 rng = rng_for(c.id, 13);
  const int64_t n_rows = 37, row_bytes = static_cast<int64_t>(ggml_row_size(sh.type, sh.dim));
  const std::vector<uint8_t> table = test::random_rows(sh.type, n_rows, sh.dim, rng);
  ASSERT_EQ(static_cast<int64_t>(table.size()), n_rows * row_bytes);
  const std::vector<int32_t> ids = {0, 36, 5, 5, 17, -1, 37, 2, 30, 11, 1};  // -1, 37: out of range, zeros
  std::vector<double> want(ids.size() * sh.dim, 0.0);
  std::vector<float> row(sh.dim);
  for (size_t k = 0; k < ids.size(); ++k) {
    if (ids[k] < 0 || ids[k] >= n_rows) continue;
    ref::dequantize_row(sh.type, table.data() + ids[k] * row_bytes, row.data(), sh.dim);
    for (int64_t i = 0; i < sh.dim; ++i) want[k * sh.dim + i] = row[i] * sh.scale;  // the product rounded as f32
  }
  std::vector<float> got;
  if (b.family == Family::kCpu) {  // cpu::dequantize_row of each valid id, scaled
    got.assign(want.size(), 0.0f);
    for (size_t k = 0; k < ids.size(); ++k) {
      if (ids[k] < 0 || ids[k] >= n_rows) continue;
      cpu::dequantize_row(sh.type, table.data(), sh.dim, ids[k], &got[k * sh.dim]);
      for (int64_t i = 0; i < sh.dim; ++i) got[k * sh.dim + i] *= sh.scale;
    }
  } else {
    got = cuda_embedding(table, sh.type, n_rows, sh.dim, ids, sh.scale);
    // The f16 lookup (the backend's weight dequantization for its GEMM) is the f32 one rounded.
    EXPECT_EQ(cuda_embedding_f16(table, sh.type, n_rows, sh.dim, ids, sh.scale), cuda_to_f16(got)) << "f16 rows";
  }
  report("output", expect_within(got, want, [&](size_t i) { return (t.atol + t.rtol * std::fabs(want[i])) * sh.scale; },
                                 "output"), t);
}

// ============================================================================================
// matmul per weight type: cpu::matmul (f32 activations; 8-bit activations), cuda::quant_gemv vs
// double over the ref-dequantized rows; gemm (f16 / bf16 inputs) vs double over the rounded inputs
// ============================================================================================

struct MatShape {
  GgmlType type;
  int64_t k, n_out;
  int32_t n_x;
  bool q8 = false;  // the CPU's 8-bit activations (Precision::kQ8)
};

void run_matmul(const Case& c, const MatShape& sh, const Backend& b, const Tol& t) {
  std::mt19937 rng = rng_for(c.id, 14);
  const int64_t row_bytes = static_cast<int64_t>(ggml_row_size(sh.type, sh.k));
  const std::vector<uint8_t> w = test::random_rows(sh.type, sh.n_out, sh.k, rng);
  const std::vector<float> x = normal_vector(static_cast<size_t>(sh.n_x) * sh.k, rng);
  std::vector<double> want(static_cast<size_t>(sh.n_x) * sh.n_out), mag(want.size()), q8(want.size());
  std::vector<float> row(sh.k);
  for (int64_t n = 0; n < sh.n_out; ++n) {
    ref::dequantize_row(sh.type, w.data() + n * row_bytes, row.data(), sh.k);
    for (int32_t m = 0; m < sh.n_x; ++m) {
      double sum = 0, abs_sum = 0, bound = 0;
      for (int64_t i = 0; i < sh.k; ++i) {
        sum += static_cast<double>(row[i]) * x[m * sh.k + i];
        abs_sum += std::fabs(static_cast<double>(row[i]) * x[m * sh.k + i]);
      }
      // 8-bit activations: each 32-block rounded to multiples of d_b = max|x_b| / 127 (moved ≤ d_b / 2).
      for (int64_t b0 = 0; b0 < sh.k; b0 += 32) {
        double amax = 0, wsum = 0;
        for (int64_t i = b0; i < std::min(sh.k, b0 + 32); ++i) {
          amax = std::max(amax, static_cast<double>(std::fabs(x[m * sh.k + i])));
          wsum += std::fabs(static_cast<double>(row[i]));
        }
        bound += amax / 127.0 / 2.0 * wsum;
      }
      want[m * sh.n_out + n] = sum;
      mag[m * sh.n_out + n] = abs_sum;
      q8[m * sh.n_out + n] = bound;
    }
  }
  std::vector<float> got;
  if (b.family == Family::kCpu) {
    got.assign(want.size(), NAN);
    cpu::matmul(pool(), sh.type, w.data(), sh.n_out, sh.k, x.data(), sh.n_x, got.data(),
                sh.q8 ? cpu::Precision::kQ8 : cpu::Precision::kF32);
  } else {
    got = cuda_quant_gemv(sh.type, w, sh.n_out, sh.k, x, sh.n_x);
    // Batch invariance: over 4 rows the many-row kernel runs; its rows must be bitwise the
    // one-row kernel's: the first four and the 4-row group holding the middle row those of 4-row
    // calls, the last row that of a 1-row call.
    if (sh.n_x > 4) {
      const auto rows_of = [&](int32_t m0, int32_t count) {
        return std::vector<float>(x.begin() + m0 * sh.k, x.begin() + (m0 + count) * sh.k);
      };
      const auto same_rows = [&](const std::vector<float>& part, int32_t m0) {
        return std::memcmp(part.data(), got.data() + m0 * sh.n_out, part.size() * sizeof(float)) == 0;
      };
      EXPECT_TRUE(same_rows(cuda_quant_gemv(sh.type, w, sh.n_out, sh.k, rows_of(0, 4), 4), 0)) << "rows 0..3";
      const int32_t mid = std::min(sh.n_x / 2, sh.n_x - 4);
      EXPECT_TRUE(same_rows(cuda_quant_gemv(sh.type, w, sh.n_out, sh.k, rows_of(mid, 4), 4), mid)) << "middle rows";
      EXPECT_TRUE(same_rows(cuda_quant_gemv(sh.type, w, sh.n_out, sh.k, rows_of(sh.n_x - 1, 1), 1), sh.n_x - 1))
          << "the last row";
    }
  }
  double worst_rel = 0;
  for (size_t i = 0; i < got.size(); ++i) worst_rel = std::max(worst_rel, std::fabs(got[i] - want[i]) / mag[i]);
  report("output", expect_within(got, want, [&](size_t i) { return t.atol + t.sum * mag[i] + t.q8 * q8[i]; }, "output"), t);
  std::printf("  worst |err| / Σ|w·x| %.3g\n", worst_rel);
}

uint16_t bf16_rne(float x) {  // independent of the emulator's conversion
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

struct GemmShape {
  bool bf16, tiled;  // tiled: the tiled kernel; else the handle API (cuBLAS, a host loop under the emulator)
  int32_t m, n, k, pad;
};

void run_gemm(const Case& c, const GemmShape& sh, const Backend&, const Tol& t) {
  std::mt19937 rng = rng_for(c.id, 15);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t lda = sh.k + sh.pad, ldb = sh.k + 2 * sh.pad, ldc = sh.n + sh.pad;
  std::vector<uint16_t> a(static_cast<size_t>(sh.m) * lda), bm(static_cast<size_t>(sh.n) * ldb);
  std::vector<float> af(a.size()), bf(bm.size());
  const auto round_in = [&](float v, uint16_t* bits) {
    *bits = sh.bf16 ? bf16_rne(v) : ref::fp32_to_fp16(v);
    if (!sh.bf16) return ref::fp16_to_fp32(*bits);
    const uint32_t u = static_cast<uint32_t>(*bits) << 16;
    float r;
    std::memcpy(&r, &u, 4);
    return r;
  };
  for (size_t i = 0; i < a.size(); ++i) af[i] = round_in(normal(rng), &a[i]);
  for (size_t i = 0; i < bm.size(); ++i) bf[i] = round_in(normal(rng), &bm[i]);
  const std::vector<float> c0(static_cast<size_t>(sh.m) * ldc, 99.0f);
  const std::vector<float> got = cuda_gemm(sh.bf16, sh.tiled, a, lda, bm, ldb, c0, ldc, sh.m, sh.n, sh.k);
  std::vector<float> got_c;
  std::vector<double> want, mag;
  for (int32_t i = 0; i < sh.m; ++i) {
    for (int32_t j = 0; j < sh.n; ++j) {
      double sum = 0, m = 0;
      for (int32_t kk = 0; kk < sh.k; ++kk) {
        const double p = static_cast<double>(af[i * lda + kk]) * bf[j * ldb + kk];
        sum += p;
        m += std::fabs(p);
      }
      got_c.push_back(got[i * ldc + j]);
      want.push_back(sum);
      mag.push_back(m);
    }
    for (int64_t j = sh.n; j < ldc; ++j) ASSERT_EQ(got[i * ldc + j], 99.0f) << "wrote past n, row " << i;
  }
  report("output", expect_within(got_c, want, [&](size_t i) { return t.atol + t.sum * mag[i]; }, "output"), t);
}

// ============================================================================================
// Sampling: cuda::sample_top_k_top_p vs its rule written plainly (a full sort of the row, prefixes,
// a walk in id order, in the same 32.32 fixed-point weights)
// ============================================================================================

uint32_t sample_key(float x) {
  if (std::isnan(x)) x = -INFINITY;
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

int32_t sample_reference(const float* x, int32_t vocab, const SampleParams& p) {
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return sample_key(x[a]) > sample_key(x[b]); });
  float m = x[order[0]];
  if (std::isnan(m)) m = -INFINITY;
  if (!(p.temperature >= 1e-5f) || p.top_k == 1 || !std::isfinite(m)) return order[0];
  const float inv_t = 1.0f / p.temperature;
  auto weight = [&](int32_t i) {
    const float v = std::isnan(x[i]) ? -INFINITY : x[i];
    return static_cast<uint64_t>(std::exp((v - m) * inv_t) * 4294967296.0f);
  };
  size_t keep = p.top_k > 0 && p.top_k < vocab ? static_cast<size_t>(p.top_k) : order.size();
  uint64_t total = 0;
  for (size_t j = 0; j < keep; ++j) total += weight(order[j]);
  if (p.top_p < 1.0f) {
    const double tp = static_cast<double>(p.top_p) * (1.0 - 1e-6) * static_cast<double>(total);
    const uint64_t target = tp < 1.0 ? 1 : static_cast<uint64_t>(tp);
    uint64_t cum = 0;
    for (size_t j = 0; j < keep; ++j) {
      cum += weight(order[j]);
      if (cum >= target) {
        keep = j + 1;
        break;
      }
    }
    total = cum;
  }
  std::vector<int32_t> chosen(order.begin(), order.begin() + static_cast<ptrdiff_t>(keep));
  std::sort(chosen.begin(), chosen.end());
  uint64_t r = static_cast<uint64_t>(p.uniform * static_cast<double>(total));
  if (r >= total) r = total - 1;
  uint64_t cum = 0;
  for (int32_t id : chosen) {
    cum += weight(id);
    if (cum > r) return id;
  }
  return -1;
}

struct SampleRow {
  std::vector<float> logits;
  SampleParams params;
  const char* what;
};

enum class SampleSet { kMixed, kGemmaVocab, kNucleusFrequencies };

std::vector<SampleRow> sample_rows(SampleSet set, int32_t vocab, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<SampleRow> rows;
  if (set == SampleSet::kGemmaVocab) {
    for (const SampleParams p : {SampleParams{0.0f, 0, 1.0f, 0.3}, SampleParams{0.8f, 40, 0.9f, 0.61},
                                 SampleParams{1.0f, 0, 0.95f, 0.17}}) {
      SampleRow row{std::vector<float>(vocab), p, "V=262144"};
      for (float& v : row.logits) v = normal(rng) * 3.0f;
      rows.push_back(row);
    }
    return rows;
  }
  if (set == SampleSet::kNucleusFrequencies) {  // 90 uniforms spread over [0, 1)
    const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f), std::log(0.05f),
                                       std::log(0.03f), std::log(0.02f)};
    for (int32_t i = 0; i < 90; ++i) rows.push_back({logits, {1.0f, 0, 0.9f, (i + 0.5) / 90}, "freq"});
    return rows;
  }
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> small(-3, 3);
  const float temps[] = {0.0f, 0.3f, 1.0f, 1.7f};
  const float top_ps[] = {1.0f, 0.95f, 0.5f, 0.01f};
  const int32_t top_ks[] = {0, 1, 2, 5, 50, vocab, vocab + 3};
  for (int kind = 0; kind < 4; ++kind)
    for (int rep = 0; rep < 12; ++rep) {
      SampleRow row;
      row.logits.resize(vocab);
      switch (kind) {
        case 0: row.what = "normal"; for (float& v : row.logits) v = normal(rng) * 2.0f; break;
        case 1: row.what = "peaked"; for (float& v : row.logits) v = normal(rng) * 8.0f; break;
        case 2: row.what = "ties"; for (float& v : row.logits) v = static_cast<float>(small(rng)); break;
        default:
          row.what = "masked";
          for (float& v : row.logits) {
            const int c = small(rng);
            v = c == -3 ? -INFINITY : c == 3 ? NAN : normal(rng);
          }
          if (vocab == 1) row.logits[0] = 0.5f;
          break;
      }
      row.params.temperature = temps[(rep + kind) % 4];
      row.params.top_k = top_ks[rep % 7];
      row.params.top_p = top_ps[(rep / 2 + kind) % 4];
      row.params.uniform = rep == 0 ? 0.0 : rep == 1 ? 0.9999999999 : unit(rng);
      rows.push_back(row);
    }
  // Edge rows: a uniform row (all ties), all −inf (argmax = 0), a +inf logit, −0 vs +0.
  SampleRow flat{std::vector<float>(vocab, 0.25f), {1.0f, 0, 0.5f, 0.73}, "flat"};
  rows.push_back(flat);
  flat.params = {1.0f, 3, 1.0f, 0.99};
  rows.push_back(flat);
  rows.push_back({std::vector<float>(vocab, -INFINITY), {1.0f, 0, 0.9f, 0.5}, "all -inf"});
  SampleRow inf{std::vector<float>(vocab, 1.0f), {1.0f, 0, 1.0f, 0.5}, "+inf"};
  inf.logits[vocab / 2] = INFINITY;
  rows.push_back(inf);
  SampleRow zeros{std::vector<float>(vocab, -5.0f), {1e-6f, 0, 1.0f, 0.5}, "signed zeros"};
  zeros.logits[0] = -0.0f;
  zeros.logits[vocab - 1] = 0.0f;
  rows.push_back(zeros);
  return rows;
}

void run_sampling(const Case& c, SampleSet set, int32_t vocab, const Backend&, const Tol& t) {
  std::mt19937 rng = rng_for(c.id, 16);
  const std::vector<SampleRow> rows = sample_rows(set, vocab, rng);
  const int64_t stride = vocab + 3;
  std::vector<float> logits(rows.size() * stride, 1e30f);  // padding past vocab must be ignored
  std::vector<SampleParams> params;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy(rows[r].logits.begin(), rows[r].logits.end(), &logits[r * stride]);
    params.push_back(rows[r].params);
  }
  const std::vector<int32_t> got = cuda_sample(logits, stride, vocab, params);
  ASSERT_EQ(got.size(), rows.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const SampleParams& p = rows[r].params;
    const int32_t want = sample_reference(rows[r].logits.data(), vocab, p);
    bool ok = got[r] == want;
    if (!ok && t.aux > 0) {  // a draw at u ± aux (see the table)
      SampleParams near = p;
      for (double du : {-t.aux, t.aux}) {
        near.uniform = std::clamp(p.uniform + du, 0.0, 0.9999999999);
        ok = ok || got[r] == sample_reference(rows[r].logits.data(), vocab, near);
      }
    }
    EXPECT_TRUE(ok) << rows[r].what << " row " << r << ": token " << got[r] << ", the reference's " << want
                    << " (T=" << p.temperature << " k=" << p.top_k << " p=" << p.top_p << " u=" << p.uniform << ")";
  }
  if (set == SampleSet::kNucleusFrequencies) {
    // Tokens in proportion to their weights: the nucleus of 0.9 is {0.4, 0.3, 0.2} renormalised to
    // 4/9, 3/9, 2/9, and the tail never appears.
    std::vector<int32_t> count(vocab, 0);
    for (int32_t id : got) ++count[id];
    const double n = static_cast<double>(got.size());
    EXPECT_NEAR(count[0], n * 4 / 9.0, 1);
    EXPECT_NEAR(count[1], n * 3 / 9.0, 1);
    EXPECT_NEAR(count[2], n * 2 / 9.0, 1);
    EXPECT_EQ(count[3] + count[4] + count[5], 0);
  }
  std::printf("  %zu rows\n", rows.size());
}

// ============================================================================================
// KV append: cuda::kv_append (then kv_set_running, kv_get_running) vs the rows appended one at a
// time on the host as CpuKvStorage does (cpu::kv_store, cpu::kv_store_int8_row, a bf16 rounding
// written here, key_moments_update), and the planes' bytes compared
// ============================================================================================

struct KvAppendShape {
  KvStore dtype;
  int32_t d, n_kv_heads, bs;
  std::vector<std::pair<int32_t, int32_t>> seqs;  // (positions already cached, positions appended)
};

const char* kv_store_name(KvStore t) {
  return t == KvStore::kF32 ? "f32" : t == KvStore::kF16 ? "f16" : t == KvStore::kBF16 ? "bf16" : "int8";
}

// One layer on the host, appended one token at a time.
struct HostLayer {
  KvLayer l;
  size_t elem;
  HostLayer(KvStore t, int32_t blocks, int32_t h, int32_t d, int32_t bs, std::mt19937& rng) {
    l.dtype = t;
    l.block_size = bs;
    l.n_kv_heads = h;
    l.head_dim = d;
    elem = t == KvStore::kF32 ? 4 : t == KvStore::kI8 ? 1 : 2;
    const size_t n = static_cast<size_t>(blocks) * h * bs * d;
    std::uniform_int_distribution<int> byte(0, 255);
    for (auto* buf : {&l.k, &l.v, &l.k_t}) {
      buf->resize(n * elem);
      for (uint8_t& b : *buf) b = static_cast<uint8_t>(byte(rng));  // garbage outside appended rows
    }
    const size_t rows = static_cast<size_t>(blocks) * h * bs;
    l.k_rows.assign(t == KvStore::kI8 ? rows : 0, KvInt8Row{-7.0f, 3.0f});
    l.v_rows = l.k_rows;
    l.v_sum.assign(static_cast<size_t>(blocks) * h * d, 12345.0f);
    l.k_moments.assign(static_cast<size_t>(blocks) * h * 2 * d, -777.0f);
  }
  void store(const float* src, uint8_t* dst, KvInt8Row* row) const {
    switch (l.dtype) {
      case KvStore::kF32: cpu::kv_store(src, dst, KvDtype::kF32, l.head_dim); return;
      case KvStore::kF16: cpu::kv_store(src, dst, KvDtype::kF16, l.head_dim); return;
      case KvStore::kBF16:
        for (int32_t c = 0; c < l.head_dim; ++c) {
          const uint16_t h = bf16_rne(src[c]);
          std::memcpy(dst + 2 * c, &h, 2);
        }
        return;
      case KvStore::kI8: cpu::kv_store_int8_row(src, l.head_dim, dst, row); return;
    }
  }
  // kr, vr: [n_kv_heads][d] f32 of the token at `pos` of the sequence with block table `table`.
  void append(const int32_t* table, int32_t pos, const float* kr, const float* vr) {
    const int32_t d = l.head_dim, bs = l.block_size, slot = pos % bs, block = table[pos / bs];
    for (int32_t h = 0; h < l.n_kv_heads; ++h) {
      const size_t tile = static_cast<size_t>(block) * l.n_kv_heads + h, row = tile * bs + slot;
      KvInt8Row* kp = l.dtype == KvStore::kI8 ? &l.k_rows[row] : nullptr;
      KvInt8Row* vp = l.dtype == KvStore::kI8 ? &l.v_rows[row] : nullptr;
      store(kr + h * d, &l.k[row * d * elem], kp);
      store(vr + h * d, &l.v[row * d * elem], vp);
      for (int32_t c = 0; c < d; ++c) std::memcpy(&l.k_t[((tile * d + c) * bs + slot) * elem], &l.k[(row * d + c) * elem], elem);
      float* sum = &l.v_sum[tile * d];
      const float* prev = nullptr;
      if (slot > 0) prev = sum;
      else if (pos > 0) prev = &l.v_sum[(static_cast<size_t>(table[pos / bs - 1]) * l.n_kv_heads + h) * d];
      for (int32_t c = 0; c < d; ++c) sum[c] = (prev ? prev[c] : 0.0f) + vr[h * d + c];
      // K moments: the previous position's (this tile's or the previous block's), updated.
      float* moments = &l.k_moments[tile * 2 * d];
      const float* before = prev == nullptr ? nullptr : prev == sum ? moments
                            : &l.k_moments[(static_cast<size_t>(table[pos / bs - 1]) * l.n_kv_heads + h) * 2 * d];
      for (int32_t c = 0; c < d; ++c) {
        float mean = before ? before[c] : 0.0f, m2 = before ? before[d + c] : 0.0f;
        key_moments_update(kr[h * d + c], pos, mean, m2);
        moments[c] = mean;
        moments[d + c] = m2;
      }
    }
  }
};

template <typename T>
void expect_bitwise(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << ": first difference at element " << i;
      return;
    }
}

// Exact, or (t.rtol > 0: a device, see the table) within t.
void expect_moments(const std::vector<float>& got, const std::vector<float>& want, const Tol& t, const std::string& what) {
  if (t.rtol == 0) return expect_bitwise(got, want, what);
  expect_close(got, want, t, what);
}

void run_kv_append(const Case& c, const KvAppendShape& sh, const Backend&, const Tol& t) {
  std::mt19937 rng = rng_for(c.id, 17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int32_t n_seqs = static_cast<int32_t>(sh.seqs.size());
  int32_t max_blocks = 0, used = 0;
  for (const auto& [prefix, n_new] : sh.seqs) {
    const int32_t nb = (prefix + n_new + sh.bs - 1) / sh.bs;
    max_blocks = std::max(max_blocks, nb);
    used += nb;
  }
  const int32_t physical = used + 3, stride = max_blocks + 1;
  std::vector<int32_t> perm(physical);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> tables(static_cast<size_t>(n_seqs) * stride, -1);
  for (int32_t s = 0, next = 0; s < n_seqs; ++s)
    for (int32_t b = 0; b < (sh.seqs[s].first + sh.seqs[s].second + sh.bs - 1) / sh.bs; ++b) tables[s * stride + b] = perm[next++];
  HostLayer host(sh.dtype, physical, sh.n_kv_heads, sh.d, sh.bs, rng);
  const int32_t row = sh.n_kv_heads * sh.d;
  std::vector<float> kr(row), vr(row);
  for (int32_t s = 0; s < n_seqs; ++s)  // the cached prefixes, one by one
    for (int32_t p = 0; p < sh.seqs[s].first; ++p) {
      for (float& x : kr) x = normal(rng);
      for (float& x : vr) x = normal(rng);
      host.append(&tables[s * stride], p, kr.data(), vr.data());
    }
  // The batch: tokens of sequence s contiguous; K and V in a fused buffer (token stride 2·row + 5).
  KvBatch batch;
  batch.token_stride = 2 * row + 5;
  batch.v_offset = row;
  batch.seq_token_start = {0};
  for (const auto& [prefix, n_new] : sh.seqs) {
    for (int32_t j = 0; j < n_new; ++j) batch.positions.push_back(prefix + j);
    batch.seq_token_start.push_back(static_cast<int32_t>(batch.positions.size()));
  }
  const int32_t n_tokens = static_cast<int32_t>(batch.positions.size());
  batch.kv.resize(static_cast<size_t>(n_tokens) * batch.token_stride);
  for (float& x : batch.kv) x = normal(rng) * 2.0f;
  if (sh.dtype == KvStore::kI8 && n_tokens > 1)  // a constant V row: scale 0
    std::fill_n(&batch.kv[batch.token_stride + row], sh.d, 0.25f);
  batch.block_tables = tables;
  batch.table_stride = stride;
  // The running planes after each token of every other sequence (a verify step's journal).
  batch.running_row.assign(n_seqs, -1);
  for (int32_t s = 0; s < n_seqs; ++s)
    if (s % 2 == 1 || n_seqs == 1) {
      batch.running_row[s] = batch.journal_rows;
      batch.journal_rows += sh.seqs[s].second;
    }
  const size_t per_row = static_cast<size_t>(sh.n_kv_heads) * 3 * sh.d;
  std::vector<float> journal(batch.journal_rows * per_row);
  std::vector<int32_t> journal_block(batch.journal_rows);
  const KvLayer before = host.l;
  const std::vector<int32_t>& starts = batch.seq_token_start;
  for (int32_t s = 0; s < n_seqs; ++s)
    for (int32_t i = starts[s]; i < starts[s + 1]; ++i) {
      host.append(&tables[s * stride], batch.positions[i], &batch.kv[i * batch.token_stride],
                  &batch.kv[i * batch.token_stride + row]);
      if (batch.running_row[s] < 0) continue;
      const int32_t j = batch.running_row[s] + i - starts[s], block = tables[s * stride + batch.positions[i] / sh.bs];
      journal_block[j] = block;
      for (int32_t h = 0; h < sh.n_kv_heads; ++h) {
        const size_t tile = static_cast<size_t>(block) * sh.n_kv_heads + h;
        float* out = &journal[j * per_row + h * 3 * sh.d];
        std::copy_n(&host.l.v_sum[tile * sh.d], sh.d, out);
        std::copy_n(&host.l.k_moments[tile * 2 * sh.d], 2 * sh.d, out + sh.d);
      }
    }
  const KvAppendResult r = cuda_kv_append(before, batch, batch.journal_rows > 0 ? journal_block[0] : 0);
  expect_bitwise(r.after.k, host.l.k, "K");
  expect_bitwise(r.after.v, host.l.v, "V");
  expect_bitwise(r.after.k_t, host.l.k_t, "K^T");
  expect_bitwise(r.after.v_sum, host.l.v_sum, "v_sum");
  expect_moments(r.after.k_moments, host.l.k_moments, t, "k_moments");
  if (sh.dtype == KvStore::kI8) {
    expect_bitwise(r.after.k_rows, host.l.k_rows, "k_rows");
    expect_bitwise(r.after.v_rows, host.l.v_rows, "v_rows");
  }
  expect_moments(r.journal, journal, t, "the running planes after each journaled token");
  if (batch.journal_rows == 0) return;
  // A rollback to the first journaled token: its block's planes as they were after it.
  std::vector<float> want_sum = host.l.v_sum, want_moments = host.l.k_moments;
  for (int32_t h = 0; h < sh.n_kv_heads; ++h) {
    const size_t tile = static_cast<size_t>(journal_block[0]) * sh.n_kv_heads + h;
    std::copy_n(&r.journal[h * 3 * sh.d], sh.d, &want_sum[tile * sh.d]);
    std::copy_n(&r.journal[h * 3 * sh.d + sh.d], 2 * sh.d, &want_moments[tile * 2 * sh.d]);
  }
  expect_bitwise(r.v_sum_rolled, want_sum, "v_sum after kv_set_running");
  expect_bitwise(r.k_moments_rolled, want_moments, "k_moments after kv_set_running");
  // kv_get_running copies out what kv_set_running wrote (sparse drafting keeps them so).
  expect_bitwise(r.running_read, std::vector<float>(r.journal.begin(), r.journal.begin() + per_row), "kv_get_running");
}

// ============================================================================================
// The table
// ============================================================================================

// Attention tolerances, by backend family (every KV dtype reads the same stored values as the
// reference: f16 converted exactly, INT8 as scale·x_q + min):
//   CPU   f32 / f16: atol = rtol = 5e-6 (only f32 summation order and the 2-ulp vector exp differ;
//                    seen ~7e-7; SWA's window through the dense Kᵀ kernel's 64-key online softmax
//                    1.3e-6). INT8: 2e-5 (the kernels sum scale·(q·x_q) + min·Σq, whose terms of
//                    size ~|min·Σq| cancel; seen 2e-6, 6e-6 for SWA). SparQ α: 1e-5. SWA weights:
//                    1e-5 per query head. Selections (float scores vs the reference's double):
//                    SparQ ≥ 98% of each kv head's I2, HiP ≥ 95% of each head's blocks (the
//                    estimate is iterative: a flip in one iteration can move a few blocks).
//   CUDA  atol 1e-5, rtol 0 for dense, HiP, SWA; 2e-5 for SparQ and its α (expf vs exp, split
//         merges, float vs double logits; outputs are convex combinations of |v| ~ 1 rows, so an
//         absolute bound). SWA weights 1e-5 per query head. Selections: all but max(2, total/16)
//         of the reference's, over all heads.
Tol attention_tol(Family family, const std::string& op, KvDtype dtype) {
  if (family == Family::kCpu) {
    const double e = dtype == KvDtype::kI8 ? 2e-5 : 5e-6;
    Tol t{e, e, 1e-5};
    t.overlap = {op == "hip" ? 0.95 : 0.98, 0, true};
    return t;
  }
  Tol t{op == "sparq" ? 2e-5 : 1e-5, 0.0, op == "sparq" ? 2e-5 : 1e-5};
  t.overlap = {15.0 / 16.0, 2, false};
  return t;
}

// The emulator runs a CUDA thread as a fiber: the full sweep would take minutes there, so it runs
// the sweep's shapes of 33 keys (several blocks, the last partial; the CUDA launch shapes have the
// short ones) with both side planes (the CUDA backend always keeps them; the launch shapes go
// without the Kᵀ plane too), and every CUDA launch shape (AttnShape::emulated); a device runs all.
bool emulator_affordable(const AttnShape& s) { return s.emulated; }

struct TableBuilder {
  std::vector<Case> cases;
  int32_t shape_id = 0;

  Case& add(const std::string& op, const std::string& shape, Tol cpu, Tol cuda,
            std::function<void(const Case&, const Backend&, const Tol&)> run,
            std::function<bool(const Backend&)> runs_on = nullptr) {
    Case c;
    c.op = op;
    c.shape = shape;
    c.id = static_cast<int32_t>(cases.size());
    c.shape_id = shape_id;
    c.cpu = cpu;
    c.cuda = cuda;
    c.device = cuda;
    c.amx = cpu;
    c.run = std::move(run);
    c.runs_on = std::move(runs_on);
    cases.push_back(std::move(c));
    return cases.back();
  }
  void next_shape() { ++shape_id; }

  // Which backends run an attention op on shape s.
  static std::function<bool(const Backend&)> attention_backends(const AttnShape& s, bool cuda_ok) {
    return [s, cuda_ok](const Backend& b) {
      if (b.family == Family::kCpu) return is_cpu_level(b);
      return cuda_ok && (b.name != "cuda_emu" || emulator_affordable(s));
    };
  }
  void dense(const AttnShape& s, const DenseOp& p) {
    add("dense", s.name() + "_" + p.name(), attention_tol(Family::kCpu, "dense", s.dtype),
        attention_tol(Family::kCuda, "dense", s.dtype),
        [s, p](const Case& c, const Backend& b, const Tol& t) { run_dense(c, s, p, b, t); }, attention_backends(s, true));
  }
  void sparq(const AttnShape& s, const SparqOp& p) {
    // CUDA: reallocation needs the running V sums (the CUDA backend always keeps them).
    add("sparq", s.name() + "_" + p.name(), attention_tol(Family::kCpu, "sparq", s.dtype),
        attention_tol(Family::kCuda, "sparq", s.dtype),
        [s, p](const Case& c, const Backend& b, const Tol& t) { run_sparq(c, s, p, b, t); },
        attention_backends(s, s.v_sum || !p.reallocation));
  }
  void hip(const AttnShape& s, const HipOp& p) {
    // CUDA: one mask per kv head fits the estimation kernel up to G·d = 2048.
    add("hip", s.name() + "_" + p.name(), attention_tol(Family::kCpu, "hip", s.dtype),
        attention_tol(Family::kCuda, "hip", s.dtype),
        [s, p](const Case& c, const Backend& b, const Tol& t) { run_hip(c, s, p, b, t); },
        attention_backends(s, !p.p.per_kv_head || s.G * s.d <= 2048));
  }
  // Bifurcated tolerances (absolute; |v| ~ 1): CPU f32 / f16 5e-6 (both sides read the same stored
  // values; only accumulation order and chunk cuts differ), INT8 1e-5 (the kernel forms
  // scale·(q·x_q) + min·Σq in f32, see test_attention); the AMX rows kernel f16 5e-5, INT8 1e-4
  // (q and p split into two bf16 terms each are exact to 2^-17, attention_rows_amx.cpp; the error
  // grows with head_dim and INT8's logit cancels; seen ~1.7e-5 f16, ~2.9e-5 INT8 at d 256; f32
  // takes the AVX-512 kernel). CUDA 1e-5 for every dtype (expf vs exp, the split merges).
  void bifurcated(const BifShape& s) {
    const double cpu = s.dtype == KvDtype::kI8 ? 1e-5 : 5e-6;
    const double amx = s.dtype == KvDtype::kI8 ? 1e-4 : s.dtype == KvDtype::kF16 ? 5e-5 : 5e-6;
    Case& c = add("bifurcated", s.name, Tol{cpu}, Tol{1e-5},
                  [s](const Case& c, const Backend& b, const Tol& t) { run_bifurcated(c, s, b, t); },
                  [s](const Backend& b) { return b.family == Family::kCpu || b.name != "cuda_emu" || s.emulated; });
    c.amx = Tol{amx};
    next_shape();
  }
  void swa(const AttnShape& s, const SwaOp& p) {
    add("swa", s.name() + "_" + p.name(), attention_tol(Family::kCpu, "swa", s.dtype),
        attention_tol(Family::kCuda, "swa", s.dtype),
        [s, p](const Case& c, const Backend& b, const Tol& t) { run_swa(c, s, p, b, t); }, attention_backends(s, true));
  }
};

std::vector<Case> build_table() {
  TableBuilder T;
  const KvDtype kDtypes[] = {KvDtype::kF32, KvDtype::kF16, KvDtype::kI8};

  // ---- attention, the sweep: head dim 64/128/256, GQA group 1/3/4/8, S = 1, 7 (below a block),
  // 16 (one block), 33 (odd), 2001 (long); f32 / f16 / INT8; without and with the side planes
  // (transposed K, running V sums); block size 16, plus 8 (the generic tile path), 32 and 64
  // (several 16-position sub-tiles per Kᵀ tile) for d = 64, G = 3. Block tables are shuffled.
  // Per shape: dense; SparQ (k = max(2, S/3), r = d/8), with the key spread; HiP with three
  // parameter sets sized to these lengths (A dense up to S = 45 and ~6 halvings at 2001, B sparse
  // from S = 16, C = A with one mask per kv head; the mask estimated 5 steps back: a cached mask;
  // HiP reads no side planes: shapes without them); SWA at ratios 0.3 and 0.5 over a coarse mass;
  // and the loosest settings, which equal dense attention: SparQ k ≥ S, SWA ratio 1, HiP mask_k ≥ S.
  for (int32_t bs : {16, 8, 32, 64})
    for (int32_t d : {64, 128, 256})
      for (int32_t G : {1, 3, 4, 8})
        for (int32_t S : {1, 7, 16, 33, 2001})
          for (KvDtype dtype : kDtypes)
            for (bool side : {false, true}) {
              if (bs != 16 && (d != 64 || G != 3)) continue;
              AttnShape s{d, G, S, dtype, bs, side, side};
              s.emulated = S == 33 && side;
              T.dense(s, {});
              SparqOp sq;
              sq.k = std::max(2, S / 3);
              sq.r = d / 8;
              T.sparq(s, sq);
              sq.key_spread = true;
              T.sparq(s, sq);
              if (!side)
                for (const ref::HipParams& p : {ref::HipParams{32, 2, 4, 8}, ref::HipParams{8, 2, 2, 4},
                                                ref::HipParams{32, 2, 4, 8, true}})
                  T.hip(s, HipOp{p, 5});
              for (float ratio : {0.3f, 0.5f}) T.swa(s, SwaOp{ratio});
              SparqOp all;
              all.k = S + 3;
              T.sparq(s, all);
              SwaOp swa_all{1.0f};
              swa_all.weights = false;
              T.swa(s, swa_all);
              if (!side) T.hip(s, HipOp{ref::HipParams{S + 1, 2, 4, 8}});
              T.next_shape();
            }

  // ---- attention, the CUDA launch shapes: odd head dims (lane tails), groups 2 and 5 (tiles with
  // inactive rows), split sizes that make many chunks, windows, prefill rows, soft caps and sinks.
  for (KvDtype dtype : kDtypes) {
    struct Dense {
      int32_t d, G, S;
      DenseOp p;
    };
    const Dense dense[] = {
        // S: 1, below one block, one block, odd multi-block, long; groups 1/3/4/8; d 64/128/256.
        {64, 1, 1, {1, 0, 256}}, {64, 4, 7, {1, 0, 256}}, {128, 3, 16, {1, 0, 256}}, {128, 8, 83, {1, 0, 256}},
        {128, 4, 83, {1, 0, 32}}, {64, 8, 513, {1, 0, 64}}, {256, 3, 300, {1, 0, 128}}, {256, 8, 257, {1, 0, 96}},
        {256, 1, 769, {1, 0, 256}},
        // Odd head dims, group 2 and 5.
        {80, 1, 37, {1, 0, 16}}, {7, 2, 50, {1, 0, 256}}, {33, 5, 129, {1, 0, 40}}, {200, 2, 61, {1, 0, 20}},
        // Sliding window, and several queries (a chunk past some queries' ranges is empty).
        {64, 2, 200, {1, 50, 16}}, {64, 4, 70, {5, 0, 16}}, {128, 2, 45, {4, 20, 8}},
        // Keys fewer than the block's 4 warps, and chunks of one key.
        {32, 1, 3, {1, 0, 1}}, {32, 3, 2, {2, 0, 256}},
        // Soft-capped logits (cap 1 over logits ~ N(0, 1): most of them bent) and sinks, one split
        // and several (the merge adds the sink), prefill rows and a window.
        {64, 4, 83, {1, 0, 256, 1.0f}}, {256, 2, 300, {1, 0, 64, 1.0f}}, {128, 2, 45, {4, 20, 8, 1.0f}},
        {64, 4, 83, {1, 0, 256, 0.0f, true}}, {256, 2, 300, {1, 0, 64, 0.0f, true}}, {128, 2, 45, {4, 20, 8, 0.0f, true}},
    };
    for (const Dense& x : dense) {
      AttnShape s{x.d, x.G, x.S, dtype, 16, true, true, 3};
      T.dense(s, x.p);
      T.next_shape();
    }
    struct Sparq {
      int32_t d, G, S, k, l, r;
      bool reallocation, k_t, key_spread;
    };
    const Sparq sparq[] = {
        // k ≥ S (everything), S = 1, below a block, one block.
        {64, 1, 1, 128, -1, -1, true, true, false}, {64, 4, 7, 128, -1, -1, true, true, false},
        {128, 3, 16, 8, 2, -1, true, true, false},
        // Odd multi-block, multi-chunk scores (96 keys per chunk) and gather splits (24).
        {128, 8, 83, 32, 8, 16, true, true, false}, {64, 3, 300, 40, 10, 8, false, true, false},
        {256, 4, 257, 50, -1, 32, true, false, false}, {256, 1, 700, 64, 16, -1, true, true, false},
        {128, 4, 513, 100, 25, 5, true, false, false}, {64, 8, 129, 17, 1, 1, false, true, false},
        // Step 1 weighted by the keys' spread from the moments (keys as Gemma 3's).
        {64, 3, 300, 40, 10, 8, true, true, true}, {256, 1, 700, 64, 16, -1, true, false, true},
        {128, 8, 83, 32, 8, 16, false, true, true},
    };
    for (const Sparq& x : sparq) {
      AttnShape s{x.d, x.G, x.S, dtype, 16, x.k_t, true};
      s.spread_keys = x.key_spread;
      T.sparq(s, SparqOp{x.k, x.l, x.r, x.reallocation, x.key_spread, 96, 24});
      T.next_shape();
    }
    struct Hip {
      int32_t d, G, S;  // S: the estimation's length; the attention runs `reuse` steps later
      ref::HipParams p;
      int32_t reuse;
    };
    const Hip hip[] = {
        // Dense (T′ ≤ mask_k): S = 1, below a block, one block.
        {64, 1, 1, {16, 2, 4, 8}, 0}, {64, 4, 7, {16, 2, 4, 8}, 0}, {128, 3, 16, {16, 2, 4, 8}, 0},
        // Sparse: odd lengths (a partial last key block), several halvings, mask reuse, groups.
        {64, 8, 101, {16, 2, 4, 8}, 0}, {128, 4, 300, {32, 2, 16, 32}, 3}, {256, 1, 257, {24, 4, 4, 16}, 0},
        {128, 3, 513, {64, 2, 16, 64}, 7}, {256, 4, 400, {48, 3, 5, 20}, 2},
        // One mask per kv head (the group's max): G = 1 equals per head; G up to 2048 / d rows.
        {64, 8, 101, {16, 2, 4, 8, true}, 0}, {128, 3, 513, {64, 2, 16, 64, true}, 7},
        {256, 8, 400, {48, 3, 5, 20, true}, 2}, {64, 1, 300, {32, 2, 16, 32, true}, 3},
    };
    for (const Hip& x : hip) {
      AttnShape s{x.d, x.G, x.S + x.reuse, dtype, 16, true, true};
      T.hip(s, HipOp{x.p, x.reuse, 20});
      T.next_shape();
    }
    struct Swa {
      int32_t d, G, S;
      float ratio;
    };
    const Swa swa[] = {{64, 3, 1, 0.5f},    {64, 3, 37, 0.25f}, {128, 4, 300, 0.125f},
                       {256, 1, 129, 1.0f}, {80, 8, 200, 0.3f}, {64, 1, 700, 0.125f}};
    for (const Swa& x : swa) {
      AttnShape s{x.d, x.G, x.S, dtype, 16, true, true};
      T.swa(s, SwaOp{x.ratio, false, true, 24});
      T.next_shape();
    }
  }

  // ---- bifurcated attention: head dim 64/128/256, GQA group 1/3/4/8, f32/f16/INT8 KV, b = 1, 2,
  // 5, 16 sequences, shared prefixes of 1, 15, 16, 17, 300 tokens (inside, at and across block
  // edges, several chunks), own suffixes of 0..40 tokens (0: the query is the last shared token),
  // the Kᵀ plane except for prefixes 15 and 17 (the row kernels). The emulator (an emulated block
  // of many rows costs ~0.5 s) takes the prefixes of 1 and 17 tokens (inside a block, across one:
  // copy-on-write blocks) for 2 and 5 sequences at d 64, group 3.
  const auto dtype_name = [](KvDtype t) { return std::string(kv_dtype_name(t)); };
  {
    std::mt19937 rng(2024);
    std::uniform_int_distribution<int32_t> suffix_len(0, 40);
    for (int32_t d : {64, 128, 256})
      for (int32_t G : {1, 3, 4, 8})
        for (KvDtype dtype : kDtypes)
          for (int32_t b : {1, 2, 5, 16})
            for (int32_t prefix : {1, 15, 16, 17, 300}) {
              std::vector<int32_t> members(b), suffix(b);
              for (int32_t i = 0; i < b; ++i) {
                members[i] = i;
                suffix[i] = suffix_len(rng);
              }
              suffix[0] = 0;
              if (b > 1) suffix[b - 1] = 40;
              BifShape s;
              s.name = "prefix" + std::to_string(prefix) + "_b" + std::to_string(b) + "_d" + std::to_string(d) + "_g" +
                       std::to_string(G) + "_" + dtype_name(dtype);
              s.d = d, s.G = G, s.dtype = dtype, s.specs = {{0, prefix, members}}, s.suffix = suffix;
              s.k_t = prefix != 15 && prefix != 17;
              s.emulated = (prefix == 1 || prefix == 17) && (b == 2 || b == 5) && G == 3 && d == 64;
              T.bifurcated(s);
            }
  }
  // Soft-capped logits (b = 2) and attention sinks (b = 16, the many-rows kernels too).
  for (int32_t d : {64, 256})
    for (int32_t G : {1, 4})
      for (KvDtype dtype : kDtypes)
        for (int32_t b : {2, 16})
          for (int32_t prefix : {17, 300}) {
            std::vector<int32_t> members(b);
            std::iota(members.begin(), members.end(), 0);
            BifShape s;
            s.name = std::string(b == 2 ? "softcap" : "sinks") + "_prefix" + std::to_string(prefix) + "_b" +
                     std::to_string(b) + "_d" + std::to_string(d) + "_g" + std::to_string(G) + "_" + dtype_name(dtype);
            s.d = d, s.G = G, s.dtype = dtype, s.specs = {{0, prefix, members}}, s.suffix = std::vector<int32_t>(b, 9);
            s.k_t = prefix != 17;
            if (b == 2) {
              s.softcap = 1.0f;
            } else {
              s.sinks = true;
            }
            s.emulated = d == 64 && G == 4 && prefix == 17;
            T.bifurcated(s);
          }
  // Nested prefixes: a system prompt [0, 37) shared by all 6; document A [37, 300) by {0, 2, 4};
  // document B [37, 90) by {1, 3}, then B' [90, 333) by {3} alone; sequence 5 has only the system
  // prompt; listed out of position order. And two independent groups plus a sequence that shares
  // nothing, in one call.
  for (int32_t d : {64, 128})
    for (int32_t G : {1, 3, 8})
      for (KvDtype dtype : kDtypes) {
        BifShape s;
        s.d = d, s.G = G, s.dtype = dtype;
        s.name = "nested_d" + std::to_string(d) + "_g" + std::to_string(G) + "_" + dtype_name(dtype);
        s.specs = {{37, 300, {0, 2, 4}}, {90, 333, {3}}, {0, 37, {0, 1, 2, 3, 4, 5}}, {37, 90, {1, 3}}};
        s.suffix = {5, 0, 17, 40, 1, 23};
        s.emulated = G == 3 && d == 64;
        T.bifurcated(s);
        s.name = "twogroups_d" + std::to_string(d) + "_g" + std::to_string(G) + "_" + dtype_name(dtype);
        s.specs = {{0, 520, {0, 1, 2}}, {0, 64, {3, 4}}};
        s.suffix = {3, 16, 0, 9, 31, 70};
        T.bifurcated(s);
      }
  // Blocks of 32 and 48 tokens: a 48-token block makes split-K chunks of 288 keys, so the AMX
  // kernel's calls span two 256-key pieces (the online rescale between them); 48 rows (b = 16,
  // G = 3) is past the dispatcher's AMX threshold.
  for (int32_t bs : {32, 48})
    for (int32_t d : {64, 128})
      for (KvDtype dtype : kDtypes) {
        std::vector<int32_t> members(16), suffix(16);
        for (int32_t i = 0; i < 16; ++i) members[i] = i, suffix[i] = (i * 7) % 41;
        BifShape s;
        s.name = "bs" + std::to_string(bs) + "_prefix700_b16_d" + std::to_string(d) + "_g3_" + dtype_name(dtype);
        s.d = d, s.G = 3, s.dtype = dtype, s.specs = {{0, 700, members}}, s.suffix = suffix, s.bs = bs;
        s.emulated = bs == 48 && d == 64 && dtype == KvDtype::kI8;
        T.bifurcated(s);
      }
  // The CUDA launch shapes (chunks of 40 keys): block-aligned prefixes and nested segments, a
  // suffix of 1 token, b·G = 64 rows (one row tile for d <= 128 reads the prefix once; d 256: two
  // tiles), no shared segment at all, soft caps, sinks.
  {
    struct Launch {
      int32_t d, G, b, prefix_blocks, nested_blocks, nested_members;
      std::vector<int32_t> suffix;  // tokens after the shared blocks
      float softcap = 0.0f;
      bool sinks = false;
    };
    const std::vector<Launch> launches = {
        {64, 1, 2, 1, 0, 0, {1, 7}},
        {128, 4, 3, 2, 0, 0, {16, 1, 83}},
        {128, 4, 16, 3, 1, 5, std::vector<int32_t>(16, 5)},
        {256, 8, 5, 2, 2, 3, {3, 17, 1, 40, 9}},
        {64, 3, 4, 4, 2, 2, {1, 2, 33, 16}},
        {256, 1, 3, 0, 0, 0, {20, 1, 9}},
        {128, 4, 3, 2, 1, 2, {16, 1, 83}, 1.0f},
        {64, 3, 4, 4, 2, 2, {1, 2, 33, 16}, 0.0f, true},
    };
    for (KvDtype dtype : kDtypes)
      for (size_t i = 0; i < launches.size(); ++i) {
        const Launch& x = launches[i];
        const int32_t prefix_end = 16 * x.prefix_blocks, nested_end = 16 * (x.prefix_blocks + x.nested_blocks);
        const bool nested = x.nested_blocks > 0 && x.nested_members > 1;
        BifShape s;
        s.name = "launch" + std::to_string(i) + "_b" + std::to_string(x.b) + "_d" + std::to_string(x.d) + "_g" +
                 std::to_string(x.G) + "_" + dtype_name(dtype);
        s.d = x.d, s.G = x.G, s.dtype = dtype, s.softcap = x.softcap, s.sinks = x.sinks, s.keys_per_split = 40;
        std::vector<int32_t> all(x.b), members(std::max(0, x.nested_members));
        std::iota(all.begin(), all.end(), 0);
        std::iota(members.begin(), members.end(), 0);
        if (x.prefix_blocks > 0) s.specs.push_back({0, prefix_end, all});
        if (nested) s.specs.push_back({prefix_end, nested_end, members});
        for (int32_t j = 0; j < x.b; ++j)
          s.suffix.push_back(nested_end + x.suffix[j] - (nested && j < x.nested_members ? nested_end : prefix_end));
        T.bifurcated(s);
      }
  }

  // ---- SWA's mass on the device: lengths around the CTA's width, radii from 0 (no pooling) past
  // the length; exact (comparisons, one multiply and one add per position).
  for (int32_t n : {1, 2, 7, 255, 256, 257, 1000, 4099})
    for (int32_t radius : {0, 1, 3, 16, 600, 1 << 30})
      for (float ratio : {0.125f, 0.5f, 1.0f}) {
        const MassShape m{n, radius, ratio};
        T.add("swa_select", m.name(), {}, {},
              [m](const Case& c, const Backend& b, const Tol& t) { run_swa_select(c, m, b, t); },
              [](const Backend& b) { return b.family == Family::kCuda || is_cpu_level(b); });
        // The host fold is engine code (engine/attention), not a kernel: the device's only.
        T.add("swa_fold", m.name(), {}, {},
              [m](const Case& c, const Backend& b, const Tol& t) { run_swa_fold(c, m, b, t); },
              [](const Backend& b) { return b.family == Family::kCuda; });
        T.next_shape();
      }

  // ---- the CPU's sparse building blocks (the CUDA kernels' equivalents are inside their launches).
  const auto cpu_only = [](const Backend& b) { return is_cpu_level(b); };
  for (int32_t n : {1, 5, 100, 2047, 5000, 16384, 65536})
    for (int kind = 0; kind < 7; ++kind) {
      T.add("top_k", "n" + std::to_string(n) + "_kind" + std::to_string(kind), {}, {},
            [n, kind](const Case& c, const Backend& b, const Tol& t) { run_top_k(c, n, kind, b, t); }, cpu_only);
      T.next_shape();
    }
  for (int32_t m : {1, 2, 15, 16, 17, 100, 513})
    for (int kind = 0; kind < 3; ++kind) {
      T.add("kth_largest_key", "m" + std::to_string(m) + "_kind" + std::to_string(kind), {}, {},
            [m, kind](const Case& c, const Backend& b, const Tol& t) { run_kth_largest(c, m, kind, b, t); }, cpu_only);
      T.next_shape();
    }
  // f32 sums in any order vs double: 1e-5·(1 + |dot|).
  for (int32_t bs : {16, 32, 64})
    for (KvDtype dtype : {KvDtype::kF32, KvDtype::kF16})
      for (int32_t G : {1, 3, 8})
        for (int32_t S : {16, 47, 80, 1000}) {
          T.add("sparq_scores",
                "bs" + std::to_string(bs) + "_" + kv_dtype_name(dtype) + "_g" + std::to_string(G) + "_s" + std::to_string(S),
                Tol{1e-5, 1e-5}, {},
                [=](const Case& c, const Backend& b, const Tol& t) { run_sparq_scores(c, bs, dtype, G, S, b, t); },
                cpu_only);
          T.next_shape();
        }
  // ---- row and element-wise ops (the CPU's at every level: its SIMD variants are AVX-512's) -----
  const auto cpu_and_cuda = [](const Backend& b) { return b.family == Family::kCuda || is_cpu_level(b); };
  const auto cuda_only = [](const Backend& b) { return b.family == Family::kCuda; };
  // rms_norm vs the formula in double: atol 1e-6, rtol 2e-6 (f32 sum of squares and products).
  for (const NormShape sh : {NormShape{1, 1}, NormShape{3, 7}, NormShape{2, 31}, NormShape{5, 83}, NormShape{4, 255},
                             NormShape{3, 256}, NormShape{2, 257}, NormShape{7, 769}, NormShape{2, 2048},
                             NormShape{1, 5125}, NormShape{3, 100, true}}) {
    T.add("rms_norm", "rows" + std::to_string(sh.rows) + "_n" + std::to_string(sh.n) + (sh.in_place ? "_inplace" : ""),
          Tol{1e-6, 2e-6}, Tol{1e-6, 2e-6},
          [sh](const Case& c, const Backend& b, const Tol& t) { run_rms_norm(c, sh, b, t); }, cpu_and_cuda);
    T.next_shape();
  }
  // Gated activations vs the formulas in double over N(0, 3) inputs: atol 1e-6, rtol 1e-6 (the
  // same f32 formula; expf / tanhf ulps), plus for GeGLU 1.2e-7·|g·u| (aux: 1 + tanh(y) near −1
  // cancels in f32). (test_ops holds the CPU to 4e-7·|want| over inputs up to 200.)
  for (const GluKind kind : {GluKind::kSwiGlu, GluKind::kGeGluTanh, GluKind::kSwiGluOai}) {
    for (const int64_t n : {1, 3, 7, 83, 769, 5125, 100003})
      for (const int64_t offset : {0, 1}) {
        const GluShape sh{kind, n, offset};
        T.add("glu", std::string(glu_name(kind)) + "_n" + std::to_string(n) + "_offset" + std::to_string(offset),
              Tol{1e-6, 1e-6, 1.2e-7}, Tol{1e-6, 1e-6, 1.2e-7},
              [sh](const Case& c, const Backend& b, const Tol& t) { run_glu(c, sh, b, t); }, cpu_and_cuda);
        T.next_shape();
      }
  }
  {
    const GluShape sh{GluKind::kSwiGlu, 1000, 0, true};
    T.add("glu", "swiglu_n1000_inplace", Tol{1e-6, 1e-6}, Tol{1e-6, 1e-6},
          [sh](const Case& c, const Backend& b, const Tol& t) { run_glu(c, sh, b, t); }, cpu_and_cuda);
    T.next_shape();
  }
  // RoPE, adjacent pairs and NeoX halves, partial rotary dims, padded token strides, vs the rotation
  // in double with the same f32 cos / sin table: atol 1e-6, rtol 1e-6 (f32 products and sums).
  for (const bool neox : {false, true})
    for (const RopeShape sh : {RopeShape{1, 1, 2, 2, 0}, RopeShape{3, 5, 64, 64, 0}, RopeShape{7, 3, 128, 32, 0},
                               RopeShape{5, 4, 80, 80, 17}, RopeShape{9, 2, 256, 128, 3}, RopeShape{2, 7, 96, 94, 0}}) {
      RopeShape x = sh;
      x.neox = neox;
      T.add("rope", std::string(neox ? "neox" : "norm") + "_t" + std::to_string(x.n_tokens) + "_h" +
                        std::to_string(x.n_heads) + "_d" + std::to_string(x.head_dim) + "_r" + std::to_string(x.rope_dim) +
                        "_pad" + std::to_string(x.extra_stride),
            Tol{1e-6, 1e-6}, Tol{1e-6, 1e-6}, [x](const Case& c, const Backend& b, const Tol& t) { run_rope(c, x, b, t); },
            cpu_and_cuda);
      T.next_shape();
    }
  // Embedding rows of every weight type: exact (the same decode; the scale's product rounded as
  // the reference's). A device may contract a decode's d·q + m into one FMA: 1e-6 + 1e-6·|ref|,
  // times the scale.
  for (const GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::IQ4_NL,
                              GgmlType::MXFP4, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q6_K,
                              GgmlType::IQ4_XS}) {
    const int64_t block = ggml_info(type).block_size;
    for (const int64_t dim : {block, 3 * block, 9 * block + (block == 1 ? 7 : 0)})
      for (const float scale : std::set<float>{1.0f, std::sqrt(static_cast<float>(dim))}) {  // dim 1: one scale
        const EmbShape sh{type, dim, scale};
        Case& c = T.add("embedding", std::string(ggml_type_name(type)) + "_dim" + std::to_string(dim) +
                                         (scale == 1.0f ? "_unscaled" : "_scaled"),
                        Tol{}, Tol{}, [sh](const Case& c, const Backend& b, const Tol& t) { run_embedding(c, sh, b, t); },
                        [type](const Backend& b) { return b.family == Family::kCuda || (is_cpu_level(b) && cpu::matmul_supports(type)); });
        c.device = Tol{1e-6, 1e-6};
        T.next_shape();
      }
  }

  // ---- matmul per weight type (y [n_x][n_out] = x · Wᵀ) vs double over the ref-dequantized rows,
  // bound atol + sum·Σ|w·x|: CUDA 1e-6 + 2.5e-7·Σ (f32 products and per-lane sums, then a 32-lane
  // tree); CPU 1e-5·Σ (f32 rounding in products and sums, test_matmul's bound); the CPU's 8-bit
  // activations (matmul_q8) 1.001·B + 1e-5·Σ, B = Σ over 32-blocks of (max|x_b| / 127) / 2 · Σ|W_b|
  // (each activation moved by at most half its block's step; the integer dots exact). The CUDA
  // GEMV reads the quantized types; dense weights go through gemm (below). The row counts cycle
  // through 1..4 (the one-row kernel) and 5..64 (the many-row one: last groups of 1, 2, 3 and 4
  // rows, the most rows a launch takes); 9 counts over 16 shapes a type, so the counts meet
  // different k and n_out in each type.
  {
    int32_t case_index = 0;
    const std::set<GgmlType> gemv_types = {GgmlType::Q8_0, GgmlType::IQ4_NL, GgmlType::MXFP4, GgmlType::Q2_K,
                                           GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::IQ4_XS};
    for (const GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::IQ4_NL,
                                GgmlType::MXFP4, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q6_K,
                                GgmlType::IQ4_XS}) {
      const int64_t block = std::max<int64_t>(32, ggml_info(type).block_size);
      for (const int64_t k : {block, 3 * block, 9 * block, (block == 32 ? 129 : 17) * block})
        for (const int64_t n_out : {1, 7, 33, 130}) {
          constexpr int32_t kRowCounts[] = {1, 2, 3, 4, 5, 8, 14, 19, 64};
          const int32_t n_x = kRowCounts[case_index++ % 9];
          const std::string name = std::string(ggml_type_name(type)) + "_k" + std::to_string(k) + "_n" +
                                   std::to_string(n_out) + "_x" + std::to_string(n_x);
          const MatShape sh{type, k, n_out, n_x};
          const bool on_cuda = gemv_types.count(type) > 0;
          T.add("matmul", name, Tol{0, 0, 0, {}, 1e-5}, Tol{1e-6, 0, 0, {}, 2.5e-7},
                [sh](const Case& c, const Backend& b, const Tol& t) { run_matmul(c, sh, b, t); },
                [type, on_cuda](const Backend& b) {
                  return b.family == Family::kCuda ? on_cuda : is_cpu_level(b) && cpu::matmul_supports(type);
                });
          MatShape q8 = sh;
          q8.q8 = true;
          T.add("matmul_q8", name, Tol{0, 0, 0, {}, 1e-5, 1.001}, {},
                [q8](const Case& c, const Backend& b, const Tol& t) { run_matmul(c, q8, b, t); },
                [type](const Backend& b) { return is_cpu_level(b) && cpu::matmul_supports(type); });
          T.next_shape();
        }
    }
  }
  // gemm with f16 / bf16 inputs (the CUDA backend's dense weights) vs double over the same rounded
  // inputs: 1e-6 + 1e-6·Σ|a·b| (f32 accumulation, k in order); on a device cuBLAS may split k or
  // sum in any order: 1e-6 + 1e-5·Σ|a·b| ((k − 1)·2^-24 ≈ 7.6e-6 at k = 129). Padded leading
  // dimensions; nothing written past n.
  for (const bool bf16 : {false, true})
    for (const bool tiled : {false, true})
      for (const GemmShape g : {GemmShape{false, false, 1, 1, 1, 0}, GemmShape{false, false, 7, 13, 5, 0},
                                GemmShape{false, false, 33, 65, 17, 3}, GemmShape{false, false, 70, 19, 129, 0},
                                GemmShape{false, false, 3, 300, 64, 1}, GemmShape{false, false, 64, 64, 64, 0},
                                GemmShape{false, false, 5, 7, 0, 0}}) {
        GemmShape sh = g;
        sh.bf16 = bf16;
        sh.tiled = tiled;
        Case& c = T.add("gemm", std::string(bf16 ? "bf16" : "f16") + (tiled ? "_tiled" : "_handle") + "_m" +
                                    std::to_string(sh.m) + "_n" + std::to_string(sh.n) + "_k" + std::to_string(sh.k) +
                                    "_pad" + std::to_string(sh.pad),
                        {}, Tol{1e-6, 0, 0, {}, 1e-6},
                        [sh](const Case& c, const Backend& b, const Tol& t) { run_gemm(c, sh, b, t); }, cuda_only);
        c.device = Tol{1e-6, 0, 0, {}, 1e-5};
        T.next_shape();
      }

  // ---- sampling (the device's top-k / top-p draw; the host's Sampler is engine code with its own
  // tests): the token equals the reference's exactly (the same 32.32 fixed-point weights). On a
  // device expf may differ from the host's by an ulp, which moves a weight by ~2^-24 of itself:
  // there the token may also be the reference's draw at u ± 1e-6 (aux).
  const auto sampling = [&](const std::string& name, SampleSet set, int32_t vocab) {
    Case& c = T.add("sampling", name, {}, {},
                    [set, vocab](const Case& c, const Backend& b, const Tol& t) { run_sampling(c, set, vocab, b, t); },
                    cuda_only);
    c.device.aux = 1e-6;
    T.next_shape();
  };
  for (const int32_t vocab : {1, 2, 7, 100, 1000, 5003}) sampling("mixed_v" + std::to_string(vocab), SampleSet::kMixed, vocab);
  sampling("gemma_v262144", SampleSet::kGemmaVocab, 262144);
  sampling("nucleus_frequencies_v6", SampleSet::kNucleusFrequencies, 6);

  // ---- KV append (the CPU's row stores are the reference's own definition): every plane bitwise
  // the host's one-token-at-a-time appends, the running journal, a rollback. On a device nvcc may
  // contract the K moments' M2 update into an FMA (kernels/paged_kv.h): there the moments (and the
  // journal that holds them) within 1e-6 + 1e-5·|ref|.
  for (const KvStore t : {KvStore::kF32, KvStore::kF16, KvStore::kBF16, KvStore::kI8}) {
    const std::vector<KvAppendShape> shapes = {
        {t, 64, 2, 16, {{0, 1}}},
        {t, 7, 3, 16, {{5, 37}, {16, 1}, {0, 5}, {31, 2}}},
        {t, 128, 2, 32, {{40, 90}, {0, 33}}},
        {t, 257, 1, 8, {{3, 21}, {8, 8}}},
        {t, 80, 4, 16, {{15, 1}, {47, 1}, {1, 1}}},  // a decode step of three sequences
    };
    for (const KvAppendShape& sh : shapes) {
      std::string name = std::string(kv_store_name(t)) + "_d" + std::to_string(sh.d) + "_h" +
                         std::to_string(sh.n_kv_heads) + "_bs" + std::to_string(sh.bs);
      for (const auto& [prefix, n_new] : sh.seqs) name += "_" + std::to_string(prefix) + "p" + std::to_string(n_new);
      Case& c = T.add("kv_append", name, {}, {},
                      [sh](const Case& c, const Backend& b, const Tol& tl) { run_kv_append(c, sh, b, tl); }, cuda_only);
      c.device = Tol{1e-6, 1e-5};
      T.next_shape();
    }
  }
  return T.cases;
}

const std::vector<Case>& table() {
  static const std::vector<Case> cases = build_table();
  return cases;
}

// ============================================================================================
// gtest
// ============================================================================================

struct Param {
  const Case* c;
  const Backend* b;
};

std::vector<Param> all_params() {
  std::vector<Param> out;
  for (const Case& c : table())
    for (const Backend& b : backends().present)
      if (!c.runs_on || c.runs_on(b)) out.push_back({&c, &b});
  return out;
}

void PrintTo(const Param& p, std::ostream* os) { *os << p.c->op << " " << p.c->shape << " on " << p.b->name; }

std::string test_name(const Param& p) {
  std::string n = p.c->op + "_" + p.c->shape + "_" + p.b->name;
  for (char& ch : n)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

class BackendOps : public ::testing::TestWithParam<Param> {};

// A CPU backend's run capped at its level; the widest level again afterwards, whatever happened.
struct LevelScope {
  explicit LevelScope(const Backend& b) : cpu(b.family == Family::kCpu) {
    if (cpu) ok = cpu::set_simd_level_for_testing(b.level);
  }
  ~LevelScope() {
    if (cpu) cpu::set_simd_level_for_testing(best_level());
  }
  bool cpu, ok = true;
};

TEST_P(BackendOps, MatchesReference) {
  const Case& c = *GetParam().c;
  const Backend& b = *GetParam().b;
  const LevelScope level(b);
  ASSERT_TRUE(level.ok) << b.level;
  c.run(c, b, c.tol(b));
}

INSTANTIATE_TEST_SUITE_P(Grid, BackendOps, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Param>& info) { return test_name(info.param); });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BackendOps);

// Which backends ran, which did not and why, and the table's size.
TEST(BackendOpsGrid, Backends) {
  const Backends& b = backends();
  std::printf("backends: reference (ground truth)");
  for (const Backend& x : b.present) std::printf(", %s", x.name.c_str());
  std::printf("\n");
  for (const std::string& why : b.absent) std::printf("absent: %s\n", why.c_str());
  std::map<std::string, std::map<std::string, int>> tests;  // op -> backend -> tests
  std::map<std::string, int> cases;
  for (const Case& c : table()) ++cases[c.op];
  for (const Param& p : all_params()) ++tests[p.c->op][p.b->name];
  for (const auto& [op, n] : cases) {
    std::printf("  %-16s %5d cases:", op.c_str(), n);
    for (const auto& [backend, k] : tests[op]) std::printf(" %s %d", backend.c_str(), k);
    std::printf("\n");
  }
  std::printf("%zu cases of %zu ops, %zu tests\n", table().size(), cases.size(), all_params().size());
  if (b.present.empty()) GTEST_SKIP() << b.cuda.name << ": " << b.cuda.detail;
}

}  // namespace
}  // namespace fathom::grid
