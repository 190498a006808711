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
  std::vector<float> q_norm, k_norm;           // (head_dim), gemma3 and qwen3 QK-norm
  std::vector<float> post_attn_norm;           // (dim), gemma3
  std::vector<float> ffn_norm;                 // (dim)
  WeightMatrix w_gate, w_up, w_down;           // (ffn, dim) (ffn, dim) (dim, ffn)
  std::vector<float> post_ffn_norm;            // (dim), gemma3
};

struct ModelWeights {
  WeightMatrix token_embd;   // (vocab, dim)
  WeightMatrix output;       // (vocab, dim); the embedding when tied
  std::vector<float> output_norm;  // (dim)
  std::vector<LayerWeights> layers;
  size_t matrix_bytes = 0;   // bytes of every matrix read per decoded token (embedding row excluded)
  std::shared_ptr<HugePageBuffer> packed_arena;  // every WeightMatrix::packed's panels (CPU backend)

  // Throws fathom::Error for a missing tensor, wrong shape, or a type the kernels cannot read.
  static ModelWeights from_gguf(const GgufFile& file, const ModelConfig& config);

  // f(matrix) for every matrix read per decoded token: each layer's seven, then the output.
  template <typename F> void for_each_matrix(F&& f) { visit_matrices(*this, f); }
  template <typename F> void for_each_matrix(F&& f) const { visit_matrices(*this, f); }


 private:
  template <typename Self, typename F>
  static void visit_matrices(Self& self, F& f) {
    for (auto& L : self.layers)
      for (auto* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) f(*m);
    f(self.output);
  }
};

}  // namespace fathom
