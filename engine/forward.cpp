#include "engine/forward.h"

#include <algorithm>
#include <cmath>

#include "base/error.h"
#include "base/failpoints.h"

namespace fathom {
namespace {

// Steps shorter than this run `p` densely (AttentionPolicy::min_keys).
int32_t min_sparse_keys(ForwardOps& ops, const AttentionPolicy& p) {
  return p.min_keys == AttentionPolicy::kMeasuredBreakEven ? ops.sparse_break_even(p) : p.min_keys;
}

// Attention of every sequence of the plan on layer `il` (queries in kQ, keys already appended):
// bifurcated groups first (global layers only: a sliding window cuts the shared prefix
// differently per member), then prefill chunks densely, then every one-token step through its
// policy (auto resolved) or densely, all of them in one ForwardOps::attend_decodes call (which a
// backend may run side by side). Bytes are charged to the requested policy; steps to (requested,
// kernel that ran).
void attention(const ModelConfig& c, const KvLayout& kv, ForwardOps& ops, const BatchPlan& plan, int32_t il,
               KvReadBytes& kv_read, AttentionSteps& steps) {
  const LayerConfig& lc = c.layers[il];
  std::vector<char> grouped(plan.seqs.size(), 0);
  if (!lc.sliding)
    for (const AttentionGroup& g : plan.groups) {
      kv_read[kDensePolicy] += ops.attend_group(il, g);
      for (int32_t m : g.members) {
        grouped[m] = 1;
        const SeqStep& s = plan.seqs[m];
        if (s.policy != nullptr) ++steps[static_cast<int>(s.policy->kind)][kDensePolicy];
      }
    }
  std::vector<AttentionPolicy> resolved(plan.seqs.size());  // stable addresses for the steps' policies
  std::vector<DecodeStep> decodes;
  std::vector<int> requested_of;  // per entry of decodes
  for (size_t si = 0; si < plan.seqs.size(); ++si) {
    const SeqStep& s = plan.seqs[si];
    if (grouped[si] || s.tokens.empty()) continue;
    const int32_t seq = static_cast<int32_t>(si);
    if (s.tokens.size() != 1 || s.policy == nullptr) {
      ops.attend_dense(il, seq, lc.window);
      if (s.verify) {  // decode rows: one pass over the keys of its last (at most 8 rows share a pass)
        const int64_t last = s.pos0 + static_cast<int64_t>(s.tokens.size());
        kv_read[kDensePolicy] += dense_kv_bytes(kv, lc.window > 0 ? std::min<int64_t>(last, lc.window) : last);
        ++steps[kDensePolicy][kDensePolicy];
      }
      continue;
    }
    const int requested = static_cast<int>(s.policy->kind);
    const AttentionPolicy& p = resolved[si] = resolve_auto(*s.policy);
    const int64_t keys = lc.window > 0 ? std::min(s.pos0 + 1, lc.window) : s.pos0 + 1;
    // A soft-capped model (gemma2) or one with sinks (gpt-oss) decodes densely: the sparse kernels
    // neither cap their logits nor add sinks.
    if (c.attn_softcap == 0.0f && !c.attn_sinks && layer_uses_policy(p, il, lc.sliding) && !selects_every_key(p, s.pos0 + 1, c.head_dim) &&
        s.pos0 + 1 >= min_sparse_keys(ops, p)) {
      LayerPolicyState& state = s.policy_state->layers[il];
      if (state.rank < 0)  // before its first sparse step
        state.rank = policy_layer_rank(p, il, [&](int32_t l) { return c.layers[l].sliding; });
      decodes.push_back({seq, &p, &state, 0, static_cast<int64_t>(static_cast<double>(keys) * p.kv_read_ratio)});
      ++steps[requested][static_cast<int>(p.kind)];
    } else {
      decodes.push_back({seq, nullptr, nullptr, lc.window, keys});
      kv_read[requested] += dense_kv_bytes(kv, keys);
      ++steps[requested][kDensePolicy];
    }
    requested_of.push_back(requested);
  }
  if (decodes.empty()) return;
  ops.attend_decodes(il, decodes);
  for (size_t i = 0; i < decodes.size(); ++i) kv_read[requested_of[i]] += decodes[i].bytes;
}

void attention_block(const ModelConfig& c, const KvLayout& kv, ForwardOps& ops, const BatchPlan& plan, int64_t T,
                     int32_t il, KvReadBytes& kv_read, AttentionSteps& steps) {
  ops.rms_norm(Act::kX, Act::kXn, il, LayerVector::kAttnNorm, T, c.dim);
  const MatmulOut qkv[] = {{LayerMatrix::kWq, Act::kQ}, {LayerMatrix::kWk, Act::kK}, {LayerMatrix::kWv, Act::kV}};
  ops.matmul(il, qkv, Act::kXn);
  ops.add_bias(Act::kQ, il, LayerVector::kBq);  // no-ops without biases (only Qwen2-style models have them)
  ops.add_bias(Act::kK, il, LayerVector::kBk);
  ops.add_bias(Act::kV, il, LayerVector::kBv);
  if (c.qk_norm) {
    ops.rms_norm(Act::kQ, Act::kQ, il, LayerVector::kQNorm, T * c.n_heads, c.head_dim);
    ops.rms_norm(Act::kK, Act::kK, il, LayerVector::kKNorm, T * c.n_kv_heads, c.head_dim);
  }
  ops.rope(il);
  ops.append_kv(il);
  attention(c, kv, ops, plan, il, kv_read, steps);
  const MatmulOut out[] = {{LayerMatrix::kWo, Act::kProj}};
  ops.matmul(il, out, Act::kAttn);
  ops.add_bias(Act::kProj, il, LayerVector::kBo);
  if (c.post_norms) ops.rms_norm(Act::kProj, Act::kProj, il, LayerVector::kPostAttnNorm, T, c.dim);
  ops.add(Act::kX, Act::kProj);
}

// Mixture of experts: the router picks each token's k experts; the gated MLP runs over the
// (token, slot) pairs grouped by expert (each active expert's weights read once), and each token
// sums its pairs' outputs by the router's weights.
void moe_block(const ModelConfig& c, ForwardOps& ops, int64_t T, int32_t il) {
  ops.rms_norm(Act::kX, Act::kXn, il, LayerVector::kFfnNorm, T, c.dim);
  ops.route_experts(il);
  const ExpertMatmulOut gate_up[] = {{ExpertMatrix::kGate, Act::kGate}, {ExpertMatrix::kUp, Act::kUp}};
  ops.expert_matmul(il, gate_up, Act::kXn);
  ops.glu(c.activation);
  const ExpertMatmulOut down[] = {{ExpertMatrix::kDown, Act::kExpertOut}};
  ops.expert_matmul(il, down, Act::kGate);
  ops.combine_experts(Act::kProj);
  ops.add(Act::kX, Act::kProj);
}

void mlp_block(const ModelConfig& c, ForwardOps& ops, int64_t T, int32_t il) {
  if (c.moe()) {
    moe_block(c, ops, T, il);
    return;
  }
  ops.rms_norm(Act::kX, Act::kXn, il, LayerVector::kFfnNorm, T, c.dim);
  const MatmulOut gate_up[] = {{LayerMatrix::kGate, Act::kGate}, {LayerMatrix::kUp, Act::kUp}};
  ops.matmul(il, gate_up, Act::kXn);
  ops.glu(c.activation);
  const MatmulOut down[] = {{LayerMatrix::kDown, Act::kProj}};
  ops.matmul(il, down, Act::kGate);
  if (c.post_norms) ops.rms_norm(Act::kProj, Act::kProj, il, LayerVector::kPostFfnNorm, T, c.dim);
  ops.add(Act::kX, Act::kProj);
}

}  // namespace

void run_forward(const ModelConfig& c, const KvLayout& kv, ForwardOps& ops, const BatchPlan& plan,
                 std::vector<float>& logits, std::vector<float>* hidden, KvReadBytes& kv_read, AttentionSteps& steps) {
  failpoints::hit("forward");
  int64_t T = 0;
  for (const SeqStep& s : plan.seqs) {
    FATHOM_CHECK(s.blocks != nullptr);
    FATHOM_CHECK(static_cast<int64_t>(s.blocks->size()) * kv.block_size >= s.pos0 + static_cast<int64_t>(s.tokens.size()),
                 "block table too short");
    FATHOM_CHECK(s.policy == nullptr || s.policy_state != nullptr, "a policy step needs its state");
    T += static_cast<int64_t>(s.tokens.size());
  }
  logits.clear();
  if (hidden != nullptr) hidden->clear();
  if (T == 0) return;
  for (const SeqStep& s : plan.seqs)
    if (s.policy_state != nullptr) s.policy_state->layers.resize(c.n_layers);

  ops.begin_pass(plan);
  for (int32_t il = 0; il < c.n_layers; ++il) {
    attention_block(c, kv, ops, plan, T, il, kv_read, steps);
    mlp_block(c, ops, T, il);
  }
  // Only the wanted rows go through the final norm (and the output projection, for logits).
  std::vector<int64_t> logit_rows, hidden_rows;
  int64_t t = 0;
  for (const SeqStep& s : plan.seqs) {
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    for (int64_t i = 0; i < wanted_rows(s.logits, n); ++i) logit_rows.push_back(t + first_wanted_row(s.logits, n) + i);
    for (int64_t i = 0; i < wanted_rows(s.hidden, n); ++i) hidden_rows.push_back(t + first_wanted_row(s.hidden, n) + i);
    t += n;
  }
  if (hidden != nullptr) ops.hidden(hidden_rows, *hidden);
  ops.logits(logit_rows, logits);
  if (c.final_softcap > 0.0f)  // gemma2: final·tanh(logit / final), as transformers computes it
    for (float& x : logits) x = c.final_softcap * std::tanh(x / c.final_softcap);
}

}  // namespace fathom
