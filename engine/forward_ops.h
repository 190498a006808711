#pragma once
// The operations the transformer's layer schedule (engine/forward.cpp) is written in. A backend
// (engine/backend/*) implements them over its own weights, activations and KV storage, in host
// or device memory; which op runs when, for every architecture, is decided once, in run_forward.
//
// Activations of one pass, T = tokens in the plan, rows in plan order (sequence by sequence):
//   kX, kXn, kProj: (T, dim)     residual stream, its normalised copy, a sublayer's output
//   kQ, kAttn:      (T, q_dim)   queries, attention output
//   kK, kV:         (T, kv_dim)  the new tokens' keys and values (before they enter the cache)
//   kGate, kUp:     (T, ffn_dim) the gated MLP's two projections; with experts (ModelConfig::moe())
//                   (T · k, expert_ffn_dim): a row per (token, slot) pair in ExpertRouting's order
//   kExpertOut:     (T · k, dim) each pair's expert output (experts only; dense models: empty)
#include <cstdint>
#include <span>
#include <vector>

#include "base/error.h"
#include "engine/attention/decode_attention.h"
#include "engine/batch_plan.h"
#include "engine/model/model_config.h"

namespace fathom {

enum class Act { kX, kXn, kQ, kK, kV, kAttn, kProj, kGate, kUp, kExpertOut };
// Per-layer vectors of ModelWeights' LayerWeights (f32): norm weights and biases.
enum class LayerVector { kAttnNorm, kFfnNorm, kQNorm, kKNorm, kPostAttnNorm, kPostFfnNorm, kBq, kBk, kBv, kBo };
// Per-layer matrices, y = x · Wᵀ.
enum class LayerMatrix { kWq, kWk, kWv, kWo, kGate, kUp, kDown };
// Each expert's matrices of an MoE layer (LayerWeights::gate_exps, up_exps, down_exps).
enum class ExpertMatrix { kGate, kUp, kDown };

// Row width of an activation buffer (see the table above).
inline int64_t act_width(const ModelConfig& c, Act a) {
  switch (a) {
    case Act::kX:
    case Act::kXn:
    case Act::kProj: return c.dim;
    case Act::kQ:
    case Act::kAttn: return c.q_dim();
    case Act::kK:
    case Act::kV: return c.kv_dim();
    case Act::kGate:
    case Act::kUp: return c.moe() ? c.n_experts_used * c.expert_ffn_dim : c.ffn_dim;
    case Act::kExpertOut: return c.moe() ? c.n_experts_used * c.dim : 0;
  }
  return 0;
}

// The field of a layer's weights an enum names. Backends keep their own per-layer structs with
// the field names of LayerWeights (engine/model/weights.h), so one lookup serves them all.
template <typename Layer>
auto& layer_vector(Layer& l, LayerVector v) {
  switch (v) {
    case LayerVector::kAttnNorm: return l.attn_norm;
    case LayerVector::kFfnNorm: return l.ffn_norm;
    case LayerVector::kQNorm: return l.q_norm;
    case LayerVector::kKNorm: return l.k_norm;
    case LayerVector::kPostAttnNorm: return l.post_attn_norm;
    case LayerVector::kPostFfnNorm: return l.post_ffn_norm;
    case LayerVector::kBq: return l.bq;
    case LayerVector::kBk: return l.bk;
    case LayerVector::kBv: return l.bv;
    case LayerVector::kBo: return l.bo;
  }
  return l.attn_norm;  // unreachable: every enumerator is handled above
}
template <typename Layer>
auto& layer_matrix(Layer& l, LayerMatrix m) {
  switch (m) {
    case LayerMatrix::kWq: return l.wq;
    case LayerMatrix::kWk: return l.wk;
    case LayerMatrix::kWv: return l.wv;
    case LayerMatrix::kWo: return l.wo;
    case LayerMatrix::kGate: return l.w_gate;
    case LayerMatrix::kUp: return l.w_up;
    case LayerMatrix::kDown: return l.w_down;
  }
  return l.wq;  // unreachable
}

template <typename Layer>
auto& expert_biases(Layer& l, ExpertMatrix m) {
  switch (m) {
    case ExpertMatrix::kGate: return l.gate_exps_bias;
    case ExpertMatrix::kUp: return l.up_exps_bias;
    case ExpertMatrix::kDown: return l.down_exps_bias;
  }
  return l.gate_exps_bias;  // unreachable
}

template <typename Layer>
auto& expert_matrices(Layer& l, ExpertMatrix m) {
  switch (m) {
    case ExpertMatrix::kGate: return l.gate_exps;
    case ExpertMatrix::kUp: return l.up_exps;
    case ExpertMatrix::kDown: return l.down_exps;
  }
  return l.gate_exps;  // unreachable
}

struct MatmulOut {
  LayerMatrix w;
  Act out;
};
struct ExpertMatmulOut {
  ExpertMatrix w;
  Act out;
};

// One sequence's one-token attention step on a layer (ForwardOps::attend_decodes).
struct DecodeStep {
  int32_t seq = 0;                          // index into the plan's seqs
  const AttentionPolicy* policy = nullptr;  // a sparse policy the backend implements; null: dense
  LayerPolicyState* state = nullptr;        // the sequence's state of this layer (with a policy)
  int32_t window = 0;                       // dense: the layer's window (0: none)
  int64_t cost = 0;                         // keys it reads, roughly (the order steps go out in)
  int64_t bytes = 0;                        // out: KV bytes a sparse step read
};

class ForwardOps {
 public:
  virtual ~ForwardOps() = default;

  // Starts a pass over `plan` (T >= 1 tokens; every block table covers its tokens): sizes the
  // activations, takes the token ids, absolute positions and block tables, and writes every
  // token's embedding times config.embed_scale to kX.
  virtual void begin_pass(const BatchPlan& plan) = 0;
  // out = x / rms(x) · w over `rows` rows of `width` (in may be out). kQNorm / kKNorm run over
  // heads: rows = T·heads, width = head_dim.
  virtual void rms_norm(Act in, Act out, int32_t layer, LayerVector w, int64_t rows, int32_t width) = 0;
  // Every out = in · Wᵀ for matrices that share their input (one job: the input is read once).
  virtual void matmul(int32_t layer, std::span<const MatmulOut> outs, Act in) = 0;
  // x += bias on every row.
  virtual void add_bias(Act x, int32_t layer, LayerVector bias) = 0;
  // Rotates kQ and kK by the tokens' positions with `layer`'s RoPE (LayerConfig::rope_inv_freq, rope_attn_factor).
  virtual void rope(int32_t layer) = 0;
  // Writes kK and kV of every token into its sequence's KV blocks at its position.
  virtual void append_kv(int32_t layer) = 0;
  // Attention of plan.seqs[seq]'s tokens (queries in kQ, output to kAttn), causal over the
  // sequence's cached keys; `window` > 0 limits a query to the last `window` keys.
  virtual void attend_dense(int32_t layer, int32_t seq, int32_t window) = 0;
  // The one decode query of plan.seqs[seq] through a sparse policy the backend implements
  // (Backend::implements); returns the KV bytes it read.
  virtual int64_t attend_sparse(int32_t layer, int32_t seq, const AttentionPolicy& policy, LayerPolicyState& state) = 0;
  // The one-token steps of several sequences on `layer`, each as attend_sparse (a policy) or
  // attend_dense (none) would run it, in any order or at once (each writes only its own output
  // rows and policy state); sets each sparse step's bytes. A backend may run them side by side.
  virtual void attend_decodes(int32_t layer, std::span<DecodeStep> steps) {
    for (DecodeStep& s : steps) {
      if (s.policy != nullptr) s.bytes = attend_sparse(layer, s.seq, *s.policy, *s.state);
      else attend_dense(layer, s.seq, s.window);
    }
  }
  // The number of keys from which `policy` decodes a layer faster than dense here (the value of
  // AttentionPolicy::kMeasuredBreakEven); 0 where the backend does not measure it.
  virtual int32_t sparse_break_even(const AttentionPolicy& /*policy*/) { return 0; }
  // Bifurcated attention of a group's one-token steps (engine/batch_plan.h AttentionGroup): each
  // shared segment read once for all members; returns the KV bytes read.
  virtual int64_t attend_group(int32_t layer, const AttentionGroup& group) = 0;
  // Mixture of experts (ModelConfig::moe()). Routes kXn's rows through `layer`'s router (n_experts
  // logits each, plus its bias where it has one; engine/expert_routing.h): the step's (token, slot)
  // pairs grouped by expert.
  virtual void route_experts(int32_t /*layer*/) { FATHOM_CHECK(false, "this backend runs no experts"); }
  // Per active expert e, out rows of e's pairs = in rows · W_eᵀ (+ e's bias row where the layer
  // has expert biases: gpt-oss), several matrices sharing the input as one job; `in` is kXn (token
  // rows: a pair reads its token's) or kGate (pair rows).
  // A backend reads each active expert's matrices once a step (the CPU) or once per run of its
  // pairs (CUDA: runs of <= 4 for its grouped GEMV when every expert has so few, else of <= 64 for
  // its grouped GEMM) and adds the bytes it read to StepStats::expert_bytes.
  virtual void expert_matmul(int32_t /*layer*/, std::span<const ExpertMatmulOut> /*outs*/, Act /*in*/) {
    FATHOM_CHECK(false, "this backend runs no experts");
  }
  // out (T, dim) = Σ over each token's pairs of weight · kExpertOut row.
  virtual void combine_experts(Act /*out*/) { FATHOM_CHECK(false, "this backend runs no experts"); }
  // kGate = act(kGate) · kUp, elementwise over (T, act_width(kGate)).
  virtual void glu(Activation act) = 0;
  // x += y, elementwise over (T, width of x).
  virtual void add(Act x, Act y) = 0;
  // The final norm of kX's rows `rows` (token indices, ascending): rows.size() rows of dim floats
  // into `hidden` (host memory, resized). Before logits(), which ends the pass.
  virtual void hidden(std::span<const int64_t> rows, std::vector<float>& hidden) = 0;
  // The final norm of kX's rows `rows` (token indices, ascending) and the output projection:
  // rows.size() rows of vocab floats into `logits` (host memory, resized). The pass's last op.
  virtual void logits(std::span<const int64_t> rows, std::vector<float>& logits) = 0;
};

}  // namespace fathom
