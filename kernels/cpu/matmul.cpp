// matmul driver: SIMD level selection, activation preparation and threading over N.
// The kernels themselves live in matmul_portable.cpp and matmul_*_{avx2,avx512}.cpp.
//
// Paths (y[M][N] = x[M][K] . W[N][K]^T):
//   kF32 (and float weights), dot kernels: stream each W row once and reuse it in registers
//     for kMaxMr activation rows, M > kMaxMr in sub-chunks of W rows that stay in L1 across
//     the M loop. Formats with a min or an offset (Q4_0/1, Q5_0/1) use per-32 block sums of x
//     so that term costs one multiply per block. Every M on AVX2 and portable; M <= kDotMaxRows
//     on AVX-512.
//   kF32, M > kDotMaxRows on AVX-512: per thread, a tile of kTileN W rows x kTileK columns is
//     dequantized once into an f32 buffer (L1-resident) and multiplied with all M rows. On
//     AVX2 the dot kernels beat it (EPYC, 2 threads, bench_decode on SmolLM2): F16 weights at
//     batch 5 / 16 decode 196 / 250 tok/s against 77 / 117, prefill (M = 512) 309 against 202;
//     F32 weights prefill 267 against 220, Q4_1 at f32 259 against 206.
//   kQ8: x rows are quantized to 8-bit blocks once per call; dot kernels use integer dots.
//     Over PackedWeights panels, AVX-512 with AMX-INT8 (matmul_packed_amx.cpp) runs Q4_K, Q6_K and
//     Q8_0 calls of 5-16 rows on tiles, bitwise what the VNNI kernels give each row.
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "kernels/cpu/amx.h"
#include "kernels/cpu/matmul_kernels.h"

namespace fathom::cpu {
namespace detail {

int fmt_index(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return kF32;
    case GgmlType::F16: return kF16;
    case GgmlType::BF16: return kBF16;
    case GgmlType::Q4_0: return kQ4_0;
    case GgmlType::Q4_1: return kQ4_1;
    case GgmlType::Q5_0: return kQ5_0;
    case GgmlType::Q5_1: return kQ5_1;
    case GgmlType::Q8_0: return kQ8_0;
    case GgmlType::Q4_K: return kQ4_K;
    case GgmlType::Q5_K: return kQ5_K;
    case GgmlType::Q6_K: return kQ6_K;
    case GgmlType::Q2_K: return kQ2_K;
    case GgmlType::Q3_K: return kQ3_K;
    case GgmlType::IQ4_NL: return kIQ4_NL;
    case GgmlType::IQ4_XS: return kIQ4_XS;
    case GgmlType::MXFP4: return kMXFP4;
    default: return -1;
  }
}

const KernelTable& avx2_kernels() {
  static const KernelTable t = [] {
    KernelTable k;
    register_avx2_dequant(k);
    register_avx2_dot_f32(k);
    register_avx2_dot_q8(k);
    register_avx2_gemm(k);
    register_avx2_dot_packed(k);
    return k;
  }();
  return t;
}

const KernelTable& avx512_kernels() {
  static const KernelTable t = [] {
    KernelTable k;
    register_avx512_dequant(k);
    register_avx512_dot_f32(k);
    register_avx512_dot_q8(k);
    register_avx512_gemm(k);
    register_avx512_dot_packed(k);
    return k;
  }();
  return t;
}

// The AVX-512 table with the AMX-INT8 packed kernels over it (only built where they may run).
const KernelTable& avx512_amx_kernels() {
  static const KernelTable t = [] {
    KernelTable k = avx512_kernels();
    register_amx_dot_packed(k);
    return k;
  }();
  return t;
}

}  // namespace detail

namespace {

using namespace detail;

enum class Level { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

constexpr int64_t kTileN = 32;   // W rows per dequantized GEMM tile (one AVX-512 panel)
constexpr int64_t kTileK = 256;  // columns per tile (multiple of every block size)
constexpr int kMaxGroup = 8;     // targets of one matmul_group

Level cpu_level() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return Level::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return Level::kAvx2;
#endif
  return Level::kPortable;
}

bool parse_level(const char* s, Level* out) {
  const std::string v = s ? s : "";
  if (v == "portable") *out = Level::kPortable;
  else if (v == "avx2") *out = Level::kAvx2;
  else if (v == "avx512") *out = Level::kAvx512;
  else return false;
  return true;
}

Level& active_level() {
  static Level level = [] {
    Level l = cpu_level(), cap;
    if (parse_level(std::getenv("FATHOM_SIMD"), &cap) && cap < l) l = cap;
    return l;
  }();
  return level;
}

// Whether the AVX-512 level runs the AMX packed kernels: the CPU and OS allow them, FATHOM_AMX=0
// is not set, and set_amx_matmul_for_testing has not turned them off.
bool& amx_matmul_on() {
  static bool on = [] {
    const char* env = std::getenv("FATHOM_AMX");
    return !(env && std::string(env) == "0") && amx_int8_usable();
  }();
  return on;
}

const KernelTable& table_for(Level l) {
  switch (l) {
    case Level::kAvx512: return amx_matmul_on() ? avx512_amx_kernels() : avx512_kernels();
    case Level::kAvx2: return avx2_kernels();
    case Level::kPortable: return portable_kernels();
  }
  return portable_kernels();
}

DequantFn dequant_fn(int f) {
  const DequantFn fn = table_for(active_level()).dequant[f];
  return fn ? fn : portable_kernels().dequant[f];
}
DotFn dot_f32_fn(int f) {
  const DotFn fn = table_for(active_level()).dot_f32[f];
  return fn ? fn : portable_kernels().dot_f32[f];
}
DotFn dot_q8_fn(int f) {
  const DotFn fn = table_for(active_level()).dot_q8[f];
  return fn ? fn : portable_kernels().dot_q8[f];
}
}  // namespace

namespace detail {
DotFn dot_packed_fn(int f) { return table_for(active_level()).dot_packed[f]; }
}  // namespace detail

namespace {

// set_packed_rows_per_call_for_testing's setting (0: the table's own).
int& packed_rows_override() {
  static int rows = 0;
  return rows;
}

// set_packed_prefetch_bytes_for_testing's setting (0: the kernels' own).
int64_t& packed_prefetch_override() {
  static int64_t bytes = 0;
  return bytes;
}

// Activation rows per packed-kernel call of format f at the active level.
int packed_max_mr(int f) {
  const KernelTable& t = table_for(active_level());
  const int most = t.packed_max_mr_of[f] > 0 ? t.packed_max_mr_of[f] : t.packed_max_mr;
  const int over = packed_rows_override();
  return over > 0 ? std::min(over, most) : most;
}

// Whether the packed kernels at the active level read block-major activations (DotArgs::ldqb).
bool packed_block_major() { return table_for(active_level()).packed_block_major; }

// Whether dot_q8_fn(f) reads the nibble-split activations (DotArgs::xs).
bool q8_split(int f) {
  const KernelTable& t = table_for(active_level());
  return t.dot_q8[f] != nullptr && t.q8_split[f];
}
QuantizeQ8Fn quantize_fn() {
  const QuantizeQ8Fn fn = table_for(active_level()).quantize_q8;
  return fn ? fn : portable_kernels().quantize_q8;
}
GemmF32Fn gemm_fn() {
  const GemmF32Fn fn = table_for(active_level()).gemm_f32;
  return fn ? fn : portable_kernels().gemm_f32;
}

// kF32 dot kernels of formats with a min or an offset use per-32-block sums of x.
bool needs_bsum(int f) { return f == kQ4_0 || f == kQ4_1 || f == kQ5_0 || f == kQ5_1 || f == kQ4_K || f == kQ5_K; }
bool is_float(int f) { return f == kF32 || f == kF16 || f == kBF16; }

// Grows a per-thread scratch buffer; contents are not preserved.
template <typename T>
T* scratch(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

// Hands [0, N) out in contiguous chunks of `chunk` rows (ThreadPool::for_each_chunk): a thread
// that starts late (the cores are shared, or it was asleep) simply takes fewer chunks instead
// of holding everyone up with a fixed half of the rows.
template <typename Fn>
void parallel_chunks(ThreadPool& pool, int64_t N, int64_t chunk, const Fn& fn) {
  pool.for_each_chunk((N + chunk - 1) / chunk, [&](int64_t c, int) { fn(c * chunk, std::min(N, (c + 1) * chunk)); });
}

// Rows per work chunk: ~32 KB of weights (several chunks per thread for balance), a multiple
// of 16 rows so that threads write whole cache lines of y.
int64_t rows_per_chunk(size_t row_bytes) {
  const int64_t rows = static_cast<int64_t>(32768 / std::max<size_t>(row_bytes, 1));
  return std::max<int64_t>(16, rows / 16 * 16);
}

// One matrix of a (grouped) dot call: `fn` over its N rows, its rows handed out in chunks.
struct DotJob {
  DotFn fn;
  DotArgs base;  // w, row_bytes, K, y, ldy and the activations
  int64_t N;
  int64_t chunk;  // rows per chunk
  int max_mr = kMaxMr;  // activation rows per fn call
};

// Rows up to which every SIMD level runs float-path matmuls through the dot kernels.
constexpr int64_t kDotMaxRows = 32;

// Rows [n0, n1) of one job for all M activation rows, j.max_mr activation rows per call. For
// M > j.max_mr the rows are visited in sub-chunks small enough to stay in L1 across the M loop.
void run_rows(const DotJob& j, int64_t M, int64_t b, int64_t e) {
  const int64_t sub = M <= j.max_mr ? e - b : std::max<int64_t>(4, 8192 / static_cast<int64_t>(j.base.row_bytes));
  for (int64_t n0 = b; n0 < e; n0 += sub) {
    const int64_t n1 = std::min(e, n0 + sub);
    for (int64_t m0 = 0; m0 < M; m0 += j.max_mr) {
      DotArgs a = j.base;
      a.mr = static_cast<int>(std::min<int64_t>(j.max_mr, M - m0));
      if (a.x) {
        a.x += m0 * a.ldx;
        if (a.bsum) a.bsum += m0 * a.ldb;
      }
      if (a.q) {
        a.q += m0 * a.ldq;
        a.qd += m0 * a.ldqs;
        a.qsum += m0 * a.ldqs;
        a.qsum16 += m0 * 2 * a.ldqs;
        a.qds += m0 * a.ldqs;
        a.q16x32 += m0 * 2 * a.ldqs;
      }
      if (a.xs) a.xs += m0 * a.ldsg * 128;
      a.y += m0 * a.ldy;
      if (M > j.max_mr && m0 + j.max_mr >= M) a.prefetch_bytes = (n1 - n0) * static_cast<int64_t>(a.row_bytes);
      j.fn(a, n0, n1);
    }
  }
}

// Runs every job over all its rows; the chunks of all jobs form one first-come-first-served
// queue (one fork/join for the whole group). A row's result depends only on its job, never on
// which thread or chunk computed it.
void run_dots(ThreadPool& pool, const DotJob* jobs, int count, int64_t M) {
  int64_t total = 0;
  for (int i = 0; i < count; ++i) total += (jobs[i].N + jobs[i].chunk - 1) / jobs[i].chunk;
  auto run_chunk = [&](int64_t c, int) {
    int i = 0;
    for (int64_t n; c >= (n = (jobs[i].N + jobs[i].chunk - 1) / jobs[i].chunk); c -= n) ++i;
    const DotJob& j = jobs[i];
    run_rows(j, M, c * j.chunk, std::min(j.N, (c + 1) * j.chunk));
  };
  pool.for_each_chunk(total, run_chunk);
}

void run_dot(ThreadPool& pool, DotFn fn, const DotArgs& base, int64_t M, int64_t N) {
  const DotJob j{fn, base, N, rows_per_chunk(base.row_bytes)};
  run_dots(pool, &j, 1, M);
}

// The packed kernel for W when `packed` holds it and this SIMD level reads it; else null.
DotFn packed_fn_for(GgmlType wtype, int64_t N, int64_t K, const PackedWeights* packed) {
  if (!packed) return nullptr;
  FATHOM_CHECK(packed->type() == wtype && packed->rows() == N && packed->cols() == K,
               "matmul: packed weights do not match the matrix");
  return dot_packed_fn(fmt_index(wtype));
}

// 8-bit activations of x [M][K] (Precision::kQ8), in per-thread scratch: valid until the
// calling thread's next matmul.
struct Q8Act {
  const int8_t* q;
  const float* qd;
  const int32_t* qsum;
  const int16_t* qsum16;
  int64_t nb;  // blocks per row
  const float* qds;  // qd · qsum per block
  const int32_t* q16x32;  // 32 · qsum16, indexed as qsum16
  // Nibble-split order (see DotArgs::xs), when a target's kernel reads it; else null.
  const int8_t* xs;
  int64_t ng;  // groups of 4 blocks per row
  int64_t ldq, ldqb, ldqs, ldsb;  // row and block strides, as DotArgs's
};

// DotArgs::xs of one activation row from its 8-bit blocks.
void split_row(const int8_t* q, int64_t nb, int8_t* xs) {
  std::memset(xs, 0, static_cast<size_t>((nb + 3) / 4 * 128));
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t g = b / 4, j = b % 4;
    std::memcpy(xs + g * 128 + 16 * j, q + b * 32, 16);
    std::memcpy(xs + g * 128 + 64 + 16 * j, q + b * 32 + 16, 16);
  }
}

// block_major (only without split): DotArgs's block-major layout, for packed kernels that read
// it; one row is the same either way.
Q8Act quantize_activations(ThreadPool& pool, const float* x, int64_t M, int64_t K, bool split, bool block_major) {
  FATHOM_CHECK(!(split && block_major), "matmul: nibble-split activations are row-major");
  static thread_local std::vector<int8_t> q_buf, xs_buf;
  static thread_local std::vector<float> qds_buf;
  static thread_local std::vector<float> d_buf;
  static thread_local std::vector<int32_t> s_buf;
  static thread_local std::vector<int16_t> s16_buf;
  static thread_local std::vector<int32_t> s16x32_buf;
  const int64_t nb = K / kActBlock;
  int8_t* q = scratch(q_buf, static_cast<size_t>(M * K));
  float* qd = scratch(d_buf, static_cast<size_t>(M * nb));
  int32_t* qs = scratch(s_buf, static_cast<size_t>(M * nb));
  int16_t* qs16 = scratch(s16_buf, static_cast<size_t>(M * nb * 2));
  const int64_t ng = (nb + 3) / 4;
  int8_t* xs = split ? scratch(xs_buf, static_cast<size_t>(M * ng * 128)) : nullptr;
  float* qds = scratch(qds_buf, static_cast<size_t>(M * nb));
  int32_t* q16x32 = scratch(s16x32_buf, static_cast<size_t>(M * nb * 2));
  const QuantizeQ8Fn quantize = quantize_fn();
  block_major = block_major && M > 1;
  auto quantize_rows = [&](int64_t b, int64_t e, int) {
    for (int64_t m = b; m < e; ++m) {
      if (!block_major) {
        quantize(x + m * K, K, q + m * K, qd + m * nb, qs + m * nb, qs16 + m * nb * 2);
        for (int64_t i = m * nb; i < (m + 1) * nb; ++i) qds[i] = qd[i] * static_cast<float>(qs[i]);
        for (int64_t i = 2 * m * nb; i < 2 * (m + 1) * nb; ++i) q16x32[i] = 32 * qs16[i];
        if (split) split_row(q + m * K, nb, xs + m * ng * 128);
        continue;
      }
      // The row quantized on its own, then each block put beside the other rows' (pool threads
      // each keep their own row scratch).
      static thread_local std::vector<int8_t> rq;
      static thread_local std::vector<float> rd;
      static thread_local std::vector<int32_t> rs;
      static thread_local std::vector<int16_t> rs16;
      int8_t* q1 = scratch(rq, static_cast<size_t>(K));
      float* d1 = scratch(rd, static_cast<size_t>(nb));
      int32_t* s1 = scratch(rs, static_cast<size_t>(nb));
      int16_t* s161 = scratch(rs16, static_cast<size_t>(nb * 2));
      quantize(x + m * K, K, q1, d1, s1, s161);
      for (int64_t i = 0; i < nb; ++i) {
        const int64_t at = i * M + m;
        std::memcpy(q + at * 32, q1 + i * 32, 32);
        qd[at] = d1[i];
        qs[at] = s1[i];
        qs16[2 * at] = s161[2 * i];
        qs16[2 * at + 1] = s161[2 * i + 1];
        qds[at] = d1[i] * static_cast<float>(s1[i]);
        q16x32[2 * at] = 32 * s161[2 * i];
        q16x32[2 * at + 1] = 32 * s161[2 * i + 1];
      }
    }
  };
  if (M >= 8) pool.parallel_for(M, quantize_rows);
  else quantize_rows(0, M, 0);
  if (block_major) return {q, qd, qs, qs16, nb, qds, q16x32, xs, ng, 32, 32 * M, 1, M};
  return {q, qd, qs, qs16, nb, qds, q16x32, xs, ng, K, 32, nb, 1};
}

DotArgs q8_args(const Q8Act& act, GgmlType wtype, const void* W, int64_t N, int64_t K, float* y) {
  DotArgs a;
  a.w = static_cast<const uint8_t*>(W);
  a.row_bytes = ggml_row_size(wtype, K);
  a.K = K;
  a.y = y;
  a.ldy = N;
  a.q = act.q;
  a.ldq = act.ldq;
  a.ldqb = act.ldqb;
  a.qd = act.qd;
  a.qsum = act.qsum;
  a.qsum16 = act.qsum16;
  a.ldqs = act.ldqs;
  a.ldsb = act.ldsb;
  a.xs = act.xs;
  a.qds = act.qds;
  a.q16x32 = act.q16x32;
  a.ldsg = act.ng;
  return a;
}

// Panels per work chunk of a packed matrix: ~32 KB, and at least 8 chunks per thread, so that the
// threads finish a matrix within a few microseconds of each other. A thread's own chunks are
// consecutive (ThreadPool::for_each_chunk), so a chunk start costs neither a shared atomic nor
// a cold hardware prefetcher (it did when chunks were handed out first come first served, and
// 128 KB chunks were then faster); 32 KB / 8 per thread decoded ~5% faster than 128 KB / 4.
// A batched call (M > kMaxMr rows) is compute-bound and pays a fixed cost per kernel call (AMX:
// the tile configuration, a first step whose unpacking nothing overlaps), so it takes ~128 KB:
// 1B batch-16 step 86.8, 87.5 → 84.0, 84.4 ms and its prefill +18% on the Xeon with AMX (512 KB:
// no better).
int64_t panels_per_chunk(int64_t panels, size_t panel_bytes, int threads, int64_t M) {
  const int64_t chunk_bytes = M > kMaxMr ? (int64_t{128} << 10) : (int64_t{32} << 10);
  const int64_t by_bytes = std::max<int64_t>(1, chunk_bytes / static_cast<int64_t>(panel_bytes));
  const int64_t by_balance = std::max<int64_t>(1, panels / (8 * static_cast<int64_t>(threads)));
  return std::min(by_bytes, by_balance);
}

// The kQ8 job of one matrix: over the panels of `packed` with packed_fn (packed_fn_for) when
// that is not null, else over the stored rows (chunks of ~32 KB).
DotJob q8_job(const Q8Act& act, GgmlType wtype, const void* W, int64_t N, int64_t K, int64_t M, float* y,
              const PackedWeights* packed, DotFn packed_fn, int threads) {
  DotArgs a = q8_args(act, wtype, W, N, K, y);
  if (packed_fn) {
    a.w = packed->data();
    a.row_bytes = packed->panel_bytes();
    a.rows_total = N;
    a.prefetch_bytes = packed_prefetch_override();
    return DotJob{packed_fn, a, packed->panels(), panels_per_chunk(packed->panels(), a.row_bytes, threads, M),
                  packed_max_mr(fmt_index(wtype))};
  }
  return DotJob{dot_q8_fn(fmt_index(wtype)), a, N, rows_per_chunk(a.row_bytes)};
}

void gemm_tiles(ThreadPool& pool, GgmlType wtype, const uint8_t* W, size_t row_bytes, int64_t N,
                int64_t K, const float* x, int64_t M, float* y) {
  const int f = fmt_index(wtype);
  const DequantFn dequant = dequant_fn(f);
  const GemmF32Fn gemm = gemm_fn();
  const int64_t block = ggml_info(wtype).block_size, block_bytes = ggml_info(wtype).type_size;
  parallel_chunks(pool, N, kTileN, [&](int64_t b, int64_t e) {
    static thread_local std::vector<float> tile_buf;
    float* tile = scratch(tile_buf, kTileN * kTileK);
    for (int64_t n0 = b; n0 < e; n0 += kTileN) {
      const int64_t nt = std::min(kTileN, e - n0);
      for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
        const int64_t kc = std::min(kTileK, K - k0);
        const float* w;
        int64_t ldw;
        if (f == kF32) {
          w = reinterpret_cast<const float*>(W + n0 * row_bytes) + k0;
          ldw = K;
        } else {
          const size_t off = static_cast<size_t>(k0 / block * block_bytes);
          for (int64_t r = 0; r < nt; ++r) dequant(W + (n0 + r) * row_bytes + off, tile + r * kTileK, kc);
          w = tile;
          ldw = kTileK;
        }
        gemm(x + k0, K, w, ldw, M, nt, kc, y + n0, N, k0 > 0);
      }
    }
  });
}

}  // namespace

bool matmul_supports(GgmlType wtype) { return fmt_index(wtype) >= 0; }

void matmul(ThreadPool& pool, GgmlType wtype, const void* W, int64_t N, int64_t K, const float* x,
            int64_t M, float* y, Precision precision, const PackedWeights* packed) {
  const int f = fmt_index(wtype);
  if (f < 0) throw Error(std::string("matmul: unsupported weight type ") + ggml_type_name(wtype));
  const int64_t bs = ggml_info(wtype).block_size;
  FATHOM_CHECK(K > 0 && K % bs == 0, "K must be a positive multiple of the block size");
  if (M <= 0 || N <= 0) return;
  const auto* w = static_cast<const uint8_t*>(W);
  const size_t row_bytes = ggml_row_size(wtype, K);

  DotArgs a;
  a.w = w;
  a.row_bytes = row_bytes;
  a.K = K;
  a.y = y;
  a.ldy = N;

  if (precision == Precision::kQ8 && !is_float(f)) {
    // K is a multiple of 32 for every quantized format.
    const DotFn packed_fn = packed_fn_for(wtype, N, K, packed);
    const Q8Act act = quantize_activations(pool, x, M, K, !packed_fn && q8_split(f), packed_fn && packed_block_major());
    const DotJob job = q8_job(act, wtype, W, N, K, M, y, packed, packed_fn, pool.size());
    run_dots(pool, &job, 1, M);
    return;
  }

  // The tile GEMM only for prefill-sized M on AVX-512, where it was chosen; on AVX2 the dot
  // kernels won at every M measured (EPYC, 2 threads, SmolLM2 F16 / F32 / Q4_1 at f32; see the
  // header). Up to kDotMaxRows rows every level takes the dot kernels, whose rows do not depend
  // on M: a verify step's rows and a batch's are bitwise a one-row step's.
  if (M > kDotMaxRows && active_level() == Level::kAvx512) {
    gemm_tiles(pool, wtype, w, row_bytes, N, K, x, M, y);
    return;
  }
  a.x = x;
  a.ldx = K;
  if (needs_bsum(f)) {
    static thread_local std::vector<float> bsum_buf;
    const int64_t nb = K / kActBlock;
    float* bsum = scratch(bsum_buf, static_cast<size_t>(M * nb));
    for (int64_t m = 0; m < M; ++m)
      for (int64_t i = 0; i < nb; ++i) {
        const float* xb = x + m * K + i * kActBlock;
        float s[8] = {};
        for (int j = 0; j < kActBlock; j += 8)
          for (int l = 0; l < 8; ++l) s[l] += xb[j + l];
        bsum[m * nb + i] = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
      }
    a.bsum = bsum;
    a.ldb = nb;
  }
  run_dot(pool, dot_f32_fn(f), a, M, N);
}

void matmul_group(ThreadPool& pool, const MatmulTarget* targets, int count, int64_t K, const float* x,
                  int64_t M, Precision precision) {
  FATHOM_CHECK(count >= 0 && count <= kMaxGroup, "matmul_group: too many targets");
  bool q8 = precision == Precision::kQ8;
  for (int i = 0; i < count; ++i) {
    const int f = fmt_index(targets[i].type);
    if (f < 0) throw Error(std::string("matmul: unsupported weight type ") + ggml_type_name(targets[i].type));
    FATHOM_CHECK(K > 0 && K % ggml_info(targets[i].type).block_size == 0,
                 "K must be a positive multiple of the block size");
    q8 = q8 && !is_float(f);
  }
  if (!q8) {
    for (int i = 0; i < count; ++i)
      matmul(pool, targets[i].type, targets[i].W, targets[i].N, K, x, M, targets[i].y, precision, targets[i].packed);
    return;
  }
  if (M <= 0) return;
  bool split = false, all_packed = true;
  DotFn packed_fns[kMaxGroup] = {};
  for (int i = 0; i < count; ++i) {
    const MatmulTarget& t = targets[i];
    if (t.N > 0) packed_fns[i] = packed_fn_for(t.type, t.N, K, t.packed);
    split = split || (!packed_fns[i] && q8_split(fmt_index(t.type)));
    all_packed = all_packed && (t.N <= 0 || packed_fns[i]);
  }
  const Q8Act act = quantize_activations(pool, x, M, K, split, all_packed && packed_block_major());
  DotJob jobs[kMaxGroup];
  int n = 0;
  for (int i = 0; i < count; ++i) {
    const MatmulTarget& t = targets[i];
    if (t.N > 0) jobs[n++] = q8_job(act, t.type, t.W, t.N, K, M, t.y, t.packed, packed_fns[i], pool.size());
  }
  run_dots(pool, jobs, n, M);
}

void dequantize_row(GgmlType wtype, const void* W, int64_t K, int64_t row, float* dst) {
  const int f = fmt_index(wtype);
  if (f < 0) throw Error(std::string("dequantize_row: unsupported weight type ") + ggml_type_name(wtype));
  FATHOM_CHECK(K % ggml_info(wtype).block_size == 0, "K must be a multiple of the block size");
  const auto* src = static_cast<const uint8_t*>(W) + static_cast<size_t>(row) * ggml_row_size(wtype, K);
  dequant_fn(f)(src, dst, K);
}

const char* simd_level() {
  switch (active_level()) {
    case Level::kAvx512: return "avx512";
    case Level::kAvx2: return "avx2";
    case Level::kPortable: return "portable";
  }
  return "portable";
}

bool set_simd_level_for_testing(const char* level) {
  Level l;
  if (!parse_level(level, &l) || l > cpu_level()) return false;
  active_level() = l;
  return true;
}

const char* amx_matmul() { return active_level() == Level::kAvx512 && amx_matmul_on() ? "amx" : "off"; }

bool set_amx_matmul_for_testing(bool on) {
  if (on && !amx_int8_usable()) return false;
  amx_matmul_on() = on;
  return true;
}

int64_t set_packed_prefetch_bytes_for_testing(int64_t bytes) {
  const int64_t before = packed_prefetch_override();
  packed_prefetch_override() = std::max<int64_t>(0, bytes);
  return before;
}

int set_packed_rows_per_call_for_testing(int rows) {
  const int before = packed_rows_override();
  packed_rows_override() = std::max(0, rows);
  return before;
}

}  // namespace fathom::cpu
