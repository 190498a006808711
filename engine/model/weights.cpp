#include "engine/model/weights.h"

#include <set>

#include "base/error.h"
#include "engine/model/gguf.h"
#include "kernels/ref/dequant.h"

namespace fathom {
namespace {

class Loader {
 public:
  Loader(const GgufFile& f, float norm_offset) : f_(f), norm_offset_(norm_offset) {}

  const GgufTensorInfo* find(const std::string& name) const { return f_.find_tensor(name); }

  const GgufTensorInfo& require(const std::string& name) {
    const GgufTensorInfo* t = find(name);
    if (!t) throw Error(f_.path() + ": missing tensor '" + name + "'");
    consumed_.insert(name);
    const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(t->type));
    if (!info || !info->kernels_read)
      throw Error(f_.path() + ": tensor '" + name + "' has type " + ggml_type_name(t->type) +
                  ", which fathom's kernels do not read");
    return *t;
  }

  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols) {
    const GgufTensorInfo& t = require(name);
    if (t.dims.size() != 2 || t.dims[0] != cols || t.dims[1] != rows)
      throw Error(f_.path() + ": tensor '" + name + "' has shape " + shape(t) + ", expected [" +
                  std::to_string(cols) + ", " + std::to_string(rows) + "]");
    return WeightMatrix{t.type, t.data, rows, cols, nullptr};
  }

  // A 3-D tensor of `n` stacked (rows, cols) matrices (GGUF dims [cols, rows, n]), one view each.
  std::vector<WeightMatrix> stacked(const std::string& name, int64_t n, int64_t rows, int64_t cols) {
    const GgufTensorInfo& t = require(name);
    if (t.dims.size() != 3 || t.dims[0] != cols || t.dims[1] != rows || t.dims[2] != n)
      throw Error(f_.path() + ": tensor '" + name + "' has shape " + shape(t) + ", expected [" + std::to_string(cols) +
                  ", " + std::to_string(rows) + ", " + std::to_string(n) + "]");
    std::vector<WeightMatrix> out;
    const size_t bytes = ggml_row_size(t.type, cols) * static_cast<size_t>(rows);
    for (int64_t e = 0; e < n; ++e)
      out.push_back(WeightMatrix{t.type, static_cast<const uint8_t*>(t.data) + e * bytes, rows, cols, nullptr});
    return out;
  }

  std::vector<float> vector(const std::string& name, int64_t n) {
    const GgufTensorInfo& t = require(name);
    if (t.elements() != n)
      throw Error(f_.path() + ": tensor '" + name + "' has " + std::to_string(t.elements()) + " elements, expected " +
                  std::to_string(n));
    std::vector<float> out(n);
    ref::dequantize_row(t.type, t.data, out.data(), n);
    return out;
  }

  // An RMSNorm's weights, plus the model's norm offset (ModelConfig::norm_offset: a Gemma
  // checkpoint's w for a norm multiplying by 1 + w).
  std::vector<float> norm(const std::string& name, int64_t n) {
    std::vector<float> w = vector(name, n);
    if (norm_offset_ != 0.0f)
      for (float& x : w) x += norm_offset_;
    return w;
  }

  std::vector<float> optional_vector(const std::string& name, int64_t n) {
    return find(name) ? vector(name, n) : std::vector<float>{};
  }

  // A tensor read elsewhere (the model config's RoPE frequency factors).
  void consumed(const std::string& name) { consumed_.insert(name); }

  // Every tensor of the file must have been read: one the loader does not know (an architecture
  // feature fathom lacks: a bias, a norm, experts) would otherwise be silently ignored.
  void check_all_consumed(const std::string& arch) const {
    std::string unused;
    int n = 0;
    for (const GgufTensorInfo& t : f_.tensors())
      if (!consumed_.contains(t.name) && n++ < 4) unused += (unused.empty() ? "'" : ", '") + t.name + "'";
    if (n > 0)
      throw Error(f_.path() + ": " + std::to_string(n) + " tensor" + (n > 1 ? "s" : "") +
                  " that fathom's " + arch + " does not use (a feature it lacks; refused rather than ignored): " +
                  unused + (n > 4 ? ", ..." : ""));
  }

 private:
  static std::string shape(const GgufTensorInfo& t) {
    std::string s = "[";
    for (size_t i = 0; i < t.dims.size(); ++i) s += (i ? ", " : "") + std::to_string(t.dims[i]);
    return s + "]";
  }
  const GgufFile& f_;
  const float norm_offset_;
  std::set<std::string, std::less<>> consumed_;
};

// Rows [first, first + n) of `m` as a matrix of their own: a ggml tensor's rows are contiguous and
// independent, so each part of a fused tensor is a view into the mapping at a row offset.
WeightMatrix row_view(const WeightMatrix& m, int64_t first, int64_t n) {
  FATHOM_CHECK(first >= 0 && n > 0 && first + n <= m.rows);
  const auto* data = static_cast<const uint8_t*>(m.data) + static_cast<size_t>(first) * ggml_row_size(m.type, m.cols);
  return WeightMatrix{m.type, data, n, m.cols, nullptr};
}

// Q, K and V: three tensors, or one attn_qkv of their rows in that order (phi3; llama.cpp's converter
// with --fuse-qkv) with its bias fused too or as three. Biases are optional (Qwen2 has them).
void load_qkv(Loader& load, const ModelConfig& c, const std::string& p, LayerWeights& L) {
  const int64_t q = c.q_dim(), kv = c.kv_dim();
  if (load.find(p + "attn_qkv.weight")) {
    const WeightMatrix qkv = load.matrix(p + "attn_qkv.weight", q + 2 * kv, c.dim);
    L.wq = row_view(qkv, 0, q);
    L.wk = row_view(qkv, q, kv);
    L.wv = row_view(qkv, q + kv, kv);
    if (load.find(p + "attn_qkv.bias")) {
      const std::vector<float> b = load.vector(p + "attn_qkv.bias", q + 2 * kv);
      L.bq.assign(b.begin(), b.begin() + q);
      L.bk.assign(b.begin() + q, b.begin() + q + kv);
      L.bv.assign(b.begin() + q + kv, b.end());
      return;
    }
  } else {
    L.wq = load.matrix(p + "attn_q.weight", q, c.dim);
    L.wk = load.matrix(p + "attn_k.weight", kv, c.dim);
    L.wv = load.matrix(p + "attn_v.weight", kv, c.dim);
  }
  L.bq = load.optional_vector(p + "attn_q.bias", q);
  L.bk = load.optional_vector(p + "attn_k.bias", kv);
  L.bv = load.optional_vector(p + "attn_v.bias", kv);
}

}  // namespace

ModelWeights ModelWeights::from_gguf(const GgufFile& f, const ModelConfig& c) {
  Loader load(f, c.norm_offset);
  ModelWeights w;
  const GgufTensorInfo& embd = load.require("token_embd.weight");
  if (embd.dims.size() != 2 || embd.dims[0] != c.dim)
    throw Error(f.path() + ": token_embd.weight does not have embedding_length columns");
  const int64_t vocab = embd.dims[1];
  w.token_embd = load.matrix("token_embd.weight", vocab, c.dim);
  w.output = load.find("output.weight") ? load.matrix("output.weight", vocab, c.dim) : w.token_embd;
  w.output_norm = load.norm("output_norm.weight", c.dim);

  for (int32_t il = 0; il < c.n_layers; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    LayerWeights L;
    L.attn_norm = load.norm(p + "attn_norm.weight", c.dim);
    load_qkv(load, c, p, L);
    L.wo = load.matrix(p + "attn_output.weight", c.dim, c.q_dim());
    L.bo = load.optional_vector(p + "attn_output.bias", c.dim);
    if (c.attn_sinks) L.attn_sinks = load.vector(p + "attn_sinks.weight", c.n_heads);
    if (c.qk_norm) {
      L.q_norm = load.norm(p + "attn_q_norm.weight", c.head_dim);
      L.k_norm = load.norm(p + "attn_k_norm.weight", c.head_dim);
    }
    // gpt-oss's pre-MLP norm carries the name llama.cpp gives post-attention norms.
    L.ffn_norm = load.norm(p + (c.arch == Architecture::kGptOss ? "post_attention_norm.weight" : "ffn_norm.weight"),
                           c.dim);
    if (c.moe()) {  // qwen3moe's and Mixtral's experts
      L.router = load.matrix(p + "ffn_gate_inp.weight", c.n_experts, c.dim);
      // llama.cpp's stacked ffn_*_exps, or one tensor per expert (ffn_gate.<e>: llama.cpp's layout
      // before 2024, and what a Hugging Face checkpoint's experts.<e>.* become).
      const bool per_expert = !load.find(p + "ffn_gate_exps.weight") && load.find(p + "ffn_gate.0.weight");
      auto experts = [&](const char* part, int64_t rows, int64_t cols) {
        if (!per_expert) return load.stacked(p + part + "_exps.weight", c.n_experts, rows, cols);
        std::vector<WeightMatrix> out;
        for (int32_t e = 0; e < c.n_experts; ++e) {
          out.push_back(load.matrix(p + part + "." + std::to_string(e) + ".weight", rows, cols));
          if (out.back().type != out[0].type)
            throw Error(f.path() + ": the experts of '" + p + part + "' have different types");
        }
        return out;
      };
      L.gate_exps = experts("ffn_gate", c.expert_ffn_dim, c.dim);
      L.up_exps = experts("ffn_up", c.expert_ffn_dim, c.dim);
      L.down_exps = experts("ffn_down", c.dim, c.expert_ffn_dim);
      if (c.arch == Architecture::kGptOss) {
        L.router_bias = load.vector(p + "ffn_gate_inp.bias", c.n_experts);
        L.gate_exps_bias = load.vector(p + "ffn_gate_exps.bias", int64_t{c.n_experts} * c.expert_ffn_dim);
        L.up_exps_bias = load.vector(p + "ffn_up_exps.bias", int64_t{c.n_experts} * c.expert_ffn_dim);
        L.down_exps_bias = load.vector(p + "ffn_down_exps.bias", int64_t{c.n_experts} * c.dim);
      }
    } else if (c.fused_gate_up) {  // phi3: the gate rows, then the up rows (transformers' gate_up_proj)
      const WeightMatrix gate_up = load.matrix(p + "ffn_up.weight", 2 * static_cast<int64_t>(c.ffn_dim), c.dim);
      L.w_gate = row_view(gate_up, 0, c.ffn_dim);
      L.w_up = row_view(gate_up, c.ffn_dim, c.ffn_dim);
    } else {
      L.w_gate = load.matrix(p + "ffn_gate.weight", c.ffn_dim, c.dim);
      L.w_up = load.matrix(p + "ffn_up.weight", c.ffn_dim, c.dim);
    }
    if (!c.moe()) L.w_down = load.matrix(p + "ffn_down.weight", c.dim, c.ffn_dim);
    if (c.post_norms) {
      L.post_attn_norm = load.norm(p + "post_attention_norm.weight", c.dim);
      L.post_ffn_norm = load.norm(p + "post_ffw_norm.weight", c.dim);
    }
    w.layers.push_back(std::move(L));
  }
  for (const std::string& t : c.rope_scaling.tensors) load.consumed(t);
  load.check_all_consumed(c.arch_name);
  w.for_each_matrix([&](const WeightMatrix& m) { w.matrix_bytes += m.bytes(); });
  for (const LayerWeights& L : w.layers)
    if (!L.gate_exps.empty())
      w.matrix_bytes += static_cast<size_t>(c.n_experts_used) *
                        (L.gate_exps[0].bytes() + L.up_exps[0].bytes() + L.down_exps[0].bytes());
  return w;
}

}  // namespace fathom
