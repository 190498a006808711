// The CUDA backend (contract: engine/backend/cuda/cuda_backend.h): the forward ops of
// engine/forward_ops.h as launchers of kernels/cuda, over device weights, activations and KV.
// The same source builds with nvcc (fathom_cuda_backend) and with the host compiler through
// kernels/cuda/emu (tests/kernel/test_cuda_forward.cpp).
//
// Per op, T = tokens in the plan, one launch over all T rows: embedding_lookup, rms_norm,
// quant_gemv / dequantize + gemm_f16, add_bias, rope (angle cache indexed by absolute position,
// global and local tables), kv_append (all sequences at once), paged_decode_attention per
// sequence, glu, add_inplace; logits: gather the wanted rows, rms_norm, output matmul, one copy
// to the host.
#include "engine/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "engine/backend/cuda/bifurcated_groups.h"
#include "engine/backend/cuda/cuda_policies.h"
#include "engine/backend/cuda/device_array.h"
#include "engine/backend/cuda/kv_storage.h"
#include "engine/backend/cuda/pass_uploads.h"
#include "engine/expert_routing.h"
#include "engine/kv/hot_rows.h"
#include "engine/model/model.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kv_append.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/paged_decode_attention.h"
#include "kernels/cuda/quant_gemv.h"
#include "kernels/cuda/rms_norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/hot_rows.h"
#include "kernels/ref/hip.h"

namespace fathom {
namespace cuda_backend_detail {  // named: unique across the CUDA sources

// A weight matrix on the device: y = x · Wᵀ maps cols -> rows.
struct DevMatrix {
  GgmlType type = GgmlType::F16;  // a has_gemv format as stored, or F16 (dequantized at load)
  const void* data = nullptr;     // [rows] rows of ggml_row_size(type, cols) bytes
  int64_t rows = 0, cols = 0;
};

inline bool has_gemv(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0: case GgmlType::IQ4_NL: case GgmlType::MXFP4: case GgmlType::Q2_K: case GgmlType::Q3_K:
    case GgmlType::Q4_K: case GgmlType::Q6_K: case GgmlType::IQ4_XS: return true;
    default: return false;
  }
}

struct DevLayer {
  DeviceArray<float> attn_norm, ffn_norm;            // (dim)
  DeviceArray<float> bq, bk, bv;                     // (q_dim) (kv_dim) (kv_dim), or null
  DeviceArray<float> bo;                             // (dim), or null
  DeviceArray<float> attn_sinks;                     // (n_heads), gpt-oss, or null
  DeviceArray<float> q_norm, k_norm;                 // (head_dim), gemma3
  DeviceArray<float> post_attn_norm, post_ffn_norm;  // (dim), gemma3
  DevMatrix wq, wk, wv, wo, w_gate, w_up, w_down;  // empty (null data) where the model has none
  // Experts (ModelConfig::moe()): the router, dequantized to f32 (its top-k must not move with f16
  // rounding), and each of the three stacked: n_experts · rows of one expert, expert e's rows at
  // e · (bytes / n_experts).
  DeviceArray<float> router;  // (n_experts, dim)
  DevMatrix gate_exps, up_exps, down_exps;
  DeviceArray<float> gate_exps_bias, up_exps_bias, down_exps_bias;  // gpt-oss: (n_experts, rows), or null
  std::vector<float> router_bias;  // gpt-oss (n_experts), added on the host before routing
};

// Decode-sized batches (<= cuda::kQuantGemvMaxRows rows) read quantized weights through one
// quant_gemv launch; larger ones dequantize kDequantChunk floats of W at a time for the GEMM.
constexpr int64_t kGemvRows = 4;  // the experts' grouped GEMV: pairs of an expert a run
constexpr int64_t kDequantChunk = int64_t{16} << 20;

inline KvLayout cuda_layout(const Model& model, const ModelOptions& o) {
  const ModelConfig& c = model.config();
  return KvLayout{c.n_layers, c.n_kv_heads, c.head_dim, o.block_size, o.kv_dtype, o.kv_transposed_k};
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(const Model& model, const ModelOptions& options);
  ~CudaBackend() override;

  std::string name() const override { return "cuda"; }
  bool implements(PolicyKind kind) const override { return kind == kDensePolicy || cuda_step_of(kind) != nullptr; }
  bool implements_groups() const override { return true; }
  size_t block_bytes() const override { return kv_layout().block_bytes(); }
  bool implements_rollback() const override { return true; }
  void rollback_kv(int32_t seq, int32_t kept_rows) override;
  void read_running(int32_t slot, std::vector<float>& out) override;
  void write_running(int32_t slot, const std::vector<float>& in) override;

 protected:
  void copy_block_impl(int32_t src, int32_t dst) override {
    wait_for_moves();
    kv_->copy_block(src, dst);
  }
  void read_block_impl(int32_t block, std::byte* dst) override {
    wait_for_moves();
    kv_->read_block(block, dst);
  }
  void write_block_impl(int32_t block, const std::byte* src) override {
    wait_for_moves();
    kv_->write_block(block, src);
  }
  int32_t reserve_host_tier(int32_t blocks, int32_t keep_device_blocks) override;
  // With a host tier: CudaKvStorage's shared blocks (one allocation per plane, every layer's blocks
  // then the scratch; each layer reads its own translation of the tables), one layer's bytes of
  // them taken from the budget in whole blocks.
  int32_t reserve_recompute_scratch(int32_t blocks) override;
  int32_t recompute_slot(int32_t i) const override { return kv_->num_blocks() + i; }
  void finish_moves() override { wait_for_moves(); }
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
  int64_t attend_group(int32_t layer, const AttentionGroup& group) override;
  // Experts: the router's logits on the device (grouped_gemv over f32), copied to the host, which
  // picks the top-k (route_tokens: the CPU's code, so both backends route alike) and uploads the
  // pair tables; one grouped launch per projection over every active expert (per 65535 runs of
  // pairs): grouped_gemm over runs of <= 64 pairs when some expert has more than 4 pairs (a
  // prefill: an expert with n pairs read ceil(n / 64) times), else grouped_gemv over runs of <= 4
  // (decode: each active expert read once).
  void route_experts(int32_t layer) override;
  void expert_matmul(int32_t layer, std::span<const ExpertMatmulOut> outs, Act in) override;
  void combine_experts(Act out) override;
  void glu(Activation act) override;
  void add(Act x, Act y) override;
  void hidden(std::span<const int64_t> rows, std::vector<float>& hidden) override;
  void logits(std::span<const int64_t> rows, std::vector<float>& logits) override;

 private:
  // picked_ = the final norm of kX's `rows` (rows.size() rows of dim floats; none: nothing).
  void final_norm(std::span<const int64_t> rows);
  DevMatrix upload_matrix(const WeightMatrix& w);
  static DeviceArray<float> upload_vector(const std::vector<float>& v) {
    DeviceArray<float> d;
    if (!v.empty()) d.upload(v);
    return d;
  }
  float* act(Act a) { return acts_[static_cast<int>(a)].get(); }
  const float* vector(int32_t layer, LayerVector v) const;
  const DevMatrix& matrix(int32_t layer, LayerMatrix m) const;
  DecodeArgs decode_args(int32_t layer, int32_t seq);
  const float* layer_sinks(int32_t layer) const { return layers_[layer].attn_sinks.get(); }
  // `layer`'s view through a device block table: both tiers, and the host-read counter.
  PagedKvView view(int32_t layer, const int32_t* device_table) const;
  // Moves between the tiers run on copy_stream_; work outside that stream that touches KV waits
  // for them: the host (synchronous copies), or the compute stream (a pass, without blocking).
  void begin_moves();
  void wait_for_moves();
  // After a pass's last op (logits): takes the bytes the pass's kernels read from the host tier.
  void end_pass();
  // The hot-row cache (reserve_host_tier, with hot_rows_percent > 0): before a sparse attention reads
  // the rows it selects — positions_of(g, pos) lists kv head g's, ascending — copies in those of
  // `layer` in the host tier (one launch), and brings the device map up to date (also after
  // invalidations, at the start of a pass). For the policies that gather rows (their CUDA steps
  // call it through CudaPolicyContext::cache_rows); hits and misses are counted to `kind`.
  void cache_rows(int32_t layer, int32_t seq, PolicyKind kind, const RowsOf& positions_of);
  void upload_row_map_changes();
  // After a failed copy or map upload: the host bookkeeping may name rows the device never got, so
  // both forget every row (the kernels then read the host tier in place).
  void reset_hot_rows();
  void ensure_rope_rows(int32_t rows);
  void matmul(const DevMatrix& w, const float* x, int64_t m, float* y);
  // cuda::grouped_gemm (gemm) or cuda::grouped_gemv over any number of items (launches of at most
  // 65535: the grid's y).
  void grouped_matmul(bool gemm, GgmlType type, const void* w, int64_t stride, int64_t n_out, int64_t k,
                      const float* x, float* y, const cuda::ExpertRows* items, int32_t n_items);

  ModelConfig config_;
  int32_t num_blocks_;
  std::unique_ptr<CudaKvStorage> kv_;
  // The host tier (reserve_host_tier): page-locked host memory the kernels read in place; block
  // moves between the tiers are async copies on copy_stream_ (non-blocking, so they overlap
  // whatever the host does meanwhile), ordered after the compute stream's queued work
  // (compute_done_) and waited for through moves_done_.
  std::unique_ptr<CudaKvStorage> host_kv_;
  cudaStream_t copy_stream_ = nullptr;
  cudaEvent_t moves_done_ = nullptr, compute_done_ = nullptr;
  bool moves_pending_ = false;
  std::unique_ptr<CudaKvStorage> exchange_;  // one device block: an exchange's third place
  // The device hot-row cache of the host tier (HiP's offloading "sparse K/V cache"): pool rows in
  // device slots [num_blocks_, num_blocks_ + hot slots) of kv_, the bookkeeping on the host
  // (engine/kv/hot_rows.h), its map mirrored in row_map_ ([layer][map_size]) for the kernels.
  int32_t hot_rows_percent_ = 0;
  std::unique_ptr<HotRows> hot_rows_;
  DeviceArray<int32_t> row_map_;
  PassUploads uploads_;      // the hot-row cache's copy lists and map changes, read by its kernels in place
  bool pass_open_ = false;   // a pass began and has not reached its logits (abandoned if still set)
  DeviceArray<unsigned long long> host_read_;  // bytes the kernels read from the host tier this pass
  PolicyScratch scratch_;
  cudaStream_t stream_ = nullptr;  // the default stream: the final copy to the host synchronises
  cuda::GemmHandle* gemm_ = nullptr;
  std::vector<DeviceArray<std::byte>> matrix_storage_;
  std::map<const void*, DevMatrix> uploaded_;  // host data -> device matrix (tied embeddings)
  DevMatrix token_embd_, output_;
  DeviceArray<float> output_norm_;
  std::vector<DevLayer> layers_;
  DeviceArray<int32_t> row_ids_;  // 0, 1, ..., max rows of a quantized matrix (dequantization ids)

  // RoPE angle caches, row p = cpu::rope_table at position p: [rope_rows_][rope_dim / 2].
  int32_t rope_rows_ = 0;
  DeviceArray<float> rope_cos_, rope_sin_, rope_cos_local_, rope_sin_local_;

  // The current pass (T tokens, S sequences).
  const BatchPlan* plan_ = nullptr;
  int64_t T_ = 0;
  std::vector<int64_t> first_;            // plan.seqs[i] owns rows [first_[i], first_[i] + n)
  DeviceArray<int32_t> ids_, positions_;  // (T)
  DeviceArray<int32_t> seq_start_;        // (S + 1) token CSR
  // Verify steps (SeqStep::verify; rollback_kv): the running planes after each verify row's append,
  // [n_layers][verify_total_][n_kv_heads][3][head_dim]; plan.seqs[i]'s first row verify_first_[i]
  // (-1: not a verify step; also on the device for kv_append), its rows verify_rows_[i], each row's
  // block verify_blocks_.
  DeviceArray<float> verify_running_;
  DeviceArray<int32_t> verify_first_dev_;
  std::vector<int32_t> verify_first_, verify_rows_, verify_blocks_;
  int64_t verify_total_ = 0;
  size_t running_floats() const { return static_cast<size_t>(config_.n_kv_heads) * 3 * config_.head_dim; }
  DeviceArray<float> running_io_;  // read_running / write_running: [n_layers][n_kv_heads][3][head_dim]
  DeviceArray<int32_t> tables_;           // (S, table_stride_) block tables, padded with 0 ...
  int32_t table_stride_ = 0;
  bool tables_per_layer_ = false;         // ... (n_layers, S, table_stride_) when they name the scratch
  // `layer`'s block tables (the recompute scratch's entries translated for it).
  const int32_t* layer_tables(int32_t layer) const {
    return tables_.get() + (tables_per_layer_ ? static_cast<size_t>(layer) * plan_->seqs.size() * table_stride_ : 0);
  }
  const int32_t* seq_table(int32_t layer, int32_t seq) const {
    return layer_tables(layer) + static_cast<size_t>(seq) * table_stride_;
  }
  std::array<DeviceArray<float>, 10> acts_;  // indexed by Act, (T, act_width(Act))
  // The current MoE layer's routing (host) and its tables in uploads_: pair_token, pair_weight,
  // token_pair (ExpertRouting's), items (runs of pairs of one expert: <= 64 for grouped_gemm where
  // expert_gemm_, else <= 4 for grouped_gemv).
  ExpertRouting routing_;
  std::vector<float> router_host_;   // (T, n_experts)
  DeviceArray<float> router_logits_;  // (T, n_experts)
  DeviceArray<float> expert_in_;      // (pairs, dim): kXn's rows gathered in pair order
  const int32_t* pair_token_ = nullptr;
  const float* pair_weight_ = nullptr;
  const int32_t* token_pair_ = nullptr;
  const int32_t* pair_expert_ = nullptr;  // (pairs) gpt-oss: each pair's expert
  const cuda::ExpertRows* expert_items_ = nullptr;
  int32_t n_expert_items_ = 0;
  bool expert_gemm_ = false;
  DeviceArray<float> attn_workspace_;
  DeviceArray<__half> act16_;        // (T, max in-features): the GEMM's f16 activations
  DeviceArray<__half> w16_;          // (kDequantChunk): a dequantized chunk of W
  DeviceArray<float> picked_, logits_;  // (rows, dim) (rows, vocab)
};

CudaBackend::CudaBackend(const Model& model, const ModelOptions& options)
    : Backend(model, cuda_layout(model, options),
              kv_blocks_for_budget(model, options, cuda_layout(model, options).block_bytes())),
      config_(model.config()),
      num_blocks_(kv_blocks()),
      hot_rows_percent_(options.hot_rows_percent) {
  const ModelConfig& c = config_;
  if (c.head_dim > 256) throw Error("--backend cuda: head_dim " + std::to_string(c.head_dim) + " > 256 is not supported");
  FATHOM_CUDA_BACKEND_OK(cuda::gemm_create(&gemm_));
  const ModelWeights& w = model.weights();
  token_embd_ = upload_matrix(w.token_embd);
  output_ = upload_matrix(w.output);
  output_norm_ = upload_vector(w.output_norm);
  int64_t max_rows = std::max(token_embd_.rows, output_.rows);
  kv_ = std::make_unique<CudaKvStorage>(kv_layout(), num_blocks_);
  layers_.resize(c.n_layers);
  std::deque<std::vector<std::byte>> expert_copies;  // experts stored one tensor each, stacked for upload
  for (int32_t il = 0; il < c.n_layers; ++il) {
    const LayerWeights& L = w.layers[il];
    DevLayer& D = layers_[il];
    D.attn_norm = upload_vector(L.attn_norm);
    D.ffn_norm = upload_vector(L.ffn_norm);
    D.bq = upload_vector(L.bq);
    D.bk = upload_vector(L.bk);
    D.bv = upload_vector(L.bv);
    D.bo = upload_vector(L.bo);
    D.attn_sinks = upload_vector(L.attn_sinks);
    D.gate_exps_bias = upload_vector(L.gate_exps_bias);
    D.up_exps_bias = upload_vector(L.up_exps_bias);
    D.down_exps_bias = upload_vector(L.down_exps_bias);
    D.router_bias = L.router_bias;
    D.q_norm = upload_vector(L.q_norm);
    D.k_norm = upload_vector(L.k_norm);
    D.post_attn_norm = upload_vector(L.post_attn_norm);
    D.post_ffn_norm = upload_vector(L.post_ffn_norm);
    D.wq = upload_matrix(L.wq);
    D.wk = upload_matrix(L.wk);
    D.wv = upload_matrix(L.wv);
    D.wo = upload_matrix(L.wo);
    D.w_gate = upload_matrix(L.w_gate);
    D.w_up = upload_matrix(L.w_up);
    D.w_down = upload_matrix(L.w_down);
    if (c.moe()) {
      std::vector<float> router(static_cast<size_t>(L.router.rows * L.router.cols));
      for (int64_t r = 0; r < L.router.rows; ++r)
        cpu::dequantize_row(L.router.type, L.router.data, L.router.cols, r, &router[r * L.router.cols]);
      D.router.upload(router);
      // One matrix of all the experts' rows: their views where they are consecutive in the mapping
      // (stacked ffn_*_exps), else a host copy of them in order (one tensor per expert), kept until
      // the uploads are done (upload_matrix knows a matrix by its address).
      const auto stacked = [&](const std::vector<WeightMatrix>& v) {
        const size_t bytes = v[0].bytes();
        bool consecutive = true;
        for (size_t e = 0; e < v.size(); ++e)
          consecutive = consecutive && v[e].data == static_cast<const std::byte*>(v[0].data) + e * bytes;
        const void* data = v[0].data;
        if (!consecutive) {
          std::vector<std::byte>& copy = expert_copies.emplace_back(bytes * v.size());
          for (size_t e = 0; e < v.size(); ++e)
            std::memcpy(copy.data() + e * bytes, v[e].data, bytes);
          data = copy.data();
        }
        return WeightMatrix{v[0].type, data, v[0].rows * static_cast<int64_t>(v.size()), v[0].cols, nullptr};
      };
      D.gate_exps = upload_matrix(stacked(L.gate_exps));
      D.up_exps = upload_matrix(stacked(L.up_exps));
      D.down_exps = upload_matrix(stacked(L.down_exps));
    }
    for (const DevMatrix* m : {&D.wq, &D.wk, &D.wv, &D.wo, &D.w_gate, &D.w_up, &D.w_down})
      max_rows = std::max(max_rows, m->rows);
  }
  std::vector<int32_t> ids(static_cast<size_t>(max_rows));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  row_ids_.upload(ids);
}


CudaBackend::~CudaBackend() {
  if (copy_stream_ != nullptr) {
    cudaStreamSynchronize(copy_stream_);
    cudaStreamDestroy(copy_stream_);
    cudaEventDestroy(moves_done_);
    cudaEventDestroy(compute_done_);
  }
  cuda::gemm_destroy(gemm_);
}

int32_t CudaBackend::reserve_host_tier(int32_t blocks, int32_t keep_device_blocks) {
  FATHOM_CHECK(!host_kv_ && plan_ == nullptr, "the host tier is reserved once, before the first forward");
  if (blocks <= 0) return 0;
#ifndef FATHOM_CUDA_EMULATION
  // The kernels read the host tier through mapped pointers, and moves use cudaMemcpyDefault.
  int device = 0, can_map = 0, unified = 0;
  FATHOM_CUDA_BACKEND_OK(cudaGetDevice(&device));
  FATHOM_CUDA_BACKEND_OK(cudaDeviceGetAttribute(&can_map, cudaDevAttrCanMapHostMemory, device));
  FATHOM_CUDA_BACKEND_OK(cudaDeviceGetAttribute(&unified, cudaDevAttrUnifiedAddressing, device));
  if (!can_map || !unified)
    throw Error("--backend cuda: the GPU cannot map host memory with unified addressing: the host KV tier "
                "(kv_cache.host_mib) needs it; set kv_cache.host_mib to 0");
#endif
  // Beyond what the page table must keep, hot_rows_percent of the device budget becomes the row
  // cache (0: none; the kernels then read every host row in place).
  // The device map (4 bytes per layer, host row and kv head) is paid for from the same budget.
  const KvLayout& L = kv_layout();
  const int32_t map_blocks = hot_rows_map_blocks(L, blocks);
  const int32_t budget = kv_blocks();
  const int32_t hot = hot_rows_slots(budget, keep_device_blocks, hot_rows_percent_) - map_blocks;
  const bool words = L.head_dim * kv_dtype_bytes(L.dtype) % 4 == 0;  // copy_kv_rows copies 4-byte words
  if (hot > 0 && words) {
    if (budget - hot < 3)
      throw Error("the device KV tier holds " + std::to_string(budget) +
                  " blocks: a host tier with a hot-row cache needs at least 4 (raise kv_cache.device_mib)");
    set_kv_blocks(budget - hot - map_blocks);
    num_blocks_ = kv_blocks();
    kv_.reset();
    kv_ = std::make_unique<CudaKvStorage>(kv_layout(), num_blocks_ + hot);
    hot_rows_ = std::make_unique<HotRows>(L.n_layers, L.n_kv_heads, L.block_size, blocks, num_blocks_, hot,
                                            /*track_changes=*/true);
    row_map_.reserve(static_cast<size_t>(L.n_layers) * hot_rows_->map_size());
    FATHOM_CUDA_BACKEND_OK(cudaMemset(row_map_.get(), 0xFF, static_cast<size_t>(L.n_layers) *
                                                                 hot_rows_->map_size() * sizeof(int32_t)));  // all -1
  }
  host_kv_ = std::make_unique<CudaKvStorage>(kv_layout(), blocks, Memory::kMappedHost);
  exchange_ = std::make_unique<CudaKvStorage>(kv_layout(), 1);
  host_read_.reserve(1);
  FATHOM_CUDA_BACKEND_OK(cudaMemset(host_read_.get(), 0, sizeof(unsigned long long)));
  FATHOM_CUDA_BACKEND_OK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  FATHOM_CUDA_BACKEND_OK(cudaEventCreateWithFlags(&moves_done_, cudaEventDisableTiming));
  FATHOM_CUDA_BACKEND_OK(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming));
  return blocks;
}

int32_t CudaBackend::reserve_recompute_scratch(int32_t blocks) {
  FATHOM_CHECK(plan_ == nullptr && kv_->shared_blocks() == 0, "the recompute scratch is reserved once, before the first forward");
  if (blocks <= 0 || !host_kv_) return 0;
  const KvLayout& L = kv_layout();
  const int32_t charge = (blocks + L.n_layers - 1) / L.n_layers, hot = kv_->num_blocks() - num_blocks_;
  if (kv_blocks() - charge < 3) return 0;
  // Made again with the scratch (nothing is stored before the first forward); the hot-row cache's
  // pool follows the page table's blocks, which shrink by the charge.
  set_kv_blocks(kv_blocks() - charge);
  num_blocks_ = kv_blocks();
  kv_.reset();
  kv_ = std::make_unique<CudaKvStorage>(L, num_blocks_ + hot, Memory::kDevice, blocks);
  if (hot_rows_)
    hot_rows_ = std::make_unique<HotRows>(L.n_layers, L.n_kv_heads, L.block_size, host_kv_->num_blocks(), num_blocks_,
                                            hot, /*track_changes=*/true);
  return blocks;
}

void CudaBackend::begin_moves() {
  // The copies may read or overwrite device slots that work queued on the compute stream uses
  // (a pass, finished or abandoned by an exception): they start after all of it.
  if (!moves_pending_) {
    FATHOM_CUDA_BACKEND_OK(cudaEventRecord(compute_done_, stream_));
    FATHOM_CUDA_BACKEND_OK(cudaStreamWaitEvent(copy_stream_, compute_done_, 0));
  }
  moves_pending_ = true;
}

void CudaBackend::wait_for_moves() {
  if (!moves_pending_) return;
  FATHOM_CUDA_BACKEND_OK(cudaEventSynchronize(moves_done_));
  moves_pending_ = false;
}

void CudaBackend::copy_slot_impl(KvTier from, int32_t from_slot, KvTier to, int32_t to_slot) {
  begin_moves();
  CudaKvStorage& src = from == KvTier::kDevice ? *kv_ : *host_kv_;
  CudaKvStorage& dst = to == KvTier::kDevice ? *kv_ : *host_kv_;
  src.copy_block_to(from_slot, dst, to_slot, copy_stream_);
  FATHOM_CUDA_BACKEND_OK(cudaEventRecord(moves_done_, copy_stream_));
  if (to == KvTier::kHost && hot_rows_) hot_rows_->invalidate_host_slot(to_slot);
}

void CudaBackend::exchange_slots_impl(int32_t device_slot, int32_t host_slot) {
  begin_moves();
  // In stream order: the device block out to the exchange block, the host block in, the exchange
  // block to the host slot (the next exchange reuses it after this one's last copy read it). The
  // exchange block is device memory: a host-to-host copy would block the host.
  kv_->copy_block_to(device_slot, *exchange_, 0, copy_stream_);
  host_kv_->copy_block_to(host_slot, *kv_, device_slot, copy_stream_);
  exchange_->copy_block_to(0, *host_kv_, host_slot, copy_stream_);
  FATHOM_CUDA_BACKEND_OK(cudaEventRecord(moves_done_, copy_stream_));
  if (hot_rows_) hot_rows_->invalidate_host_slot(host_slot);
}

PagedKvView CudaBackend::view(int32_t layer, const int32_t* device_table) const {
  PagedKvView v = kv_->view(layer, device_table);
  if (host_kv_) {
    v.host_tier = host_kv_->planes(layer);
    v.host_read_bytes = host_read_.get();
  }
  if (hot_rows_) v.host_rows = row_map_.get() + static_cast<size_t>(layer) * hot_rows_->map_size();
  return v;
}

void CudaBackend::reset_hot_rows() {
  hot_rows_->clear();
  FATHOM_CUDA_BACKEND_OK(cudaMemset(row_map_.get(), 0xFF,
                                    static_cast<size_t>(kv_layout().n_layers) * hot_rows_->map_size() * sizeof(int32_t)));
}

void CudaBackend::upload_row_map_changes() {
  const std::vector<HotRows::Change> changes = hot_rows_->take_changes();
  if (changes.empty()) return;
  // One write per index (the scatter's writes are unordered): the last of each, in log order.
  std::vector<size_t> order(changes.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return changes[a].index < changes[b].index; });
  std::vector<int64_t> index;
  std::vector<int32_t> value;
  for (size_t j = 0; j < order.size(); ++j)
    if (j + 1 == order.size() || changes[order[j + 1]].index != changes[order[j]].index) {
      index.push_back(changes[order[j]].index);
      value.push_back(changes[order[j]].value);
    }
  try {
    const int64_t* index_dev = uploads_.put(index);
    const int32_t* value_dev = uploads_.put(value);
    FATHOM_CUDA_BACKEND_OK(
        cuda::scatter_int32(row_map_.get(), index_dev, value_dev, static_cast<int32_t>(index.size()), stream_));
  } catch (...) {
    reset_hot_rows();  // the log is gone: the device map cannot be brought in step with it
    throw;
  }
}

void CudaBackend::cache_rows(int32_t layer, int32_t seq, PolicyKind kind, const RowsOf& positions_of) {
  const SeqStep& s = plan_->seqs[seq];
  if (std::none_of(s.blocks->begin(), s.blocks->end(), [](int32_t e) { return e < 0; })) return;
  const int32_t n_kv = config_.n_kv_heads, bs = kv_layout().block_size;
  const int64_t row_bytes = static_cast<int64_t>(kv_row_bytes(kv_layout().dtype, config_.head_dim));
  std::vector<cuda::KvRowCopy> copies;
  std::vector<int32_t> pos;
  for (int32_t g = 0; g < n_kv; ++g) {
    pos.clear();
    positions_of(g, pos);
    // A set whose host rows outnumber the pool (ALISA's seeding step keeps every position) would
    // only evict rows the next steps want: it is read in place.
    // (Within the pool, fetch cannot run out of rows: the positions are distinct.)
    const auto host_rows = std::count_if(pos.begin(), pos.end(), [&](int32_t t) { return (*s.blocks)[t / bs] < 0; });
    if (host_rows > hot_rows_->capacity()) continue;
    hot_rows_->fetch(layer, s.blocks->data(), g, pos.data(), static_cast<int32_t>(pos.size()), /*need_v=*/true,
                      [&](int32_t host_slot, int32_t head, int32_t offset, int64_t device_row, bool k, bool v) {
                        const int64_t src = (static_cast<int64_t>(host_slot) * n_kv + head) * bs + offset;
                        copies.push_back({src, device_row, (k ? 1 : 0) | (v ? 2 : 0)});
                        return row_bytes * ((k ? 1 : 0) + (v ? 1 : 0));
                      });
  }
  if (!copies.empty()) {
    try {
      FATHOM_CUDA_BACKEND_OK(cuda::copy_kv_rows(host_kv_->planes(layer), kv_->append_target(layer),
                                                kv_layout().dtype, uploads_.put(copies),
                                                static_cast<int32_t>(copies.size()), stream_));
    } catch (...) {
      reset_hot_rows();  // the map would name rows that were never copied
      throw;
    }
  }
  upload_row_map_changes();
  const HotRows::Counts c = hot_rows_->take_counts();
  const int k = static_cast<int>(kind);
  step_.hot_rows.hits[k] += c.hits;
  step_.hot_rows.misses[k] += c.misses;
  step_.staged_bytes += c.bytes;
}

const float* CudaBackend::vector(int32_t layer, LayerVector v) const {
  return layer_vector(layers_[layer], v).get();  // null when the model has no such vector
}

const DevMatrix& CudaBackend::matrix(int32_t layer, LayerMatrix m) const { return layer_matrix(layers_[layer], m); }

DevMatrix CudaBackend::upload_matrix(const WeightMatrix& w) {
  if (w.data == nullptr) return DevMatrix{};  // a matrix the model does not have (MoE: the dense MLP's)
  if (const auto it = uploaded_.find(w.data); it != uploaded_.end()) {
    // The same rows again (a tied embedding); a fused tensor's parts start at different rows.
    FATHOM_CHECK(it->second.rows == w.rows && it->second.cols == w.cols, "two matrices at one address");
    return it->second;
  }
  DevMatrix d{w.type, nullptr, w.rows, w.cols};
  DeviceArray<std::byte> buf;
  if (has_gemv(w.type)) {
    buf.upload(static_cast<const std::byte*>(w.data), w.bytes());
  } else {
    // No CUDA GEMV for this format: dequantize once to f16 (the GEMM's input type).
    d.type = GgmlType::F16;
    std::vector<float> row(static_cast<size_t>(w.cols));
    std::vector<__half> h(static_cast<size_t>(w.rows * w.cols));
    for (int64_t r = 0; r < w.rows; ++r) {
      cpu::dequantize_row(w.type, w.data, w.cols, r, row.data());
      for (int64_t c = 0; c < w.cols; ++c) h[r * w.cols + c] = __float2half_rn(row[c]);
    }
    buf.upload(reinterpret_cast<const std::byte*>(h.data()), h.size() * sizeof(__half));
  }
  d.data = buf.get();
  matrix_storage_.push_back(std::move(buf));
  uploaded_[w.data] = d;
  return d;
}

void CudaBackend::ensure_rope_rows(int32_t rows) {
  if (rows <= rope_rows_) return;
  const ModelConfig& c = config_;
  const int32_t n = std::max({rows, 1024, 2 * rope_rows_});
  const int32_t half = c.rope_dim / 2;
  std::vector<int32_t> pos(n);
  for (int32_t i = 0; i < n; ++i) pos[i] = i;
  std::vector<float> cos_t(static_cast<size_t>(n) * half), sin_t(cos_t.size());
  // The same tables as the CPU backend: the first global layer's config, then the first local one.
  const auto global = std::find_if(c.layers.begin(), c.layers.end(), [](const LayerConfig& l) { return !l.sliding; });
  const auto local = std::find_if(c.layers.begin(), c.layers.end(), [](const LayerConfig& l) { return l.sliding; });
  const LayerConfig& g = global != c.layers.end() ? *global : c.layers.front();
  layer_rope_table(c, g, pos.data(), n, cos_t.data(), sin_t.data());
  rope_cos_.upload(cos_t);
  rope_sin_.upload(sin_t);
  if (local != c.layers.end()) {
    layer_rope_table(c, *local, pos.data(), n, cos_t.data(), sin_t.data());
    rope_cos_local_.upload(cos_t);
    rope_sin_local_.upload(sin_t);
  }
  rope_rows_ = n;
}

void CudaBackend::matmul(const DevMatrix& w, const float* x, int64_t m, float* y) {
  if (m == 0) return;
  const int64_t n = w.rows, k = w.cols;
  if (has_gemv(w.type) && m <= cuda::kQuantGemvMaxRows) {
    FATHOM_CUDA_BACKEND_OK(cuda::quant_gemv(w.type, w.data, n, k, x, static_cast<int32_t>(m), y, stream_));
    return;
  }
  act16_.reserve(static_cast<size_t>(m * k));
  FATHOM_CUDA_BACKEND_OK(cuda::convert_f32_to_f16(x, act16_.get(), m * k, stream_));
  const int32_t mi = static_cast<int32_t>(m), ni = static_cast<int32_t>(n), ki = static_cast<int32_t>(k);
  if (w.type == GgmlType::F16) {
    FATHOM_CUDA_BACKEND_OK(
        cuda::gemm_f16(gemm_, act16_.get(), k, static_cast<const __half*>(w.data), k, y, n, mi, ni, ki, stream_));
    return;
  }
  // Quantized W and a prefill-sized batch: dequantize row chunks of W to f16, one GEMM per chunk
  // writing its columns of y.
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(n, kDequantChunk / k));
  w16_.reserve(static_cast<size_t>(chunk * k));
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t rc = std::min(chunk, n - r0);
    FATHOM_CUDA_BACKEND_OK(
        cuda::embedding_lookup_f16(w.data, w.type, n, k, row_ids_.get() + r0, rc, 1.0f, w16_.get(), stream_));
    FATHOM_CUDA_BACKEND_OK(cuda::gemm_f16(gemm_, act16_.get(), k, w16_.get(), k, y + r0, n, mi,
                                          static_cast<int32_t>(rc), ki, stream_));
  }
}

void CudaBackend::begin_pass(const BatchPlan& plan) {
  const ModelConfig& c = config_;
  // The last pass's kernels are done (its logits copy synchronised), unless it was abandoned.
  if (pass_open_) FATHOM_CUDA_BACKEND_OK(cudaStreamSynchronize(stream_));
  uploads_.reset();
  pass_open_ = true;
  plan_ = &plan;
  scratch_.host_plans.clear();  // the previous pass ended with a synchronous copy of its logits
  int64_t T = 0;
  int32_t max_pos = 0;
  size_t stride = 1;
  first_.clear();
  for (const SeqStep& s : plan.seqs) {
    first_.push_back(T);
    T += static_cast<int64_t>(s.tokens.size());
    stride = std::max(stride, s.blocks->size());
    if (!s.tokens.empty()) max_pos = std::max(max_pos, s.pos0 + static_cast<int32_t>(s.tokens.size()) - 1);
  }
  T_ = T;

  // The batch on the device: token ids, absolute positions, token CSR, padded block tables.
  const size_t S = plan.seqs.size();
  const int32_t host_slots = host_kv_ ? host_kv_->num_blocks() : 0;  // table entries >= -host_slots
  const int32_t scratch_begin = kv_->num_blocks(), scratch_end = scratch_begin + kv_->shared_blocks();
  std::vector<int32_t> ids, pos, start{0}, tables(S * stride, 0);
  bool names_scratch = false;
  ids.reserve(T);
  pos.reserve(T);
  for (size_t si = 0; si < S; ++si) {
    const SeqStep& s = plan.seqs[si];
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      FATHOM_CHECK(s.tokens[i] >= 0 && s.tokens[i] < token_embd_.rows, "token id out of range");
      ids.push_back(s.tokens[i]);
      pos.push_back(s.pos0 + static_cast<int32_t>(i));
    }
    start.push_back(static_cast<int32_t>(ids.size()));
    for (size_t b = 0; b < s.blocks->size(); ++b) {
      const int32_t e = (*s.blocks)[b];  // a device slot, or host slot -(e + 1)
      FATHOM_CHECK((e < num_blocks_ || (e >= scratch_begin && e < scratch_end)) && e >= -host_slots,
                   "block id out of range");
      tables[si * stride + b] = e;
      names_scratch |= e >= scratch_begin;
    }
    if (!s.tokens.empty()) {  // kv_append writes device slots only (and reads the running sums before them)
      const int32_t bs = kv_layout().block_size, end = s.pos0 + static_cast<int32_t>(s.tokens.size());
      for (int32_t b = std::max(0, s.pos0 / bs - (s.pos0 % bs == 0 ? 1 : 0)); b <= (end - 1) / bs; ++b)
        FATHOM_CHECK(b >= static_cast<int32_t>(s.blocks->size()) || (*s.blocks)[b] >= 0,
                     "a step writes a block (or reads the running sums of the block before it) outside the device tier");
    }
  }
  ids_.upload(ids);
  positions_.upload(pos);
  seq_start_.upload(start);
  verify_first_.clear();
  verify_rows_.clear();
  verify_blocks_.clear();
  for (const SeqStep& s : plan.seqs) {
    verify_first_.push_back(s.verify ? static_cast<int32_t>(verify_blocks_.size()) : -1);
    verify_rows_.push_back(s.verify ? static_cast<int32_t>(s.tokens.size()) : 0);
    if (s.verify)
      for (size_t i = 0; i < s.tokens.size(); ++i)
        verify_blocks_.push_back((*s.blocks)[(s.pos0 + static_cast<int32_t>(i)) / kv_layout().block_size]);
  }
  verify_total_ = static_cast<int64_t>(verify_blocks_.size());
  if (verify_total_ > 0) {
    verify_running_.reserve_grow(static_cast<size_t>(verify_total_) * c.n_layers * running_floats());
    verify_first_dev_.upload(verify_first_);
  }
  tables_per_layer_ = names_scratch;
  if (names_scratch) {  // each layer's copy names the scratch where that layer's view finds it
    std::vector<int32_t> layered(tables.size() * c.n_layers);
    for (int32_t l = 0; l < c.n_layers; ++l)
      for (size_t i = 0; i < tables.size(); ++i) layered[l * tables.size() + i] = kv_->layer_entry(l, tables[i]);
    tables_.upload(layered);
  } else {
    tables_.upload(tables);
  }
  // Host slots the queued moves give other bytes: their rows leave the device map (before the
  // wait below, like the other pageable uploads; the scatter touches the map only, not the KV).
  if (hot_rows_) upload_row_map_changes();
  // The block moves the scheduler queued before this pass: the compute stream waits for them
  // (after the pageable uploads above, which would otherwise block the host until they finish).
  if (moves_pending_) {
    FATHOM_CUDA_BACKEND_OK(cudaStreamWaitEvent(stream_, moves_done_, 0));
    moves_pending_ = false;
  }
  table_stride_ = static_cast<int32_t>(stride);
  ensure_rope_rows(max_pos + 1);
  for (int a = 0; a < static_cast<int>(acts_.size()); ++a)
    acts_[a].reserve(static_cast<size_t>(T * act_width(config_, static_cast<Act>(a))));
  FATHOM_CUDA_BACKEND_OK(cuda::embedding_lookup(token_embd_.data, token_embd_.type, token_embd_.rows, c.dim,
                                                ids_.get(), T, c.embed_scale, act(Act::kX), stream_));
}

void CudaBackend::rms_norm(Act in, Act out, int32_t layer, LayerVector w, int64_t rows, int32_t width) {
  FATHOM_CUDA_BACKEND_OK(cuda::rms_norm(act(in), vector(layer, w), act(out), rows, width, config_.rms_eps, stream_));
}

void CudaBackend::matmul(int32_t layer, std::span<const MatmulOut> outs, Act in) {
  for (const MatmulOut& o : outs) matmul(matrix(layer, o.w), act(in), T_, act(o.out));
}

void CudaBackend::add_bias(Act x, int32_t layer, LayerVector bias) {
  const float* b = vector(layer, bias);
  if (b != nullptr) FATHOM_CUDA_BACKEND_OK(cuda::add_bias(act(x), b, T_, act_width(config_, x), stream_));
}

void CudaBackend::rope(int32_t layer) {
  const ModelConfig& c = config_;
  const bool sliding = c.layers[layer].sliding;
  const float* cos_t = sliding ? rope_cos_local_.get() : rope_cos_.get();
  const float* sin_t = sliding ? rope_sin_local_.get() : rope_sin_.get();
  FATHOM_CUDA_BACKEND_OK(cuda::rope(act(Act::kQ), positions_.get(), T_, c.q_dim(), c.n_heads, c.head_dim, c.rope_dim,
                                    c.rope_neox, cos_t, sin_t, stream_));
  FATHOM_CUDA_BACKEND_OK(cuda::rope(act(Act::kK), positions_.get(), T_, c.kv_dim(), c.n_kv_heads, c.head_dim,
                                    c.rope_dim, c.rope_neox, cos_t, sin_t, stream_));
}

void CudaBackend::append_kv(int32_t layer) {
  const ModelConfig& c = config_;
  cuda::KvAppendBatch batch;
  batch.k = act(Act::kK);
  batch.v = act(Act::kV);
  batch.k_token_stride = c.kv_dim();
  batch.v_token_stride = c.kv_dim();
  batch.positions = positions_.get();
  batch.seq_token_start = seq_start_.get();
  batch.block_tables = layer_tables(layer);
  batch.table_stride = table_stride_;
  batch.n_tokens = static_cast<int32_t>(T_);
  batch.n_seqs = static_cast<int32_t>(plan_->seqs.size());
  if (verify_total_ > 0) {
    batch.running = verify_running_.get() + static_cast<size_t>(layer) * verify_total_ * running_floats();
    batch.running_row = verify_first_dev_.get();
  }
  FATHOM_CUDA_BACKEND_OK(cuda::kv_append(kv_->append_target(layer), batch, stream_));
}

void CudaBackend::rollback_kv(int32_t seq, int32_t kept_rows) {
  FATHOM_CHECK(seq >= 0 && seq < static_cast<int32_t>(verify_first_.size()) && verify_first_[seq] >= 0 && kept_rows >= 1,
               "rollback of a step that is not a verify step");
  FATHOM_CHECK(kept_rows <= verify_rows_[seq], "rollback keeps more rows than the step has");
  const int64_t row = verify_first_[seq] + kept_rows - 1;
  for (int32_t l = 0; l < config_.n_layers; ++l)
    FATHOM_CUDA_BACKEND_OK(cuda::kv_set_running(kv_->append_target(l), verify_blocks_[row],
                                                verify_running_.get() + (static_cast<size_t>(l) * verify_total_ + row) * running_floats(),
                                                stream_));
}

void CudaBackend::read_running(int32_t slot, std::vector<float>& out) {
  const size_t rf = running_floats(), n = rf * config_.n_layers;
  running_io_.reserve_grow(n);
  for (int32_t l = 0; l < config_.n_layers; ++l)
    FATHOM_CUDA_BACKEND_OK(cuda::kv_get_running(kv_->append_target(l), slot, running_io_.get() + l * rf, stream_));
  FATHOM_CUDA_BACKEND_OK(cudaStreamSynchronize(stream_));
  out.resize(n);
  FATHOM_CUDA_BACKEND_OK(cudaMemcpy(out.data(), running_io_.get(), n * sizeof(float), cudaMemcpyDeviceToHost));
}

void CudaBackend::write_running(int32_t slot, const std::vector<float>& in) {
  const size_t rf = running_floats();
  FATHOM_CHECK(in.size() == rf * config_.n_layers, "running planes of another shape");
  FATHOM_CUDA_BACKEND_OK(cudaStreamSynchronize(stream_));  // an earlier write may still read running_io_
  running_io_.reserve_grow(in.size());
  FATHOM_CUDA_BACKEND_OK(cudaMemcpy(running_io_.get(), in.data(), in.size() * sizeof(float), cudaMemcpyHostToDevice));
  for (int32_t l = 0; l < config_.n_layers; ++l)
    FATHOM_CUDA_BACKEND_OK(cuda::kv_set_running(kv_->append_target(l), slot, running_io_.get() + l * rf, stream_));
}

DecodeArgs CudaBackend::decode_args(int32_t layer, int32_t seq) {
  const ModelConfig& c = config_;
  const int64_t row = first_[seq] * c.q_dim();
  return DecodeArgs{act(Act::kQ) + row, act(Act::kAttn) + row, c.n_heads, plan_->seqs[seq].pos0, c.attn_scale,
                    c.attn_softcap, layer_sinks(layer)};
}

int64_t CudaBackend::attend_sparse(int32_t layer, int32_t seq, const AttentionPolicy& policy, LayerPolicyState& state) {
  const CudaPolicyStep step = cuda_step_of(policy.kind);
  FATHOM_CHECK(step != nullptr, "a policy without a CUDA step reached the CUDA backend");
  CudaPolicyContext ctx{scratch_, stream_, policy.kind, {}};
  if (hot_rows_)
    ctx.cache_rows = [&](const RowsOf& positions_of) { cache_rows(layer, seq, policy.kind, positions_of); };
  return step(this->view(layer, seq_table(layer, seq)), decode_args(layer, seq), policy, state, ctx);
}

int64_t CudaBackend::attend_group(int32_t layer, const AttentionGroup& group) {
  const ModelConfig& c = config_;
  return group_step(view(layer, nullptr), *plan_, group, layer_tables(layer), table_stride_, act(Act::kQ),
                    act(Act::kAttn), first_, c.n_heads, LogitScale{c.attn_scale, c.attn_softcap}, layer_sinks(layer),
                    scratch_, stream_);
}

void CudaBackend::attend_dense(int32_t layer, int32_t seq, int32_t window) {
  const ModelConfig& c = config_;
  const SeqStep& s = plan_->seqs[seq];
  const PagedKvView view = this->view(layer, seq_table(layer, seq));
  AttentionArgs args;
  args.q = act(Act::kQ) + first_[seq] * c.q_dim();
  args.out = act(Act::kAttn) + first_[seq] * c.q_dim();
  args.n_q = static_cast<int32_t>(s.tokens.size());
  args.n_heads = c.n_heads;
  args.pos0 = s.pos0;
  args.window = window;
  args.scale = c.attn_scale;
  args.softcap = c.attn_softcap;
  args.sinks = layer_sinks(layer);
  const cuda::DecodeAttentionPlan ap = cuda::plan_paged_decode_attention(view, args);
  if (ap.workspace_floats > 0) attn_workspace_.reserve_grow(ap.workspace_floats);
  FATHOM_CUDA_BACKEND_OK(cuda::paged_decode_attention(view, args, ap, attn_workspace_.get(), stream_));
}

void CudaBackend::route_experts(int32_t layer) {
  const ModelConfig& c = config_;
  const int32_t E = c.n_experts;
  // The router's logits: token rows in runs of 4, "expert" 0 of stride 0.
  std::vector<cuda::ExpertRows> token_runs;
  for (int64_t t = 0; t < T_; t += 4)
    token_runs.push_back({0, static_cast<int32_t>(t), static_cast<int32_t>(std::min<int64_t>(4, T_ - t))});
  router_logits_.reserve(static_cast<size_t>(T_ * E));
  grouped_matmul(false, GgmlType::F32, layers_[layer].router.get(), 0, E, c.dim, act(Act::kXn), router_logits_.get(),
                 uploads_.put(token_runs), static_cast<int32_t>(token_runs.size()));
  router_host_.resize(static_cast<size_t>(T_ * E));
  FATHOM_CUDA_BACKEND_OK(cudaMemcpy(router_host_.data(), router_logits_.get(), router_host_.size() * sizeof(float),
                                    cudaMemcpyDeviceToHost));
  const std::vector<float>& bias = layers_[layer].router_bias;
  if (!bias.empty())
    for (int64_t t = 0; t < T_; ++t)
      for (int32_t e = 0; e < E; ++e) router_host_[t * E + e] += bias[e];
  route_tokens(router_host_.data(), T_, E, c.n_experts_used, routing_);
  // The grouped GEMM where some expert has more pairs than one GEMV item takes (the GEMV would read
  // it more than once); a step whose experts each have few pairs keeps the GEMV.
  int32_t most = 0;
  for (int32_t e = 0; e < E; ++e) most = std::max(most, routing_.expert_begin[e + 1] - routing_.expert_begin[e]);
  expert_gemm_ = most > kGemvRows;
  const int32_t run = expert_gemm_ ? cuda::kGroupedGemmRows : static_cast<int32_t>(kGemvRows);
  std::vector<cuda::ExpertRows> items;
  for (int32_t e = 0; e < E; ++e) {
    const int32_t begin = routing_.expert_begin[e], end = routing_.expert_begin[e + 1];
    for (int32_t p = begin; p < end; p += run) items.push_back({e, p, std::min(run, end - p)});
  }
  if (layers_[layer].gate_exps_bias.get() != nullptr) {  // gpt-oss: each pair's expert, for its bias rows
    std::vector<int32_t> pair_expert(static_cast<size_t>(routing_.pairs()));
    for (int32_t e = 0; e < E; ++e)
      std::fill(pair_expert.begin() + routing_.expert_begin[e], pair_expert.begin() + routing_.expert_begin[e + 1], e);
    pair_expert_ = uploads_.put(pair_expert);
  }
  pair_token_ = uploads_.put(routing_.pair_token);
  pair_weight_ = uploads_.put(routing_.pair_weight);
  token_pair_ = uploads_.put(routing_.token_pair);
  expert_items_ = uploads_.put(items);
  n_expert_items_ = static_cast<int32_t>(items.size());
}

void CudaBackend::grouped_matmul(bool gemm, GgmlType type, const void* w, int64_t stride, int64_t n_out, int64_t k,
                                 const float* x, float* y, const cuda::ExpertRows* items, int32_t n_items) {
  constexpr int32_t kMaxItems = 65535;  // a launch's grid.y
  for (int32_t i = 0; i < n_items; i += kMaxItems) {
    const int32_t n = std::min(kMaxItems, n_items - i);
    FATHOM_CUDA_BACKEND_OK(gemm ? cuda::grouped_gemm(type, w, stride, n_out, k, x, y, items + i, n, stream_)
                                : cuda::grouped_gemv(type, w, stride, n_out, k, x, y, items + i, n, stream_));
  }
}

void CudaBackend::expert_matmul(int32_t layer, std::span<const ExpertMatmulOut> outs, Act in) {
  FATHOM_CHECK(!outs.empty() && (in == Act::kXn || in == Act::kGate));
  const DevLayer& D = layers_[layer];
  const int64_t pairs = routing_.pairs();
  const float* x = act(in);
  if (in == Act::kXn) {  // the pairs' token rows, gathered in pair order
    expert_in_.reserve(static_cast<size_t>(pairs * config_.dim));
    FATHOM_CUDA_BACKEND_OK(cuda::gather_rows(x, pair_token_, pairs, config_.dim, expert_in_.get(), stream_));
    x = expert_in_.get();
  }
  for (const ExpertMatmulOut& o : outs) {
    const DevMatrix& m = expert_matrices(D, o.w);
    const int64_t rows = m.rows / config_.n_experts, stride = rows * static_cast<int64_t>(ggml_row_size(m.type, m.cols));
    grouped_matmul(expert_gemm_, m.type, m.data, stride, rows, m.cols, x, act(o.out), expert_items_, n_expert_items_);
    const DeviceArray<float>& bias = expert_biases(D, o.w);
    if (bias.get() != nullptr)
      FATHOM_CUDA_BACKEND_OK(cuda::add_row_bias(act(o.out), bias.get(), pair_expert_, pairs, rows, stream_));
    step_.expert_bytes += stride * n_expert_items_;  // each item (run of pairs) reads its expert's rows once
  }
}

void CudaBackend::combine_experts(Act out) {
  FATHOM_CUDA_BACKEND_OK(cuda::combine_experts(act(Act::kExpertOut), token_pair_, pair_weight_, T_,
                                               config_.n_experts_used, config_.dim, act(out), stream_));
}

void CudaBackend::glu(Activation a) {
  const cuda::GluKind kind = a == Activation::kSilu       ? cuda::GluKind::kSwiGlu
                             : a == Activation::kGeluTanh ? cuda::GluKind::kGeGluTanh
                                                          : cuda::GluKind::kSwiGluOai;
  FATHOM_CUDA_BACKEND_OK(cuda::glu(kind, act(Act::kGate), act(Act::kUp), act(Act::kGate),
                                   T_ * act_width(config_, Act::kGate), stream_));
}

void CudaBackend::add(Act x, Act y) {
  FATHOM_CUDA_BACKEND_OK(cuda::add_inplace(act(x), act(y), T_ * act_width(config_, x), stream_));
}

void CudaBackend::final_norm(std::span<const int64_t> rows) {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(rows.size());
  if (n == 0) return;
  picked_.reserve(static_cast<size_t>(n * c.dim));
  // Runs of consecutive rows move in one copy.
  for (int64_t i = 0; i < n;) {
    int64_t j = i + 1;
    while (j < n && rows[j] == rows[j - 1] + 1) ++j;
    FATHOM_CUDA_BACKEND_OK(cudaMemcpy(picked_.get() + i * c.dim, act(Act::kX) + rows[i] * c.dim,
                                      (j - i) * c.dim * sizeof(float), cudaMemcpyDeviceToDevice));
    i = j;
  }
  FATHOM_CUDA_BACKEND_OK(cuda::rms_norm(picked_.get(), output_norm_.get(), picked_.get(), n, c.dim, c.rms_eps, stream_));
}

void CudaBackend::hidden(std::span<const int64_t> rows, std::vector<float>& out) {
  out.resize(rows.size() * static_cast<size_t>(config_.dim));
  if (rows.empty()) return;
  final_norm(rows);
  FATHOM_CUDA_BACKEND_OK(cudaMemcpy(out.data(), picked_.get(), out.size() * sizeof(float), cudaMemcpyDeviceToHost));
}

void CudaBackend::logits(std::span<const int64_t> rows, std::vector<float>& out) {
  const int64_t n = static_cast<int64_t>(rows.size());
  const int64_t vocab = output_.rows;
  out.resize(static_cast<size_t>(n * vocab));
  if (n == 0) {
    end_pass();
    return;
  }
  final_norm(rows);
  logits_.reserve(static_cast<size_t>(n * vocab));
  matmul(output_, picked_.get(), n, logits_.get());
  FATHOM_CUDA_BACKEND_OK(cudaMemcpy(out.data(), logits_.get(), out.size() * sizeof(float), cudaMemcpyDeviceToHost));
  end_pass();
}

void CudaBackend::end_pass() {
  pass_open_ = false;
  if (!host_kv_) return;
  unsigned long long read = 0;
  FATHOM_CUDA_BACKEND_OK(cudaMemcpy(&read, host_read_.get(), sizeof(read), cudaMemcpyDeviceToHost));
  FATHOM_CUDA_BACKEND_OK(cudaMemset(host_read_.get(), 0, sizeof(read)));
  step_.staged_bytes += static_cast<int64_t>(read);
}

}  // namespace cuda_backend_detail

std::unique_ptr<Backend> make_cuda_backend(const Model& model, const ModelOptions& options) {
#ifndef FATHOM_CUDA_EMULATION
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0)
    throw Error(std::string("--backend cuda: no CUDA device is visible (cudaGetDeviceCount: ") +
                (e != cudaSuccess ? cudaGetErrorString(e) : "0 devices") + ")");
#endif
  return std::make_unique<cuda_backend_detail::CudaBackend>(model, options);
}

}  // namespace fathom
