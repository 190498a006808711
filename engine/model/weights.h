#pragma once
// Model weights: views into the mapped GGUF file, in their stored format (a fused tensor — phi3's
// attn_qkv, its gate/up ffn_up — is one view per part, at a row offset).
// Small vectors (norm weights, biases) are converted to f32 once at load.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "kernels/ggml_type.h"

namespace fathom {

class GgufFile;
class HugePageBuffer;
namespace cpu {
class PackedWeights;
}

// A weight matrix W: [rows][cols] in `type`; y = x · Wᵀ maps cols -> rows.
struct WeightMatrix {
  GgmlType type = GgmlType::F32;
  const void* data = nullptr;
  int64_t rows = 0;  // output features (GGUF dims[1])
  int64_t cols = 0;  // input features (GGUF dims[0])
  // The same matrix repacked for the CPU kQ8 kernels (the CPU backend packs it), or null.
  std::shared_ptr<const cpu::PackedWeights> packed;
  size_t bytes() const { return ggml_row_size(type, cols) * rows; }
};

struct LayerWeights {
  std::vector<float> attn_norm;                // (dim)
  WeightMatrix wq, wk, wv, wo;                 // (q_dim, dim) (kv_dim, dim) (kv_dim, dim) (dim, q_dim)
  std::vector<float> bq, bk, bv;               // optional biases (q_dim) (kv_dim) (kv_dim) — Qwen2 style
  std::vector<float> bo;                       // optional attention output bias (dim): gpt-oss, llama's attention_bias
  std::vector<float> attn_sinks;               // (n_heads) gpt-oss's attention sinks (ModelConfig::attn_sinks)
  std::vector<float> q_norm, k_norm;           // (head_dim), gemma3 and qwen3 QK-norm
  std::vector<float> post_attn_norm;           // (dim), gemma3
  std::vector<float> ffn_norm;                 // (dim)
  WeightMatrix w_gate, w_up, w_down;           // (ffn, dim) (ffn, dim) (dim, ffn); empty in an MoE model
  std::vector<float> post_ffn_norm;            // (dim), gemma3
  // Mixture of experts (ModelConfig::moe()): the router ffn_gate_inp (n_experts, dim) and each
  // expert's matrices, views into the stacked 3-D tensors ffn_{gate,up,down}_exps (expert e's
  // rows follow expert e - 1's): (expert_ffn, dim) (expert_ffn, dim) (dim, expert_ffn).
  WeightMatrix router;
  std::vector<WeightMatrix> gate_exps, up_exps, down_exps;  // (n_experts) each
  // gpt-oss's biases: the router's (n_experts), and expert e's at row e of (n_experts, expert_ffn)
  // (n_experts, expert_ffn) (n_experts, dim); empty elsewhere.
  std::vector<float> router_bias, gate_exps_bias, up_exps_bias, down_exps_bias;
};

struct ModelWeights {
  WeightMatrix token_embd;   // (vocab, dim)
  WeightMatrix output;       // (vocab, dim); the embedding when tied
  std::vector<float> output_norm;  // (dim)
  std::vector<LayerWeights> layers;
  // Bytes of every matrix read per decoded token (embedding row excluded); with experts, the
  // router and n_experts_used experts' three matrices per layer.
  size_t matrix_bytes = 0;
  std::shared_ptr<HugePageBuffer> packed_arena;  // every WeightMatrix::packed's panels (CPU backend)

  // Throws fathom::Error for a missing tensor, wrong shape, or a type the kernels cannot read.
  static ModelWeights from_gguf(const GgufFile& file, const ModelConfig& config);

  // f(matrix) for every matrix every decoded token reads: each layer's seven (empty in an MoE
  // model) and router (empty in a dense one), then the output.
  template <typename F> void for_each_matrix(F&& f) { visit_matrices(*this, f); }
  template <typename F> void for_each_matrix(F&& f) const { visit_matrices(*this, f); }
  // f(matrix) for every expert's three matrices of every layer (none in a dense model).
  template <typename F> void for_each_expert_matrix(F&& f) { visit_experts(*this, f); }
  template <typename F> void for_each_expert_matrix(F&& f) const { visit_experts(*this, f); }


 private:
  template <typename Self, typename F>
  static void visit_matrices(Self& self, F& f) {
    for (auto& L : self.layers)
      for (auto* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down, &L.router}) f(*m);
    f(self.output);
  }
  template <typename Self, typename F>
  static void visit_experts(Self& self, F& f) {
    for (auto& L : self.layers)
      for (auto* v : {&L.gate_exps, &L.up_exps, &L.down_exps})
        for (auto& m : *v) f(m);
  }
};

}  // namespace fathom
