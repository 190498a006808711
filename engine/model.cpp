#include "engine/model.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "engine/backend/backend.h"
#include "engine/error.h"
#include "engine/model/gguf.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/sparse_attention.h"

namespace fathom {

Model::~Model() = default;

namespace {
Model::BackendFactory& cuda_backend_factory() {
  static Model::BackendFactory factory;
  return factory;
}
}  // namespace

void Model::set_cuda_backend_factory(BackendFactory factory) { cuda_backend_factory() = std::move(factory); }

const ChatTemplate& Model::chat_template() const {
  if (!chat_template_)
    throw Error(file_->path() + ": the model has no chat template; name a family with --chat-template");
  return *chat_template_;
}

std::unique_ptr<Model> Model::load(const std::string& path, const ModelOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->options_ = options;
  m->file_ = GgufFile::open(path);
  m->config_ = ModelConfig::from_gguf(*m->file_);
  m->weights_ = ModelWeights::from_gguf(*m->file_, m->config_);
  m->tokenizer_ = Tokenizer::from_gguf(*m->file_);
  const std::string bos = m->tokenizer_->bos_id() >= 0 ? m->tokenizer_->piece(m->tokenizer_->bos_id()) : "";
  std::string family = options.chat_template;
  const std::string template_text = m->file_->get_string("tokenizer.chat_template").value_or("");
  // A GGUF without a template (the Gemma 3 270M file has none) falls back to its architecture's family.
  if (family.empty() && template_text.empty()) family = default_family_for_architecture(m->config_.arch_name);
  if (!family.empty() || !template_text.empty())
    m->chat_template_ = ChatTemplate::resolve(template_text, family, bos);

  if (options.block_size <= 0 || options.block_size > 1024)
    throw Error("kv block size must be in [1, 1024], got " + std::to_string(options.block_size));
  KvLayout layout{m->config_.n_layers, m->config_.n_kv_heads, m->config_.head_dim, options.block_size,
                  options.kv_dtype, options.kv_transposed_k};
  int64_t bytes = options.kv_cache_bytes;
  if (bytes <= 0) bytes = static_cast<int64_t>(layout.block_bytes()) * (m->config_.context_length / options.block_size + 64);
  const int64_t blocks = bytes / static_cast<int64_t>(layout.block_bytes());
  if (blocks < 1) throw Error("kv cache budget of " + std::to_string(bytes) + " bytes holds no block");
  m->kv_pool_ = std::make_unique<BlockPool>(layout, static_cast<int32_t>(std::min<int64_t>(blocks, INT32_MAX)));
  const int threads = options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  m->threads_ = std::make_unique<ThreadPool>(threads);
  if (options.backend == "cpu") {
    if (options.pack_weights && options.precision == cpu::Precision::kQ8) m->pack_weights();
    m->backend_ = std::make_unique<CpuBackend>(*m);
  } else if (options.backend == "cuda") {
    if (!cuda_backend_factory()) throw Error("--backend cuda: this build has no CUDA backend (nvcc was not found at build time)");
    m->backend_ = cuda_backend_factory()(*m);
  } else {
    throw Error("unknown backend '" + options.backend + "' (expected cpu or cuda)");
  }
  return m;
}

void Model::pack_weights() {
  weights_.pack_for_cpu();
  // The mapped bytes of a packed matrix are no longer read (packing read them all in): give the
  // pages back. A tied embedding too: its rows fault back in one page per looked-up token.
  std::as_const(weights_).for_each_matrix([&](const WeightMatrix& w) {
    if (w.packed) file_->release_pages(w.data, w.bytes());
  });
}

void Model::forward(const BatchPlan& plan, std::vector<float>& logits) {
  const ModelConfig& c = config_;
  int64_t T = 0;
  for (const SeqStep& s : plan.seqs) {
    FATHOM_CHECK(s.blocks != nullptr);
    FATHOM_CHECK(static_cast<int64_t>(s.blocks->size()) * options_.block_size >= s.pos0 + static_cast<int64_t>(s.tokens.size()),
                 "block table too short");
    T += static_cast<int64_t>(s.tokens.size());
  }
  if (T == 0) return;
  for (const SeqStep& s : plan.seqs)
    if (s.policy_state != nullptr) s.policy_state->layers.resize(c.n_layers);
  x_.resize(T * c.dim);
  xn_.resize(T * c.dim);
  q_.resize(T * c.q_dim());
  k_.resize(T * c.kv_dim());
  v_.resize(T * c.kv_dim());
  attn_.resize(T * c.q_dim());
  proj_.resize(T * c.dim);
  gate_.resize(T * c.ffn_dim);
  up_.resize(T * c.ffn_dim);
  positions_.clear();

  // Embedding lookup (quantized rows dequantized on the fly), gemma scales by sqrt(dim).
  int64_t t = 0;
  for (const SeqStep& s : plan.seqs)
    for (size_t i = 0; i < s.tokens.size(); ++i, ++t) {
      const int32_t id = s.tokens[i];
      FATHOM_CHECK(id >= 0 && id < weights_.token_embd.rows, "token id out of range");
      cpu::dequantize_row(weights_.token_embd.type, weights_.token_embd.data, c.dim, id, &x_[t * c.dim]);
      positions_.push_back(s.pos0 + static_cast<int32_t>(i));
    }
  if (c.embed_scale != 1.0f) cpu::scale_inplace(x_.data(), c.embed_scale, T * c.dim);

  // RoPE tables: one per distinct (base, scale) — llama has one, gemma3 two (local / global).
  const int32_t half = c.rope_dim / 2;
  rope_cos_.resize(T * half);
  rope_sin_.resize(T * half);
  const LayerConfig& first_global = *std::find_if(c.layers.begin(), c.layers.end(),
                                                  [](const LayerConfig& l) { return !l.sliding; });
  cpu::rope_table(positions_.data(), T, c.rope_dim, first_global.rope_base, first_global.rope_scale, rope_cos_.data(),
                  rope_sin_.data());
  const auto local = std::find_if(c.layers.begin(), c.layers.end(), [](const LayerConfig& l) { return l.sliding; });
  if (local != c.layers.end()) {
    rope_cos_local_.resize(T * half);
    rope_sin_local_.resize(T * half);
    cpu::rope_table(positions_.data(), T, c.rope_dim, local->rope_base, local->rope_scale, rope_cos_local_.data(),
                    rope_sin_local_.data());
  }

  for (int32_t il = 0; il < c.n_layers; ++il) {
    attention_layer(plan, il);
    mlp_layer(il);
  }

  // Final norm and output projection, only for the rows whose logits are wanted.
  const int64_t rows = plan.logits_rows();
  std::vector<float> picked;
  picked.reserve(rows * c.dim);
  t = 0;
  for (const SeqStep& s : plan.seqs) {
    const int64_t n = static_cast<int64_t>(s.tokens.size());
    const int64_t first = s.logits == LogitsWanted::kAll ? 0 : s.logits == LogitsWanted::kLast ? n - 1 : n;
    for (int64_t i = first; i < n; ++i) picked.insert(picked.end(), &x_[(t + i) * c.dim], &x_[(t + i + 1) * c.dim]);
    t += n;
  }
  cpu::rms_norm(picked.data(), weights_.output_norm.data(), picked.data(), rows, c.dim, c.rms_eps);
  logits.resize(rows * vocab());
  const WeightMatrix& out = weights_.output;
  cpu::matmul(*threads_, out.type, out.data, out.rows, out.cols, picked.data(), rows, logits.data(), options_.precision,
              out.packed.get());
}

void Model::grouped_attention(const BatchPlan& plan, const AttentionGroup& g, int32_t il, std::vector<char>& grouped) {
  const ModelConfig& c = config_;
  // Row offset of every plan entry in q_ / attn_.
  std::vector<int64_t> row(plan.seqs.size());
  int64_t t = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    row[i] = t;
    t += static_cast<int64_t>(plan.seqs[i].tokens.size());
  }
  const int32_t n = static_cast<int32_t>(g.members.size());
  std::vector<PagedKvView> views(n);
  std::vector<DecodeArgs> args(n);
  std::vector<int32_t> local(plan.seqs.size(), -1);
  for (int32_t j = 0; j < n; ++j) {
    const SeqStep& s = plan.seqs[g.members[j]];
    local[g.members[j]] = j;
    views[j] = kv_pool_->view(il, s.blocks->data());
    args[j] = DecodeArgs{&q_[row[g.members[j]] * c.q_dim()], &attn_[row[g.members[j]] * c.q_dim()], c.n_heads, s.pos0,
                         c.attn_scale};
    grouped[g.members[j]] = 1;
  }
  std::vector<ref::SharedSegment> segments;
  for (const SharedSpan& span : g.segments) {
    ref::SharedSegment seg{&views[local[span.members[0]]], span.begin, span.end, {}};
    for (int32_t m : span.members) seg.members.push_back(local[m]);
    segments.push_back(std::move(seg));
  }
  kv_read_bytes_[static_cast<int>(PolicyKind::kDense)] +=
      cpu::bifurcated_decode(*threads_, segments, views.data(), args.data(), n);
}

std::array<int64_t, kPolicyKinds> Model::take_kv_read_bytes() {
  const std::array<int64_t, kPolicyKinds> out = kv_read_bytes_;
  kv_read_bytes_.fill(0);
  return out;
}

void Model::attention_layer(const BatchPlan& plan, int32_t il) {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_.layers[il];
  const LayerConfig& lc = c.layers[il];
  const int64_t T = static_cast<int64_t>(positions_.size());
  ThreadPool& pool = *threads_;
  const cpu::Precision prec = options_.precision;

  cpu::rms_norm(x_.data(), L.attn_norm.data(), xn_.data(), T, c.dim, c.rms_eps);
  // Q, K and V share their input: one pool job (the input is quantized once).
  const cpu::MatmulTarget qkv[] = {{L.wq.type, L.wq.data, L.wq.rows, q_.data(), L.wq.packed.get()},
                                   {L.wk.type, L.wk.data, L.wk.rows, k_.data(), L.wk.packed.get()},
                                   {L.wv.type, L.wv.data, L.wv.rows, v_.data(), L.wv.packed.get()}};
  cpu::matmul_group(pool, qkv, 3, L.wq.cols, xn_.data(), T, prec);
  for (int64_t r = 0; r < T; ++r) {
    if (!L.bq.empty()) cpu::add_inplace(&q_[r * c.q_dim()], L.bq.data(), c.q_dim());
    if (!L.bk.empty()) cpu::add_inplace(&k_[r * c.kv_dim()], L.bk.data(), c.kv_dim());
    if (!L.bv.empty()) cpu::add_inplace(&v_[r * c.kv_dim()], L.bv.data(), c.kv_dim());
  }
  if (c.qk_norm) {
    cpu::rms_norm(q_.data(), L.q_norm.data(), q_.data(), T * c.n_heads, c.head_dim, c.rms_eps);
    cpu::rms_norm(k_.data(), L.k_norm.data(), k_.data(), T * c.n_kv_heads, c.head_dim, c.rms_eps);
  }
  const float* cos_t = lc.sliding ? rope_cos_local_.data() : rope_cos_.data();
  const float* sin_t = lc.sliding ? rope_sin_local_.data() : rope_sin_.data();
  cpu::rope_apply(q_.data(), T, c.n_heads, c.head_dim, c.rope_dim, c.rope_neox, cos_t, sin_t);
  cpu::rope_apply(k_.data(), T, c.n_kv_heads, c.head_dim, c.rope_dim, c.rope_neox, cos_t, sin_t);

  // Append K/V of every token to its sequence's blocks, then attend per sequence. A one-token
  // step with a sparse policy goes through it on the layers the policy covers.
  BlockPool& kv = *kv_pool_;
  int64_t t = 0;
  for (const SeqStep& s : plan.seqs)
    for (size_t i = 0; i < s.tokens.size(); ++i, ++t)
      kv.append(il, s.blocks->data(), s.pos0 + static_cast<int32_t>(i), &k_[t * c.kv_dim()], &v_[t * c.kv_dim()]);
  // Groups first (global layers only: a sliding window cuts the shared prefix differently per member).
  std::vector<char> grouped(plan.seqs.size(), 0);
  if (!lc.sliding)
    for (const AttentionGroup& g : plan.groups) grouped_attention(plan, g, il, grouped);
  t = 0;
  for (size_t si = 0; si < plan.seqs.size(); ++si) {
    const SeqStep& s = plan.seqs[si];
    if (grouped[si]) {
      t += static_cast<int64_t>(s.tokens.size());
      continue;
    }
    const PagedKvView view = kv.view(il, s.blocks->data());
    const int32_t n = static_cast<int32_t>(s.tokens.size());
    if (observer_ && n == 1)
      observer_(il, lc.sliding, view, DecodeArgs{&q_[t * c.q_dim()], &attn_[t * c.q_dim()], c.n_heads, s.pos0, c.attn_scale});
    const bool decode = n == 1 && s.policy != nullptr;
    if (decode && layer_uses_policy(*s.policy, il, lc.sliding)) {
      const DecodeArgs args{&q_[t * c.q_dim()], &attn_[t * c.q_dim()], c.n_heads, s.pos0, c.attn_scale};
      kv_read_bytes_[static_cast<int>(s.policy->kind)] +=
          decode_attention(pool, view, args, *s.policy, s.policy_state->layers[il]);
    } else {
      const AttentionArgs args{&q_[t * c.q_dim()], &attn_[t * c.q_dim()], n, c.n_heads, s.pos0, lc.window, c.attn_scale};
      cpu::paged_attention(pool, view, args);
      const int64_t keys = lc.window > 0 ? std::min(s.pos0 + 1, lc.window) : s.pos0 + 1;
      if (decode) kv_read_bytes_[static_cast<int>(s.policy->kind)] += dense_kv_bytes(view, keys);
    }
    t += n;
  }

  cpu::matmul(pool, L.wo.type, L.wo.data, L.wo.rows, L.wo.cols, attn_.data(), T, proj_.data(), prec, L.wo.packed.get());
  if (c.post_norms) cpu::rms_norm(proj_.data(), L.post_attn_norm.data(), proj_.data(), T, c.dim, c.rms_eps);
  cpu::add_inplace(x_.data(), proj_.data(), T * c.dim);
}

void Model::mlp_layer(int32_t il) {
  const ModelConfig& c = config_;
  const LayerWeights& L = weights_.layers[il];
  const int64_t T = static_cast<int64_t>(positions_.size());
  ThreadPool& pool = *threads_;
  const cpu::Precision prec = options_.precision;

  cpu::rms_norm(x_.data(), L.ffn_norm.data(), xn_.data(), T, c.dim, c.rms_eps);
  const cpu::MatmulTarget gate_up[] = {{L.w_gate.type, L.w_gate.data, L.w_gate.rows, gate_.data(), L.w_gate.packed.get()},
                                       {L.w_up.type, L.w_up.data, L.w_up.rows, up_.data(), L.w_up.packed.get()}};
  cpu::matmul_group(pool, gate_up, 2, L.w_gate.cols, xn_.data(), T, prec);
  if (c.activation == Activation::kSilu)
    cpu::silu_mul(gate_.data(), up_.data(), T * c.ffn_dim);
  else
    cpu::gelu_tanh_mul(gate_.data(), up_.data(), T * c.ffn_dim);
  cpu::matmul(pool, L.w_down.type, L.w_down.data, L.w_down.rows, L.w_down.cols, gate_.data(), T, proj_.data(), prec,
              L.w_down.packed.get());
  if (c.post_norms) cpu::rms_norm(proj_.data(), L.post_ffn_norm.data(), proj_.data(), T, c.dim, c.rms_eps);
  cpu::add_inplace(x_.data(), proj_.data(), T * c.dim);
}

}  // namespace fathom
