#pragma once
// The CPU backend: weights read in place from the mapping (or repacked into 16-row panels for the
// AVX-512 VNNI kernels), KV storage in host memory, a thread pool, and the forward ops over
// kernels/cpu (AVX-512 / AVX2 / portable, chosen at run time). Implements every policy and
// bifurcated groups.
#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/expert_routing.h"
#include "engine/backend/cpu/cpu_hot_rows.h"
#include "engine/backend/cpu/kv_storage.h"
#include "engine/model/weights.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace fathom {

class CpuBackend final : public Backend {
 public:
  // Throws fathom::Error for bad KV options (block size, a budget that holds no block).
  CpuBackend(const Model& model, const ModelOptions& options);
  ~CpuBackend() override;

  std::string name() const override { return "cpu"; }
  bool implements(PolicyKind kind) const override;
  bool implements_groups() const override { return true; }
  bool implements_rollback() const override { return true; }
  void rollback_kv(int32_t seq, int32_t kept_rows) override;
  void read_running(int32_t slot, std::vector<float>& out) override;
  void write_running(int32_t slot, const std::vector<float>& in) override;
  bool forward_occupies_host() const override { return true; }
  void host_parallel_for(int64_t n, const std::function<void(int64_t)>& fn) override;
  size_t block_bytes() const override { return kv_->layout().block_bytes(); }
  // The host tier: `blocks` blocks in their own arena. The device storage gets, beyond the
  // budget, the staging slots dense attention copies host blocks into (two key chunks' worth),
  // and gives the hot-row cache (sparse decode over host rows) hot_rows_percent of what the page
  // table does not need of its budget.
  int32_t reserve_host_tier(int32_t blocks, int32_t keep_device_blocks) override;
  // With a host tier: the device storage's shared blocks (CpuKvStorage), one layer's bytes of
  // them taken from the budget in whole blocks.
  int32_t reserve_recompute_scratch(int32_t blocks) override;
  int32_t recompute_slot(int32_t i) const override { return kv_->first_shared() + i; }

  // Direct access for tests and bench/ tools (the engine goes through Backend only).
  CpuKvStorage& kv_storage() { return *kv_; }
  ThreadPool& threads() { return *threads_; }

  // Analysis hook (bench/ tools, not the server): called for every one-token step of every
  // layer that is not in a bifurcated group, after its K/V were appended and before attention
  // runs, with the view and the query.
  using AttentionObserver = std::function<void(int32_t layer, bool sliding, const PagedKvView& kv, const DecodeArgs& q)>;
  void set_attention_observer(AttentionObserver observer) { observer_ = std::move(observer); }

 protected:
  void copy_block_impl(int32_t src, int32_t dst) override { kv_->copy_block(src, dst); }
  void read_block_impl(int32_t block, std::byte* dst) override { kv_->read_block(block, dst); }
  void write_block_impl(int32_t block, const std::byte* src) override { kv_->write_block(block, src); }
  void copy_slot_impl(KvTier from, int32_t from_slot, KvTier to, int32_t to_slot) override;
  void exchange_slots_impl(int32_t device_slot, int32_t host_slot) override;

  void begin_pass(const BatchPlan& plan) override;
  void rms_norm(Act in, Act out, int32_t layer, LayerVector w, int64_t rows, int32_t width) override;
  void matmul(int32_t layer, std::span<const MatmulOut> outs, Act in) override;
  void add_bias(Act x, int32_t layer, LayerVector bias) override;
  void rope(int32_t layer) override;
  void append_kv(int32_t layer) override;
  void attend_dense(int32_t layer, int32_t seq, int32_t window) override;
  int64_t attend_sparse(int32_t layer, int32_t seq, const AttentionPolicy& policy, LayerPolicyState& state) override;
  // With a step per thread at least, all resident and no observer: a step whose cost is over an
  // even share of the rest runs alone over the pool, as do the smallest beyond a whole number per
  // thread; the others go out one step per thread at a time, largest first, each on its thread's
  // Serial stand-in of the pool (the same split of the work, so bitwise the same output), so that
  // no thread waits at a join per step or through another step's serial sections (SWA's
  // selection and mass fold, SparQ's and HiP's top-k). Else one after the other, over the pool.
  void attend_decodes(int32_t layer, std::span<DecodeStep> steps) override;
  int64_t attend_group(int32_t layer, const AttentionGroup& group) override;
  // Measured once per break_even_probe(policy) (engine/backend/cpu/break_even.h), on first use,
  // and kept in break_evens_.
  int32_t sparse_break_even(const AttentionPolicy& policy) override;
  // Experts: the router's logits through route_tokens; each active expert's matrices as one
  // matmul (group) over its pairs' rows (gathered from kXn when the input is per token); a
  // one-token step's gate and up matrices of every active expert as one job (they share the row).
  void route_experts(int32_t layer) override;
  void expert_matmul(int32_t layer, std::span<const ExpertMatmulOut> outs, Act in) override;
  void combine_experts(Act out) override;
  void glu(Activation act) override;
  void add(Act x, Act y) override;
  void hidden(std::span<const int64_t> rows, std::vector<float>& hidden) override;
  void logits(std::span<const int64_t> rows, std::vector<float>& logits) override;

 private:
  // picked_ = the final norm of kX's `rows` (rows.size() rows of dim floats).
  void final_norm(std::span<const int64_t> rows);
  float* act(Act a) { return acts_[static_cast<int>(a)].data(); }
  const std::vector<float>& vector(int32_t layer, LayerVector v) const;
  const WeightMatrix& matrix(int32_t layer, LayerMatrix m) const;
  DecodeArgs decode_args(int32_t layer, int32_t seq);
  // Dense attention of plan.seqs[seq]'s tokens (rows of kQ to kAttn), `window` > 0 limiting it.
  AttentionArgs dense_args(int32_t layer, int32_t seq, int32_t window);
  // The layer's attention sinks (gpt-oss), or null.
  const float* layer_sinks(int32_t layer) const {
    const std::vector<float>& s = weights_.layers[layer].attn_sinks;
    return s.empty() ? nullptr : s.data();
  }
  void observe(int32_t layer, int32_t seq, const PagedKvView& view);
  CpuKvStorage& storage(KvTier t) { return t == KvTier::kDevice ? *kv_ : *host_kv_; }
  // True when plan.seqs[seq]'s attention (keys from block `first` on) reads a host-tier block.
  bool reads_host(int32_t seq, int32_t first_block) const;
  // Dense decode of plan.seqs[seq] instead of a sparse policy or a bifurcated group, for a
  // sequence with host-tier blocks (the hot-token cache is the sparse path's next step).
  int64_t attend_dense_decode(int32_t layer, int32_t seq);
  // A resident sequence's one-token step on `pool` (the pool or a Serial stand-in).
  void attend_resident_decode(ThreadPool& pool, int32_t layer, DecodeStep& step);

  ModelOptions options_;
  ModelWeights weights_;  // the model's views; quantized matrices repacked when options_.pack_weights
  std::unique_ptr<ThreadPool> threads_;
  std::vector<std::unique_ptr<ThreadPool>> serial_pools_;  // one Serial stand-in of threads_ per thread
  std::unique_ptr<CpuKvStorage> kv_;       // device tier: kv_blocks() slots, then the staging slots
  std::unique_ptr<CpuKvStorage> host_kv_;  // host tier (null: none)
  std::unique_ptr<CpuHotRows> hot_rows_;      // with a host tier
  int32_t staging_slots_ = 0;              // device slots [kv_blocks(), + staging_slots_)
  int32_t hot_slots_ = 0;                  // then the hot rows' slots
  std::vector<std::byte> exchange_buffer_;  // one block's bytes in flight during exchange_slots
  AttentionObserver observer_;

  // The current pass: T tokens, plan.seqs[i] owns rows [first_[i], first_[i] + n).
  const BatchPlan* plan_ = nullptr;
  std::vector<int64_t> first_;
  std::vector<int32_t> positions_;                   // (T)
  std::array<std::vector<float>, 10> acts_;          // indexed by Act, (T, act_width(Act))
  std::vector<float> router_logits_;                 // (T, n_experts)
  ExpertRouting routing_;                            // the current MoE layer's
  std::vector<float> expert_in_;                     // (pairs of one expert, dim) gathered kXn rows
  std::vector<float> rope_cos_, rope_sin_;           // (T, rope_dim/2), global layers' RoPE
  std::vector<float> rope_cos_local_, rope_sin_local_;  // sliding layers' (gemma3)
  std::vector<float> picked_;                        // (rows, dim) rows whose logits or hidden states are wanted
  // Verify steps' running planes after each row's append (rollback_kv): row r of the pass's
  // verify rows holds n_layers x running_floats() floats at r * that; its block in
  // verify_blocks_. verify_first_[i]: plan.seqs[i]'s first verify row, -1 when not a verify step;
  // verify_rows_[i]: its rows.
  std::vector<float> verify_running_;
  std::vector<int32_t> verify_blocks_, verify_first_, verify_rows_;
};

}  // namespace fathom
