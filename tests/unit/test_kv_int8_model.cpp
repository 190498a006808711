// INT8 KV on a real model (SmolLM2-135M): the logits of a ~300-token prompt with the cache stored
// as INT8 stay close to the f32 cache's (the error is KV quantization only: same weights, same
// f32 activations), and decode through every policy at its loosest setting equals dense INT8.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/generate.h"
#include "engine/kv/block_allocator.h"
#include "engine/kv/block_table.h"
#include "engine/model/model.h"

namespace fathom {
namespace {

const std::string kModel = std::string(FATHOM_MODELS_DIR) + "/smollm2-135m-instruct-q4_1.gguf";

struct Loaded {
  std::unique_ptr<Model> model;
  std::unique_ptr<Backend> backend;
};

Loaded load(KvDtype dtype) {
  ModelOptions o;
  o.threads = 2;
  o.kv_dtype = dtype;
  o.precision = cpu::Precision::kF32;
  o.kv_cache_bytes = 64 << 20;
  Loaded l{Model::load(kModel), nullptr};
  l.backend = make_backend(*l.model, o);
  return l;
}

std::vector<int32_t> prompt(const Model& m) {
  std::string text;
  for (int i = 0; i < 12; ++i)
    text += "The lighthouse keeper climbed the spiral stairs every evening to light the lamp. ";
  return m.tokenizer().encode(text + "Every evening, the keeper");
}

// All-position logits of `tokens` in one prefill.
std::vector<float> logits_of(Backend& m, const std::vector<int32_t>& tokens) {
  BlockAllocator allocator(m.kv_blocks(), m.kv_layout().block_size);
  BlockTable table(allocator);
  EXPECT_TRUE(table.reserve(static_cast<int32_t>(tokens.size())));
  BatchPlan plan;
  plan.seqs.push_back(SeqStep{tokens, 0, &table.blocks(), LogitsWanted::kAll});
  std::vector<float> logits;
  m.forward(plan, logits);
  return logits;
}

TEST(KvInt8Model, LogitsStayCloseToTheF32Cache) {
  auto f32 = load(KvDtype::kF32);
  auto i8 = load(KvDtype::kI8);
  const std::vector<int32_t> tokens = prompt(*f32.model);
  const std::vector<float> a = logits_of(*f32.backend, tokens), b = logits_of(*i8.backend, tokens);
  ASSERT_EQ(a.size(), b.size());
  double err = 0, ref = 0;
  int32_t same_argmax = 0;
  const int32_t V = f32.model->vocab(), T = static_cast<int32_t>(tokens.size());
  for (int32_t t = 0; t < T; ++t) {
    int32_t am = 0, bm = 0;
    for (int32_t v = 0; v < V; ++v) {
      const double d = a[t * V + v] - b[t * V + v];
      err += d * d;
      ref += static_cast<double>(a[t * V + v]) * a[t * V + v];
      if (a[t * V + v] > a[t * V + am]) am = v;
      if (b[t * V + v] > b[t * V + bm]) bm = v;
    }
    same_argmax += am == bm;
  }
  const double nmse = err / ref;
  std::printf("INT8 vs f32 KV over %d positions: NMSE %.3g, same argmax at %d\n", T, nmse, same_argmax);
  // Per-row 8-bit quantization of K and V perturbs each logit by ~1e-2 of its scale.
  EXPECT_LT(nmse, 1e-3);
  EXPECT_GE(same_argmax, T * 95 / 100);
}

TEST(KvInt8Model, LoosestPoliciesEqualDense) {
  auto m = load(KvDtype::kI8);
  GenerateRequest r;
  r.prompt = prompt(*m.model);
  r.sampling.temperature = 0;
  r.max_tokens = 12;
  r.stop_at_end_of_generation = false;
  const std::vector<int32_t> dense = generate(*m.model, *m.backend, {r})[0].tokens;
  for (PolicyKind k : {policy_kind("sparq"), policy_kind("hip"), policy_kind("alisa")}) {
    r.attention.kind = k;
    r.attention.kv_read_ratio = 1.0;
    EXPECT_EQ(generate(*m.model, *m.backend, {r})[0].tokens, dense) << policy_name(k);
  }
}

}  // namespace
}  // namespace fathom
