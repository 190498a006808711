// The CUDA backend (engine/backend/cuda/cuda_backend.cu) run on the CPU through kernels/cuda/emu
// against the CPU backend on the real models, with identical BatchPlans (both through the one
// layer schedule of engine/forward.cpp); plus the
// elementwise kernels it added (kernels/cuda/elementwise.cu) against their host spec.
//
// Whole-model check: a plan of three prompts (8, 2 and 12 tokens, T = 22: quantized weights take
// quant_gemv's many-row kernel; the 2-token prompt wants every row's logits), then (Gemma) a step
// that decodes the 8- and 12-token sequences beside a 64-token prompt (T = 66 > 64: the
// dequantize + GEMM path), then decode steps of the two (T = 2: the one-row kernel), fed the CPU's greedy
// tokens. The CPU model runs with Precision::kF32 (f32 activations, weights dequantized exactly),
// f16 KV on both sides. Per forward, NMSE = Σ(a − b)² / Σb² over all logits (b = CPU) and equal
// greedy tokens of the sequences' last rows.
// Bounds: the backend rounds every GEMM input to f16 (activations, and SmolLM2's Q4_1 / Gemma's
// Q5_0 weights, whose d·q + m is no f16 value): ~1e-3 relative error per product, averaging out
// over K and accumulating over 30 / 18 layers. SmolLM2 measured 3.1e-6 and 2.4e-6 (bound 1e-4).
// Gemma (bound 1e-3) 1.1e-7 at T = 22 (quant_gemv reads f32 activations), 3.6e-7 at T = 66 (the
// f16 GEMM), 4.2e-7 decoding.
// Runtime: every emulated __syncthreads / shuffle is a ucontext switch per thread (SmolLM2 ~6 s,
// Gemma 3 ~12 s on 2 cores). Hence one or two decode steps and at most 4 logits rows a pass (the
// one-row quant_gemv kernel over the 49152- and 262144-row outputs).
// Elementwise kernels: exact (the same single f32 addition / the same rounding as the host).
#include "tests/kernel/cuda_backend_headers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/kv/block_allocator.h"
#include "engine/model/model.h"

namespace fathom {
namespace {

template <typename T>
std::vector<T> run_device(const std::vector<T>& host_in, const std::function<void(T*)>& op) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, std::max<size_t>(1, host_in.size()) * sizeof(T)), cudaSuccess);
  cudaMemcpy(d, host_in.data(), host_in.size() * sizeof(T), cudaMemcpyHostToDevice);
  op(d);
  std::vector<T> out(host_in.size());
  cudaMemcpy(out.data(), d, out.size() * sizeof(T), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return out;
}

TEST(CudaElementwise, AddBiasAndConvertAreExact) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  for (const int64_t rows : {1, 3, 7}) {
    for (const int64_t n : {1, 5, 83, 769}) {
      std::vector<float> y(rows * n), x(rows * n), bias(n);
      for (float& v : y) v = nd(rng);
      for (float& v : x) v = nd(rng);
      for (float& v : bias) v = nd(rng);
      x[0] = 70000.0f;  // overflows f16: must become inf, as __float2half_rn
      float *dx = nullptr, *db = nullptr;
      cudaMalloc(&dx, x.size() * sizeof(float));
      cudaMalloc(&db, bias.size() * sizeof(float));
      cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice);
      cudaMemcpy(db, bias.data(), bias.size() * sizeof(float), cudaMemcpyHostToDevice);
      const std::vector<float> added = run_device<float>(y, [&](float* d) {
        ASSERT_EQ(cuda::add_inplace(d, dx, rows * n, nullptr), cudaSuccess);
      });
      const std::vector<float> biased = run_device<float>(y, [&](float* d) {
        ASSERT_EQ(cuda::add_bias(d, db, rows, n, nullptr), cudaSuccess);
      });
      __half* h = nullptr;
      __nv_bfloat16* b = nullptr;
      cudaMalloc(&h, x.size() * sizeof(__half));
      cudaMalloc(&b, x.size() * sizeof(__nv_bfloat16));
      ASSERT_EQ(cuda::convert_f32_to_f16(dx, h, rows * n, nullptr), cudaSuccess);
      ASSERT_EQ(cuda::convert_f32_to_bf16(dx, b, rows * n, nullptr), cudaSuccess);
      std::vector<__half> hh(x.size());
      std::vector<__nv_bfloat16> bh(x.size());
      cudaMemcpy(hh.data(), h, hh.size() * sizeof(__half), cudaMemcpyDeviceToHost);
      cudaMemcpy(bh.data(), b, bh.size() * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost);
      for (int64_t i = 0; i < rows * n; ++i) {
        ASSERT_EQ(added[i], y[i] + x[i]) << i;
        ASSERT_EQ(biased[i], y[i] + bias[i % n]) << i;
        const float hf = __half2float(hh[i]), ref_h = __half2float(__float2half_rn(x[i]));
        ASSERT_EQ(std::memcmp(&hf, &ref_h, sizeof(float)), 0) << i;
        const float bf = __bfloat162float(bh[i]), ref_b = __bfloat162float(__float2bfloat16_rn(x[i]));
        ASSERT_EQ(std::memcmp(&bf, &ref_b, sizeof(float)), 0) << i;
      }
      EXPECT_TRUE(std::isinf(__half2float(hh[0])));
      cudaFree(dx);
      cudaFree(db);
      cudaFree(h);
      cudaFree(b);
    }
  }
}

int32_t argmax(const float* row, int32_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

double nmse(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return num / den;
}

// Runs both backends on the same plans; returns the worst NMSE over the forward passes.
// long_prompt: step 1 also prefills the 64-token prompt (T = 66).
double compare_model(const std::string& file, double bound, int decode_steps, bool long_prompt) {
  const auto t0 = std::chrono::steady_clock::now();
  ModelOptions o;
  o.threads = 2;
  o.precision = cpu::Precision::kF32;
  o.kv_dtype = KvDtype::kF16;
  o.block_size = 16;
  o.kv_cache_bytes = 8 << 20;  // 14 blocks (SmolLM2), 17 (Gemma 3): both caches stay small
  std::unique_ptr<Model> model = Model::load(std::string(FATHOM_MODELS_DIR) + "/" + file);
  CpuBackend cpu(*model, o);
  std::unique_ptr<Backend> cuda = make_cuda_backend(*model, o);
  EXPECT_EQ(cuda->name(), "cuda");
  const auto t1 = std::chrono::steady_clock::now();

  const Tokenizer& tok = model->tokenizer();
  std::vector<int32_t> a = tok.encode("The capital of France is a city called");
  std::vector<int32_t> b = tok.encode("Here is a short list of prime numbers: 2, 3, 5, 7, 11,");
  std::vector<int32_t> c = tok.encode("Hello there");
  a.resize(std::min<size_t>(a.size(), 8));
  b.resize(std::min<size_t>(b.size(), 12));
  c.resize(std::min<size_t>(c.size(), 2));
  std::vector<int32_t> d;  // the long prompt of step 1
  while (d.size() < 64) d.insert(d.end(), b.begin(), b.end());
  d.resize(64);
  EXPECT_EQ(a.size(), 8u);
  EXPECT_EQ(b.size(), 12u);
  EXPECT_EQ(c.size(), 2u);
  BlockAllocator pool(std::min(cpu.kv_blocks(), cuda->kv_blocks()), o.block_size);
  const std::vector<int32_t> table_a{pool.allocate()}, table_b{pool.allocate()}, table_c{pool.allocate()};
  const std::vector<int32_t> table_d{pool.allocate(), pool.allocate(), pool.allocate(), pool.allocate()};
  const int32_t vocab = model->vocab();

  double worst = 0;
  std::vector<float> cpu_logits, cuda_logits, cpu_hidden, cuda_hidden;
  std::vector<int32_t> next_a, next_b;  // one-token spans for the decode steps
  for (int step = 0; step <= decode_steps; ++step) {
    BatchPlan plan;
    if (step == 0) {
      // Rows of logits: 1 + 2 + 1 = 4, one quant_gemv launch over the big output matrix.
      plan.seqs.push_back(SeqStep{a, 0, &table_a, LogitsWanted::kLast});
      plan.seqs.push_back(SeqStep{c, 0, &table_c, LogitsWanted::kAll});
      plan.seqs.push_back(SeqStep{b, 0, &table_b, LogitsWanted::kLast});
      // Final hidden states (what embeddings pool): a's every row, c's first, b's last: 8 + 1 + 1.
      plan.seqs[0].hidden = LogitsWanted::kAll;
      plan.seqs[1].hidden = LogitsWanted::kFirst;
      plan.seqs[2].hidden = LogitsWanted::kLast;
    } else {
      plan.seqs.push_back(SeqStep{next_a, static_cast<int32_t>(a.size()) + step - 1, &table_a, LogitsWanted::kLast});
      if (step == 1 && long_prompt) plan.seqs.push_back(SeqStep{d, 0, &table_d, LogitsWanted::kLast});  // between a and b
      plan.seqs.push_back(SeqStep{next_b, static_cast<int32_t>(b.size()) + step - 1, &table_b, LogitsWanted::kLast});
    }
    int64_t tokens = 0;
    for (const SeqStep& q : plan.seqs) tokens += static_cast<int64_t>(q.tokens.size());
    const auto s0 = std::chrono::steady_clock::now();
    cpu.forward(plan, cpu_logits, &cpu_hidden);
    const auto s1 = std::chrono::steady_clock::now();
    cuda->forward(plan, cuda_logits, &cuda_hidden);
    const auto s2 = std::chrono::steady_clock::now();
    EXPECT_EQ(cpu_hidden.size(), static_cast<size_t>(step == 0 ? 10 * model->config().dim : 0));
    EXPECT_EQ(cuda_hidden.size(), cpu_hidden.size());
    if (step == 0) {
      EXPECT_LT(nmse(cuda_hidden, cpu_hidden), bound) << "final hidden states";
    }
    EXPECT_EQ(cuda_logits.size(), cpu_logits.size());
    EXPECT_EQ(static_cast<int64_t>(cpu_logits.size()), plan.logits_rows() * vocab);
    const double e = nmse(cuda_logits, cpu_logits);
    worst = std::max(worst, e);
    const int64_t rows = plan.logits_rows();
    // a's row is first, b's last (c's two rows in between at step 0, d's row at step 1).
    const int32_t cpu_a = argmax(&cpu_logits[0], vocab);
    const int32_t cpu_b = argmax(&cpu_logits[(rows - 1) * vocab], vocab);
    EXPECT_EQ(argmax(&cuda_logits[0], vocab), cpu_a) << "step " << step;
    EXPECT_EQ(argmax(&cuda_logits[(rows - 1) * vocab], vocab), cpu_b) << "step " << step;
    std::printf("%s step %d: T=%lld rows=%lld NMSE %.3e (bound %.0e), greedy %d %d; cpu %.2f s, cuda-emu %.2f s\n",
                file.c_str(), step, static_cast<long long>(tokens),
                static_cast<long long>(rows), e, bound, cpu_a, cpu_b, std::chrono::duration<double>(s1 - s0).count(),
                std::chrono::duration<double>(s2 - s1).count());
    next_a = {cpu_a};
    next_b = {cpu_b};
  }
  std::printf("%s: load + upload %.2f s, worst NMSE %.3e\n", file.c_str(),
              std::chrono::duration<double>(t1 - t0).count(), worst);
  EXPECT_LT(worst, bound);
  return worst;
}

TEST(CudaForward, SmolLM2MatchesCpuModel) { compare_model("smollm2-135m-instruct-q4_1.gguf", 1e-4, 1, false); }

// The only whole-model run of quant_gemv's many-row kernel and of the quantized dequantize + GEMM
// path (SmolLM2's layer weights are all f16 on the device), with Gemma's 262144-row output GEMV.
TEST(CudaForward, Gemma3MatchesCpuModel) { compare_model("gemma-3-270m-q4_k_m.gguf", 1e-3, 2, true); }

TEST(CudaForward, BlockMovesRoundTrip) {
  ModelOptions o;
  o.threads = 1;
  o.kv_cache_bytes = 1 << 24;
  std::unique_ptr<Model> model = Model::load(std::string(FATHOM_MODELS_DIR) + "/smollm2-135m-instruct-q4_1.gguf");
  std::unique_ptr<Backend> cuda = make_cuda_backend(*model, o);
  const size_t bytes = cuda->block_bytes();
  std::vector<std::byte> in(bytes), out(bytes), copied(bytes);
  for (size_t i = 0; i < bytes; ++i) in[i] = static_cast<std::byte>(i * 131 % 251);
  cuda->write_block(3, in.data());
  cuda->copy_block(3, 5);
  cuda->read_block(3, out.data());
  cuda->read_block(5, copied.data());
  EXPECT_EQ(std::memcmp(in.data(), out.data(), bytes), 0);
  EXPECT_EQ(std::memcmp(in.data(), copied.data(), bytes), 0);
}

}  // namespace
}  // namespace fathom
