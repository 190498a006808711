#include "engine/model/weights.h"

#include <set>

#include "base/error.h"
#include "engine/model/gguf.h"
#include "kernels/ref/dequant.h"

namespace fathom {
namespace {

class Loader {
 public:
  explicit Loader(const GgufFile& f) : f_(f) {}

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

  std::vector<float> vector(const std::string& name, int64_t n) {
    const GgufTensorInfo& t = require(name);
    if (t.elements() != n)
      throw Error(f_.path() + ": tensor '" + name + "' has " + std::to_string(t.elements()) + " elements, expected " +
                  std::to_string(n));
    std::vector<float> out(n);
    ref::dequantize_row(t.type, t.data, out.data(), n);
    return out;
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
  std::set<std::string, std::less<>> consumed_;
};

}  // namespace

ModelWeights ModelWeights::from_gguf(const GgufFile& f, const ModelConfig& c) {
  Loader load(f);
  ModelWeights w;
  const GgufTensorInfo& embd = load.require("token_embd.weight");
  if (embd.dims.size() != 2 || embd.dims[0] != c.dim)
    throw Error(f.path() + ": token_embd.weight does not have embedding_length columns");
  const int64_t vocab = embd.dims[1];
  w.token_embd = load.matrix("token_embd.weight", vocab, c.dim);
  w.output = load.find("output.weight") ? load.matrix("output.weight", vocab, c.dim) : w.token_embd;
  w.output_norm = load.vector("output_norm.weight", c.dim);

  for (int32_t il = 0; il < c.n_layers; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    LayerWeights L;
    L.attn_norm = load.vector(p + "attn_norm.weight", c.dim);
    L.wq = load.matrix(p + "attn_q.weight", c.q_dim(), c.dim);
    L.wk = load.matrix(p + "attn_k.weight", c.kv_dim(), c.dim);
    L.wv = load.matrix(p + "attn_v.weight", c.kv_dim(), c.dim);
    L.wo = load.matrix(p + "attn_output.weight", c.dim, c.q_dim());
    L.bq = load.optional_vector(p + "attn_q.bias", c.q_dim());
    L.bk = load.optional_vector(p + "attn_k.bias", c.kv_dim());
    L.bv = load.optional_vector(p + "attn_v.bias", c.kv_dim());
    if (c.qk_norm) {
      L.q_norm = load.vector(p + "attn_q_norm.weight", c.head_dim);
      L.k_norm = load.vector(p + "attn_k_norm.weight", c.head_dim);
    }
    L.ffn_norm = load.vector(p + "ffn_norm.weight", c.dim);
    L.w_gate = load.matrix(p + "ffn_gate.weight", c.ffn_dim, c.dim);
    L.w_up = load.matrix(p + "ffn_up.weight", c.ffn_dim, c.dim);
    L.w_down = load.matrix(p + "ffn_down.weight", c.dim, c.ffn_dim);
    if (c.post_norms) {
      L.post_attn_norm = load.vector(p + "post_attention_norm.weight", c.dim);
      L.post_ffn_norm = load.vector(p + "post_ffw_norm.weight", c.dim);
    }
    w.layers.push_back(std::move(L));
  }
  for (const std::string& t : c.rope_scaling.tensors) load.consumed(t);
  load.check_all_consumed(c.arch_name);
  w.for_each_matrix([&](const WeightMatrix& m) { w.matrix_bytes += m.bytes(); });
  return w;
}

}  // namespace fathom
