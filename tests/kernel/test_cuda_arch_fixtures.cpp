// qwen2, qwen3, phi3, llama, qwen3moe, Mixtral, Mistral, gemma2 and gpt-oss against Hugging Face transformers, on the CPU
// backend and the CUDA backend under emulation, loaded from our GGUF and from
// the Hugging Face directory itself (translated at load: engine/model/hf_dir.h); and llama.cpp's own
// converter's GGUF of the same checkpoints.
//
// Fixtures: tests/fixtures/arch/<name>.{gguf,llamacpp.gguf,json} and the logits file the JSON names,
// made by scripts/arch_fixtures.py (`make fixtures`): 2-layer random-weight models (hidden 64, GQA,
// vocab 128, every weight a bf16 value) saved as a Hugging Face directory, written as GGUF the way
// llama.cpp lays these architectures out, and converted from the directory by llama.cpp's
// convert_hf_to_gguf.py; transformers' f32 logits of every position of a 12- and a 120-token prompt.
//   qwen2          Q/K/V biases, tied embeddings
//   qwen3          per-head QK RMSNorm, head_dim 48 (q_dim 96 != hidden 64)
//   phi3           fused attn_qkv and gate/up ffn_up, a 24-token sliding window on every layer
//   phi3-longrope  longrope (the long factors: context 256 > original 64), partial rotary 24 of 32
//   llama          llama3 scaling (original 64 of 256, factor 8: pairs kept, blended and divided; the
//                  120-token prompt runs past the original context), GQA 4:2, Llama 3's tokenizer
// All rotate NEOX-style but llama's GGUF, whose Q/K rows llama.cpp's converter permutes for
// adjacent-pair rotation and whose scaling it writes as the rope_freqs tensor; its Hugging Face
// directory keeps the checkpoint's rows (rope_neox) and scaling keys (the llama3 rule).
//   qwen3moe       qwen3's attention; 4 experts of 48, top-2, the top-2 weights renormalised
//   mixtral        a `llama` (Q/K permuted like llama's) with 4 experts of 80, top-2; no llama3 scaling
//   mistral        a `llama` with a 24-token window on every layer, GQA 4:2 (llama.cpp's converter
//                  drops the window: its GGUF is not compared, the directory is)
//   gemma2         attention and final logit soft-capping (20 and 10), every other layer a 24-token
//                  window, head_dim 48, post norms, GeGLU; its directory's norms are w where the
//                  model multiplies by 1 + w (the GGUF's 1 + w: fathom.norm_offset)
//   gpt-oss        attention sinks, Q/K/V/O biases, every other layer a 24-token window, 4 experts of
//                  80, top-2 over biased router logits, expert biases, the clamped SwiGLU, untruncated
//                  YaRN; its directory's experts are transformers' fused tensors (gate_up_proj
//                  [E, hidden, 2 ffn] with gate and up interleaved, down_proj [E, ffn, hidden]),
//                  transposed and split at load (engine/model/hf_gpt_oss.h)
// The MoE fixtures' prompts route no token near a tie (the k-th and (k+1)-th router logits >= 0.01
// apart: router_min_gap in the JSON), so rounding does not change which experts run. qwen3moe's and
// Mixtral's Hugging Face directories store one tensor per expert (experts.<e>.*), which load as
// llama.cpp's older per-expert GGUF layout does (ffn_gate.<e>.weight, ...).
//
// Measure, per row: max|fathom − ref| / max|ref|; the worst row counts (as test_cuda_rope_scaling).
// - CPU, f32 activations and f32 KV: transformers' own f32 logits are 1e-6 to 5e-6 from its f64
//   ones (f32_vs_f64_rel in each JSON); measured 2.5e-6 (qwen3) to 8.0e-6 (phi3-longrope);
//   tolerance 1e-4.
// - CUDA (emulated): GEMM inputs rounded to f16; measured 1.9e-3 (qwen2) to 6.2e-3 (phi3);
//   tolerance 2e-2.
// - llama.cpp's GGUF: the same tensors and <arch>.* keys (the fixture script compares them), so the
//   logits must be bitwise those of ours.
// - The Hugging Face directory: the same bf16 values, metadata translated as llama.cpp's converter
//   writes it, so its logits must be bitwise those of our GGUF (llama's within kCpuTol: its RoPE
//   frequencies are computed, not read from rope_freqs); and every test above on it too.
// What the tolerances must catch (ablation.rel in each JSON, transformers without the feature):
// 1.7 to 2.0 — qwen2 without its biases, qwen3 without its QK norms, phi3 without its window,
// phi3-longrope with the short factors, llama without its llama3 scaling (1.8); 1.03 — qwen3moe
// without renormalising the top-2 weights; 1.65 — mixtral routing each token to its top-1 expert
// only; 0.93 — gemma2 without its soft-capping (and its directory's norms read as w instead of 1 + w
// changes its logits as much as Gemma 3's, below: 1.08); 1.77 — mistral without its window; 1.00 — gpt-oss
// without its sinks; and fathom rotating adjacent pairs instead of
// NEOX's: 1.6 to 2.2.
// Greedy: 32 tokens after a prompt the fixture chose for clear margins (every step's top-1 minus
// top-2 logit is ≥ 1.5% of max|logit|): the CPU's and CUDA's ids equal transformers'.
#include "tests/kernel/cuda_backend_headers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "engine/attention/policies/alisa.h"
#include "engine/attention/policy.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/model.h"
#include "kernels/cuda/moe.h"
#include "tests/kernel/logits_fixture.h"

namespace fathom {
namespace {

using logits_fixture::Fixture;
using logits_fixture::kCpuTol;
using logits_fixture::kCudaTol;
using logits_fixture::options;
using logits_fixture::worst_row_error;

const std::string kDir = std::string(FATHOM_SOURCE_DIR) + "/tests/fixtures/arch/";
constexpr size_t kChunk = 64;  // the 120-token prompt: 64 + 56, the second chunk reads the first's KV
// Greedy margins (top-1 minus top-2 logit, over max|logit|): the CPU's ids are compared with
// transformers' while the margin exceeds twice the CPU's tolerance; the fixture chose a prompt whose
// every margin is at least kGreedyMargin, over twice the CUDA backend's measured error (under 1e-2),
// so its ids must equal the CPU's at every step.
constexpr double kClearMargin = 2 * kCpuTol;
constexpr double kGreedyMargin = 0.015;

// (family, format): the GGUF file or the Hugging Face directory of the same checkpoint.
class ArchFixture : public ::testing::TestWithParam<std::tuple<const char*, bool>> {
 protected:
  void SetUp() override {
    f_ = logits_fixture::load(kDir, name());
    model_ = Model::load(f_.path(hf() ? "hf_dir" : "gguf"));
  }
  const char* name() const { return std::get<0>(GetParam()); }
  bool hf() const { return std::get<1>(GetParam()); }
  std::string what(const char* backend) const { return std::string(name()) + (hf() ? "-hf " : " ") + backend; }
  Fixture f_;
  std::unique_ptr<Model> model_;
};

// Greedy ids of `steps` tokens after `prompt`: a prefill, then one-token decode steps.
std::vector<int32_t> greedy(Backend& backend, const std::vector<int32_t>& prompt, int steps, int32_t block_size) {
  BlockAllocator pool(backend.kv_blocks(), block_size);
  std::vector<int32_t> table =
      logits_fixture::blocks_for(pool, static_cast<int64_t>(prompt.size()) + steps, block_size);
  std::vector<int32_t> ids;
  std::vector<float> logits;
  std::span<const int32_t> step(prompt);
  for (int i = 0; i < steps; ++i) {
    BatchPlan plan;
    const int32_t pos0 = i == 0 ? 0 : static_cast<int32_t>(prompt.size()) + i - 1;
    plan.seqs.push_back(SeqStep{step, pos0, &table, LogitsWanted::kLast});
    backend.forward(plan, logits);
    ids.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    step = std::span<const int32_t>(&ids.back(), 1);
  }
  return ids;
}

TEST_P(ArchFixture, RopeFrequenciesMatchTransformers) {
  const ModelConfig& c = model_->config();
  // llama's and Mixtral's GGUFs hold Q and K rows permuted for adjacent pairs (llama.cpp's
  // converter); llama's directory, like every other family's file, the checkpoint's rotate-half rows.
  EXPECT_EQ(c.rope_neox, hf() || c.arch != Architecture::kLlama);
  logits_fixture::expect_rope_matches(c, f_);
}

TEST_P(ArchFixture, CpuLogitsMatchTransformers) {
  const ModelOptions o = options();
  CpuBackend cpu(*model_, o);
  EXPECT_LE(worst_row_error(logits_fixture::run_prompts(cpu, f_, o.block_size, kChunk), f_.logits, f_.vocab,
                            what("cpu")),
            kCpuTol);
}

TEST_P(ArchFixture, CudaLogitsMatchTransformers) {
  const ModelOptions o = options();
  std::unique_ptr<Backend> cuda = make_cuda_backend(*model_, o);
  EXPECT_LE(worst_row_error(logits_fixture::run_prompts(*cuda, f_, o.block_size, kChunk), f_.logits, f_.vocab,
                            what("cuda-emu")),
            kCudaTol);
}

// llama.cpp's convert_hf_to_gguf.py on the fixture's Hugging Face directory: an independent writer;
// and the directory itself, translated at load.
TEST_P(ArchFixture, OtherFormatGivesTheSameLogits) {
  // llama.cpp's converter drops Mistral's window (its file would run without one): our GGUF is
  // compared with the directory instead.
  const bool no_converter = f_.meta.value("converter_drops_window", false);
  const std::unique_ptr<Model> theirs = Model::load(f_.path(hf() ? "gguf" : no_converter ? "hf_dir" : "llamacpp_gguf"));
  const ModelOptions o = options();
  CpuBackend ours_cpu(*model_, o), theirs_cpu(*theirs, o);
  const std::vector<float> a = logits_fixture::run_prompts(ours_cpu, f_, o.block_size, kChunk);
  const std::vector<float> b = logits_fixture::run_prompts(theirs_cpu, f_, o.block_size, kChunk);
  // Bitwise, but for the `llama` architecture's directories (llama, mixtral): their Q/K rows rotate
  // as the checkpoint stores them, the GGUF's as llama.cpp permutes them, so the attention dot
  // products add up in another order (mixtral: 3.7e-6); and llama's frequencies come from the llama3
  // rule (in double), the GGUF's from the rope_freqs tensor (the converter's f32): 1.7e-6.
  const double tol = (hf() || no_converter) && model_->config().arch == Architecture::kLlama ? kCpuTol : 0.0;
  EXPECT_LE(worst_row_error(b, a, f_.vocab, what(hf() ? "our gguf" : no_converter ? "the directory" : "llama.cpp's gguf")),
            tol);
}

// The sparse kernels do not soft-cap their logits: a soft-capped model decodes densely whatever
// policy a step asks for (engine/forward.cpp), so an ALISA step's logits on the global layer are
// dense attention's, bitwise. (Were it to run at 1/8 of the 120 keys, they would not be. SparQ and
// HiP would select every key of so short a sequence, or keep this 2-layer model's layers dense.)
TEST(Gemma2, SparsePolicyStepsDecodeDensely) {
  const Fixture f = logits_fixture::load(kDir, "gemma2");
  const std::unique_ptr<Model> model = Model::load(f.path("gguf"));
  ASSERT_GT(model->config().attn_softcap, 0.0f);
  const ModelOptions o = options();
  CpuBackend cpu(*model, o);
  AttentionPolicy alisa;
  alisa.kind = policy_kind("alisa");
  alisa.set(alisa::kRatio, 0.125);  // explicit: the derived ratio keeps at least 256 keys
  alisa.min_keys = 0;
  const auto prompt = f.meta["prompts"][1].get<std::vector<int32_t>>();
  const int32_t n = static_cast<int32_t>(prompt.size());
  BlockAllocator pool(cpu.kv_blocks(), o.block_size);
  const std::vector<int32_t> table = logits_fixture::blocks_for(pool, n, o.block_size);
  SeqPolicyState state;
  auto step = [&](int32_t pos, const AttentionPolicy* policy, std::vector<float>& logits) {
    BatchPlan plan;
    plan.seqs.push_back(SeqStep{std::span<const int32_t>(&prompt[pos], 1), pos, &table, LogitsWanted::kLast, policy,
                                policy ? &state : nullptr});
    cpu.forward(plan, logits);
  };
  std::vector<float> dense, sparse;
  BatchPlan prefill;
  prefill.seqs.push_back(SeqStep{std::span<const int32_t>(prompt).first(n - 2), 0, &table, LogitsWanted::kLast});
  cpu.forward(prefill, dense);
  step(n - 2, &alisa, dense);  // ALISA's first step is dense: it seeds the attention mass
  step(n - 1, nullptr, dense);
  step(n - 1, &alisa, sparse);  // the same token again (its K/V do not depend on the last layer)
  ASSERT_EQ(dense.size(), sparse.size());
  for (size_t i = 0; i < dense.size(); ++i) ASSERT_EQ(dense[i], sparse[i]) << "logit " << i;
}

// Gemma 3 from a Hugging Face directory. No transformers here to make its reference: a 6-layer
// random model (5 sliding layers of a 24-token window, then a global one whose RoPE is scaled
// linearly by 8; QK norms, post norms, head_dim 24) written as a directory in the released
// checkpoints' layout and as llama.cpp's converter would write its GGUF (scripts/gemma3_fixtures.py),
// its logits those of tests/reference/numpy_model.py on the GGUF in float64 (an implementation of
// llama.cpp's gemma3 sharing no code with fathom; its f32 logits are 1.2e-6 from them). The
// directory's logits must be bitwise the GGUF's, and within the CPU's and CUDA's tolerances of the
// reference; with the norms read as stored (w, not 1 + w) they would be 1.08 away.
// A Gemma 3 directory (`dir` under kDir) against the gemma3 fixture: the config our GGUF's (5
// sliding layers then a global one, their windows and RoPE frequencies, the global layers' linear
// factor 8, the attention scale, epsilon and context), its logits bitwise the GGUF's on the CPU, and
// within the CPU's and CUDA's tolerances of the reference.
void expect_gemma3_directory(const std::string& dir) {
  const Fixture f = logits_fixture::load(kDir, "gemma3");
  const std::unique_ptr<Model> hf = Model::load(kDir + dir);
  const std::unique_ptr<Model> gguf = Model::load(f.path("gguf"));
  const ModelConfig& c = hf->config();
  ASSERT_EQ(c.arch, Architecture::kGemma3);
  ASSERT_EQ(c.layers.size(), 6u);
  for (size_t il = 0; il < c.layers.size(); ++il) {
    EXPECT_EQ(c.layers[il].sliding, il != 5) << "layer " << il;
    EXPECT_EQ(c.layers[il].window, gguf->config().layers[il].window) << "layer " << il;
    EXPECT_EQ(c.layers[il].rope_inv_freq, gguf->config().layers[il].rope_inv_freq) << "layer " << il;
  }
  EXPECT_EQ(c.rope_scaling.factor, 8.0f);
  EXPECT_EQ(c.attn_scale, gguf->config().attn_scale);
  EXPECT_EQ(c.rms_eps, gguf->config().rms_eps);
  EXPECT_EQ(c.context_length, gguf->config().context_length);
  const ModelOptions o = options();
  CpuBackend hf_cpu(*hf, o), gguf_cpu(*gguf, o);
  const std::vector<float> got = logits_fixture::run_prompts(hf_cpu, f, o.block_size, kChunk);
  EXPECT_EQ(worst_row_error(got, logits_fixture::run_prompts(gguf_cpu, f, o.block_size, kChunk), f.vocab,
                            dir + " vs our gguf"),
            0.0);
  EXPECT_LE(worst_row_error(got, f.logits, f.vocab, dir + " cpu"), kCpuTol);
  std::unique_ptr<Backend> cuda = make_cuda_backend(*hf, o);
  EXPECT_LE(worst_row_error(logits_fixture::run_prompts(*cuda, f, o.block_size, kChunk), f.logits, f.vocab,
                            dir + " cuda-emu"),
            kCudaTol);
}

TEST(Gemma3, DirectoryMatchesItsGgufAndTheReference) { expect_gemma3_directory("gemma3-hf"); }

// Gemma 3's vision checkpoints (Gemma3ForConditionalGeneration: the 4B, 12B and 27B as released)
// serve their text model: gemma3-mm-hf holds gemma3-hf's text weights under language_model.model.*,
// a text_config that leaves most keys to transformers' Gemma3TextConfig defaults, and vision tower
// and projector tensors, which are skipped. Its logits must be bitwise the GGUF's, and within the
// CPU's and CUDA's tolerances of the reference.
TEST(Gemma3, ConditionalGenerationDirectoryServesItsTextModel) { expect_gemma3_directory("gemma3-mm-hf"); }

// gpt-oss as released: its experts' gate and up matrices MXFP4. The reference is transformers with
// those weights as the gguf package dequantizes them (0.72 of max|logit| from the bf16 model's), so
// the MXFP4 expert kernels (CPU dot and tiled GEMM, CUDA GEMV) are held to it like any other. The
// same blocks as a Hugging Face directory stores them (gpt-oss-mxfp4-hf: gate_up_proj_blocks and
// _scales, transformers' nibble order, gate and up rows interleaved; scripts/gpt_oss_mxfp4_fixture.py
// undoes llama.cpp's repacking of the GGUF's) repack at load into the GGUF's bytes: its logits are
// bitwise the GGUF's, and within the tolerances of the reference on both backends.
TEST(GptOss, Mxfp4ExpertsMatchTheDequantizedReference) {
  Fixture f = logits_fixture::load(kDir, "gpt-oss");
  const nlohmann::json mx = f.meta["mxfp4"];
  std::ifstream l(kDir + mx["logits"].get<std::string>(), std::ios::binary);  // same prompts, same shape
  l.read(reinterpret_cast<char*>(f.logits.data()), static_cast<std::streamsize>(f.logits.size() * sizeof(float)));
  ASSERT_TRUE(l.good());
  const std::unique_ptr<Model> gguf = Model::load(kDir + mx["gguf"].get<std::string>());
  const std::unique_ptr<Model> hf = Model::load(kDir + "gpt-oss-mxfp4-hf");
  const ModelOptions o = options();
  std::vector<float> gguf_logits;
  for (const Model* model : {gguf.get(), hf.get()}) {
    const std::string what = model == hf.get() ? "gpt-oss-mxfp4-hf" : "gpt-oss mxfp4";
    const LayerWeights& L = model->weights().layers[0];
    ASSERT_EQ(L.gate_exps[0].type, GgmlType::MXFP4) << what;
    ASSERT_EQ(L.up_exps[0].type, GgmlType::MXFP4) << what;
    CpuBackend cpu(*model, o);
    const std::vector<float> got = logits_fixture::run_prompts(cpu, f, o.block_size, kChunk);
    EXPECT_LE(worst_row_error(got, f.logits, f.vocab, what + " cpu"), kCpuTol);
    if (model == gguf.get())
      gguf_logits = got;
    else
      EXPECT_EQ(worst_row_error(got, gguf_logits, f.vocab, what + " vs the gguf"), 0.0);
    std::unique_ptr<Backend> cuda = make_cuda_backend(*model, o);
    EXPECT_LE(worst_row_error(logits_fixture::run_prompts(*cuda, f, o.block_size, kChunk), f.logits, f.vocab,
                              what + " cuda-emu"),
              kCudaTol);
  }
}

TEST_P(ArchFixture, GreedyTokensMatchTransformers) {
  const nlohmann::json& g = f_.meta["greedy"];
  const auto prompt = g["prompt"].get<std::vector<int32_t>>();
  const auto want = g["ids"].get<std::vector<int32_t>>();
  const auto margins = g["margins"].get<std::vector<double>>();
  const int steps = static_cast<int>(want.size());
  // Compared with transformers' up to the first step whose margin is not clear.
  const int clear = static_cast<int>(std::find_if(margins.begin(), margins.end(),
                                                  [](double m) { return m < kClearMargin; }) - margins.begin());
  EXPECT_GE(*std::min_element(margins.begin(), margins.end()), kGreedyMargin) << "the fixture's greedy prompt";
  const ModelOptions o = options();
  CpuBackend cpu(*model_, o);
  std::unique_ptr<Backend> cuda = make_cuda_backend(*model_, o);
  const std::vector<int32_t> cpu_ids = greedy(cpu, prompt, steps, o.block_size);
  const std::vector<int32_t> cuda_ids = greedy(*cuda, prompt, steps, o.block_size);
  EXPECT_EQ(cpu_ids, cuda_ids);
  EXPECT_EQ(std::vector<int32_t>(cpu_ids.begin(), cpu_ids.begin() + clear),
            std::vector<int32_t>(want.begin(), want.begin() + clear));
}

// The MoE families: a step reads each active expert's three matrices once, however many of its
// tokens go to it. A one-token step: n_layers · k experts; a 120-token prefill (240 pairs over 4
// experts: every expert active): n_layers · n_experts on the CPU, where reading them per token
// would be 60×. The CUDA backend reads an expert once per run of its pairs: runs of <= 4 for the
// grouped GEMV where every expert has <= 4 pairs (the decode step: the same as the CPU), of <= 64
// (cuda::kGroupedGemmRows) for the grouped GEMM otherwise: for the prefill at least once per active
// expert and at most n_layers · (pairs / 64 + n_experts), where runs of 4 read at least pairs / 4.
using MoeFixture = ArchFixture;
TEST_P(MoeFixture, ExpertWeightsAreReadOncePerStep) {
  const ModelConfig& c = model_->config();
  ASSERT_TRUE(c.moe());
  const LayerWeights& L = model_->weights().layers[0];
  const int64_t expert = static_cast<int64_t>(L.gate_exps[0].bytes() + L.up_exps[0].bytes() + L.down_exps[0].bytes());
  const std::vector<int32_t>& prompt = f_.prompts[1];
  const int64_t pairs = static_cast<int64_t>(prompt.size()) * c.n_experts_used;
  const ModelOptions o = options();
  CpuBackend cpu(*model_, o);
  std::unique_ptr<Backend> cuda = make_cuda_backend(*model_, o);
  for (Backend* b : {static_cast<Backend*>(&cpu), cuda.get()}) {
    BlockAllocator pool(b->kv_blocks(), o.block_size);
    std::vector<int32_t> table = logits_fixture::blocks_for(pool, static_cast<int64_t>(prompt.size()) + 1, o.block_size);
    std::vector<float> logits;
    BatchPlan prefill;
    prefill.seqs.push_back(SeqStep{std::span<const int32_t>(prompt), 0, &table, LogitsWanted::kLast});
    const int64_t prefill_bytes = b->forward(prefill, logits).expert_bytes;
    if (b == &cpu) {
      EXPECT_EQ(prefill_bytes, c.n_layers * c.n_experts * expert);
    } else {
      EXPECT_GE(prefill_bytes, c.n_layers * c.n_experts * expert);
      EXPECT_LE(prefill_bytes, c.n_layers * (pairs / cuda::kGroupedGemmRows + c.n_experts) * expert);
      std::printf("%s prefill of %zu tokens: %ld expert bytes, %.2f expert reads a layer (runs of 4: >= %ld)\n",
                  what("cuda").c_str(), prompt.size(), static_cast<long>(prefill_bytes),
                  static_cast<double>(prefill_bytes) / static_cast<double>(c.n_layers * expert),
                  static_cast<long>(pairs / 4));
    }
    BatchPlan decode;
    decode.seqs.push_back(
        SeqStep{std::span<const int32_t>(prompt.data(), 1), static_cast<int32_t>(prompt.size()), &table,
                LogitsWanted::kLast});
    EXPECT_EQ(b->forward(decode, logits).expert_bytes, c.n_layers * c.n_experts_used * expert) << b->name();
  }
}

// qwen3 with Q8_0 matrices, and the same tensors as a qwen3moe of one expert that every token uses
// with weight 1 (scripts/moe_identity_fixtures.py): the MoE layer is the dense MLP. On the CPU the
// logits are bitwise the dense model's at both precisions (kQ8: the experts' packed Q8_0 panels);
// on CUDA within its tolerance of the CPU's (its dense MLP rounds activations to f16 for the bf16
// down projection's GEMM, the grouped GEMV reads them in f32).
TEST(OneExpert, IsTheDenseModel) {
  const Fixture f = logits_fixture::load(kDir, "qwen3");
  const std::unique_ptr<Model> dense = Model::load(kDir + "qwen3-q8.gguf");
  const std::unique_ptr<Model> moe = Model::load(kDir + "qwen3-q8-as-moe.gguf");
  ASSERT_TRUE(moe->config().moe());
  for (const cpu::Precision precision : {cpu::Precision::kF32, cpu::Precision::kQ8}) {
    ModelOptions o = options();
    o.precision = precision;
    CpuBackend a(*dense, o), b(*moe, o);
    const std::vector<float> want = logits_fixture::run_prompts(a, f, o.block_size, kChunk);
    EXPECT_EQ(worst_row_error(logits_fixture::run_prompts(b, f, o.block_size, kChunk), want, f.vocab,
                              precision == cpu::Precision::kQ8 ? "one expert cpu q8" : "one expert cpu f32"),
              0.0);
    if (precision == cpu::Precision::kF32) {
      std::unique_ptr<Backend> cuda = make_cuda_backend(*moe, o);
      EXPECT_LE(worst_row_error(logits_fixture::run_prompts(*cuda, f, o.block_size, kChunk), want, f.vocab,
                                "one expert cuda-emu"),
                kCudaTol);
    }
  }
}

// The one-expert model on CUDA: every token's pair goes to expert 0, so a T-token step's expert
// has T pairs and each layer reads its matrices ceil(T / 4) times through the grouped GEMV (T <= 4)
// or ceil(T / 64) times through the grouped GEMM (T > 4): 1 for 4 tokens, 1 (not 2) for 5, 2 (not
// 30) for the 120-token prompt. IsTheDenseModel above checks the logits of the GEMM path (chunks of
// 64 and 56 tokens) against the dense model.
TEST(OneExpert, CudaPrefillReadsTheExpertOncePer64Pairs) {
  const Fixture f = logits_fixture::load(kDir, "qwen3");
  const std::unique_ptr<Model> moe = Model::load(kDir + "qwen3-q8-as-moe.gguf");
  const ModelConfig& c = moe->config();
  ASSERT_EQ(c.n_experts, 1);
  ASSERT_EQ(c.n_experts_used, 1);
  const LayerWeights& L = moe->weights().layers[0];
  ASSERT_EQ(L.gate_exps[0].type, GgmlType::Q8_0);
  const int64_t expert = static_cast<int64_t>(L.gate_exps[0].bytes() + L.up_exps[0].bytes() + L.down_exps[0].bytes());
  const ModelOptions o = options();
  std::unique_ptr<Backend> cuda = make_cuda_backend(*moe, o);
  const std::vector<int32_t>& prompt = f.prompts[1];
  ASSERT_EQ(prompt.size(), 120u);
  for (const int64_t tokens : {4, 5, 120}) {
    BlockAllocator pool(cuda->kv_blocks(), o.block_size);
    std::vector<int32_t> table = logits_fixture::blocks_for(pool, tokens, o.block_size);
    std::vector<float> logits;
    BatchPlan prefill;
    prefill.seqs.push_back(SeqStep{std::span<const int32_t>(prompt.data(), static_cast<size_t>(tokens)), 0, &table,
                                   LogitsWanted::kLast});
    const int64_t reads = tokens <= 4 ? (tokens + 3) / 4 : (tokens + cuda::kGroupedGemmRows - 1) / cuda::kGroupedGemmRows;
    const int64_t bytes = cuda->forward(prefill, logits).expert_bytes;
    EXPECT_EQ(bytes, c.n_layers * reads * expert) << tokens << " tokens";
    std::printf("one expert, %ld-token prefill: %ld expert bytes (%ld reads a layer; runs of 4: %ld)\n",
                static_cast<long>(tokens), static_cast<long>(bytes), static_cast<long>(reads),
                static_cast<long>((tokens + 3) / 4));
  }
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<const char*, bool>>& info) {
  std::string s = std::get<0>(info.param);
  std::replace(s.begin(), s.end(), '-', '_');
  return s + (std::get<1>(info.param) ? "_hf" : "_gguf");
}

INSTANTIATE_TEST_SUITE_P(Families, ArchFixture,
                         ::testing::Combine(::testing::Values("qwen2", "qwen3", "phi3", "phi3-longrope", "llama",
                                                              "mistral", "gemma2"),
                                            ::testing::Bool()),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Moe, ArchFixture,
                         ::testing::Combine(::testing::Values("qwen3moe", "mixtral", "gpt-oss"), ::testing::Bool()),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Families, MoeFixture,
                         ::testing::Combine(::testing::Values("qwen3moe", "mixtral", "gpt-oss"), ::testing::Bool()),
                         param_name);

}  // namespace
}  // namespace fathom
