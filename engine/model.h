#pragma once
// A loaded model: GGUF mapping, config, weights, tokenizer, chat template, paged KV pool, and
// the forward pass on the CPU backend. forward() runs a whole BatchPlan (several sequences,
// prefill chunks and decode tokens mixed) as one pass: every matmul sees all T tokens.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/batch_plan.h"
#include "engine/kv/block_pool.h"
#include "engine/model/chat_template.h"
#include "engine/model/model_config.h"
#include "engine/model/tokenizer.h"
#include "engine/model/weights.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace fathom {

class GgufFile;

struct ModelOptions {
  int threads = 0;                 // 0: hardware concurrency
  KvDtype kv_dtype = KvDtype::kF16;
  bool kv_transposed_k = true;     // keep K a second time per block, dimension-major (SparQ step 1)
  int32_t block_size = 16;         // tokens per KV block
  int64_t kv_cache_bytes = 0;      // 0: room for context_length tokens of one sequence, plus slack
  cpu::Precision precision = cpu::Precision::kQ8;
  bool pack_weights = true;        // kQ8 on the CPU: repack quantized matrices into 16-row panels at load (PackedWeights)
  std::string chat_template;       // family name; empty: detect from the GGUF
  std::string backend = "cpu";     // "cpu", or "cuda" (needs a build with the CUDA backend and a GPU)
};

class ForwardBackend;

class Model {
 public:
  // Throws fathom::Error with a one-line reason for anything wrong with the file or options.
  static std::unique_ptr<Model> load(const std::string& path, const ModelOptions& options);
  ~Model();

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // Throws fathom::Error when the model has no chat template and none was configured.
  const ChatTemplate& chat_template() const;
  BlockPool& kv_pool() { return *kv_pool_; }
  ThreadPool& threads() { return *threads_; }
  const ModelOptions& options() const { return options_; }
  int32_t vocab() const { return static_cast<int32_t>(weights_.output.rows); }

  // Runs the plan on the CPU; `logits` receives plan.logits_rows() rows of vocab() floats.
  void forward(const BatchPlan& plan, std::vector<float>& logits);

  // The backend the engine drives (engine/backend/backend.h): the CPU forward above, or the
  // device backend chosen by ModelOptions::backend. Block data moves go through it too.
  ForwardBackend& backend() { return *backend_; }
  // Registers how "cuda" backends are made (the fathom executable does, when built with
  // CUDA); without one, ModelOptions::backend = "cuda" is a load error.
  using BackendFactory = std::function<std::unique_ptr<ForwardBackend>(Model&)>;
  static void set_cuda_backend_factory(BackendFactory factory);

  // Analysis hook (bench/ tools, not the server): called for every one-token step of every
  // layer after its K/V were appended and before attention runs, with the view and the query.
  using AttentionObserver = std::function<void(int32_t layer, bool sliding, const PagedKvView& kv, const DecodeArgs& q)>;
  void set_attention_observer(AttentionObserver observer) { observer_ = std::move(observer); }

  // KV bytes read by decode attention since the last call, per policy of the reading request
  // (indexed by PolicyKind), then reset. Prefill reads are not counted.
  std::array<int64_t, kPolicyKinds> take_kv_read_bytes();

 private:
  Model() = default;
  void attention_layer(const BatchPlan& plan, int32_t layer);
  void mlp_layer(int32_t layer);
  // Bifurcated attention of one group's decode tokens on layer `layer`; marks its members.
  void grouped_attention(const BatchPlan& plan, const AttentionGroup& g, int32_t layer, std::vector<char>& grouped);

  ModelOptions options_;
  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  void pack_weights();  // ModelOptions::pack_weights: repack, then release the mapped originals
  ModelWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  std::unique_ptr<BlockPool> kv_pool_;
  std::unique_ptr<ThreadPool> threads_;
  std::array<int64_t, kPolicyKinds> kv_read_bytes_{};
  AttentionObserver observer_;
  std::unique_ptr<ForwardBackend> backend_;

  // Activations of the current pass, T = tokens in the plan.
  std::vector<int32_t> positions_;        // (T)
  std::vector<float> x_, xn_;             // (T, dim) residual stream, normalised copy
  std::vector<float> q_, k_, v_, attn_;   // (T, q_dim) (T, kv_dim) (T, kv_dim) (T, q_dim)
  std::vector<float> proj_;               // (T, dim)
  std::vector<float> gate_, up_;          // (T, ffn_dim)
  std::vector<float> rope_cos_, rope_sin_;  // (T, rope_dim/2), per distinct rope config
  std::vector<float> rope_cos_local_, rope_sin_local_;
};

}  // namespace fathom
