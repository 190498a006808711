#include "engine/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "base/error.h"
#include "engine/backend/cpu/break_even.h"
#include "engine/backend/cpu/cpu_policies.h"
#include "engine/backend/cpu/staged_chunks.h"
#include "engine/model/model.h"
#include "engine/model/gguf.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/huge_buffer.h"
#include "kernels/cpu/packed_weights.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/sparse_attention.h"

namespace fathom {
namespace {

KvLayout layout_for(const Model& model, const ModelOptions& o) {
  const ModelConfig& c = model.config();
  return KvLayout{c.n_layers, c.n_kv_heads, c.head_dim, o.block_size, o.kv_dtype, o.kv_transposed_k};
}

// Repacks every matrix the CPU's kQ8 kernels read faster in panels (cpu::PackedWeights: Q8_0,
// Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K, Q3_K, Q4_K, Q6_K, IQ4_XS on AVX-512 VNNI and AVX2), including the output projection (when it
// is the tied embedding, the lookup keeps reading the mapped rows). Returns the bytes allocated.
size_t pack_for_cpu(ModelWeights& weights, ThreadPool& pool) {
  // One arena for all of them: each matrix rounded up to whole 2 MiB pages would waste ~1 MiB
  // per matrix (about 200 MB on SmolLM2's 210 matrices).
  size_t total = 0;
  std::vector<WeightMatrix*> packable;
  const auto add = [&](WeightMatrix& w) {
    if (w.data != nullptr && !w.packed && cpu::PackedWeights::supported(w.type)) {
      packable.push_back(&w);
      total += cpu::PackedWeights::bytes_for(w.type, w.rows, w.cols);
    }
  };
  weights.for_each_matrix(add);
  weights.for_each_expert_matrix(add);  // each expert packed as a matrix of its own
  if (packable.empty()) return 0;
  weights.packed_arena = std::make_shared<HugePageBuffer>(total);
  auto* dst = reinterpret_cast<uint8_t*>(weights.packed_arena->data());
  for (WeightMatrix* w : packable) {
    w->packed = std::make_shared<const cpu::PackedWeights>(w->type, w->data, w->rows, w->cols, dst, &pool);
    dst += w->packed->bytes();
  }
  return total;
}

}  // namespace

CpuBackend::CpuBackend(const Model& model, const ModelOptions& options)
    : Backend(model, layout_for(model, options),
              kv_blocks_for_budget(model, options, layout_for(model, options).block_bytes())),
      options_(options),
      weights_(model.weights()) {
  kv_ = std::make_unique<CpuKvStorage>(kv_layout(), kv_blocks());
  const int threads = options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency());
  threads_ = std::make_unique<ThreadPool>(threads);
  for (int t = 0; t < threads_->size(); ++t)
    serial_pools_.push_back(std::make_unique<ThreadPool>(ThreadPool::Serial{}, threads_->size()));
  if (options.pack_weights && options.precision == cpu::Precision::kQ8) {
    pack_for_cpu(weights_, *threads_);
    // The mapped bytes of a packed matrix are no longer read (packing read them all in): give the
    // pages back. A tied embedding too: its rows fault back in one page per looked-up token.
    const auto release = [&](const WeightMatrix& w) {
      if (w.packed) model.file().release_pages(w.data, w.bytes());
    };
    std::as_const(weights_).for_each_matrix(release);
    std::as_const(weights_).for_each_expert_matrix(release);
  }
}

CpuBackend::~CpuBackend() = default;

bool CpuBackend::implements(PolicyKind kind) const { return cpu_implements(kind); }

int32_t CpuBackend::reserve_host_tier(int32_t blocks, int32_t keep_device_blocks) {
  FATHOM_CHECK(!host_kv_ && plan_ == nullptr, "the host tier is reserved once, before the first forward");
  if (blocks <= 0) return 0;
  const int32_t bs = kv_layout().block_size, budget = kv_blocks();
  // Beyond what the page table must keep, the budget is split between blocks (dense attention
  // reads them in place instead of staging) and hot rows (sparse decode reads host rows from the
  // device; HotRowsFull falls back to dense) by options_.hot_rows_percent.
  const int32_t hot = std::max(1, hot_rows_slots(budget, keep_device_blocks, options_.hot_rows_percent));
  if (budget - hot < 3)
    throw Error("the device KV tier holds " + std::to_string(budget) +
                " blocks: a host tier needs at least 4 (raise kv_cache.device_mib)");
  staging_slots_ = 2 * cpu::key_chunk_positions(bs) / bs;
  set_kv_blocks(budget - hot);
  // Slots: [0, kv_blocks()) blocks, then staging, then the hot rows.
  kv_ = std::make_unique<CpuKvStorage>(kv_layout(), kv_blocks() + staging_slots_ + hot);
  host_kv_ = std::make_unique<CpuKvStorage>(kv_layout(), blocks);
  hot_rows_ = std::make_unique<CpuHotRows>(*kv_, *host_kv_, kv_blocks() + staging_slots_, hot);
  hot_slots_ = hot;
  return blocks;
}

int32_t CpuBackend::reserve_recompute_scratch(int32_t blocks) {
  FATHOM_CHECK(plan_ == nullptr && kv_->shared_blocks() == 0, "the recompute scratch is reserved once, before the first forward");
  if (blocks <= 0 || !host_kv_) return 0;
  // The scratch's bytes (one layer's of `blocks` blocks) come out of the page table's blocks, and so
  // do the blocks that round the layers' slots down to where the shared ones may start.
  const int32_t layers = kv_layout().n_layers, step = CpuKvStorage::shared_alignment(kv_layout());
  const int32_t before = kv_blocks() + staging_slots_ + hot_slots_;
  const int32_t slots = (before - (blocks + layers - 1) / layers) / step * step;
  const int32_t charge = before - slots;
  if (kv_blocks() - charge < 3) return 0;
  set_kv_blocks(kv_blocks() - charge);
  // Slots: blocks, staging, hot rows, then the shared scratch. The storage is made again: nothing
  // is in it before the first forward.
  const int32_t first_hot = kv_blocks() + staging_slots_;
  hot_rows_.reset();
  kv_ = std::make_unique<CpuKvStorage>(kv_layout(), slots, blocks);
  FATHOM_CHECK(kv_->first_shared() == slots);
  hot_rows_ = std::make_unique<CpuHotRows>(*kv_, *host_kv_, first_hot, hot_slots_);
  return blocks;
}

void CpuBackend::copy_slot_impl(KvTier from, int32_t from_slot, KvTier to, int32_t to_slot) {
  storage(from).copy_block_to(from_slot, storage(to), to_slot);
  if (to == KvTier::kHost) hot_rows_->invalidate_host_slot(to_slot);
}

void CpuBackend::exchange_slots_impl(int32_t device_slot, int32_t host_slot) {
  exchange_buffer_.resize(block_bytes());  // kept: a demotion runs on most steps under pressure
  kv_->read_block(device_slot, exchange_buffer_.data());
  host_kv_->copy_block_to(host_slot, *kv_, device_slot);
  host_kv_->write_block(host_slot, exchange_buffer_.data());
  hot_rows_->invalidate_host_slot(host_slot);
}

bool CpuBackend::reads_host(int32_t seq, int32_t first_block) const {
  if (!host_kv_) return false;
  const SeqStep& s = plan_->seqs[seq];
  const int32_t last = s.pos0 + static_cast<int32_t>(s.tokens.size()) - 1;
  return reads_host_tier(*s.blocks, first_block, last / kv_layout().block_size + 1);
}


const std::vector<float>& CpuBackend::vector(int32_t layer, LayerVector v) const {
  return layer_vector(weights_.layers[layer], v);
}

const WeightMatrix& CpuBackend::matrix(int32_t layer, LayerMatrix m) const {
  return layer_matrix(weights_.layers[layer], m);
}

void CpuBackend::host_parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  // The pool's workers must not throw (an exception leaving a worker thread ends the process):
  // keep the first and rethrow it here, on the caller's thread.
  std::exception_ptr first;
  std::mutex mutex;
  threads_->parallel_for(n, [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      try {
        fn(i);
      } catch (...) {
        const std::lock_guard<std::mutex> lock(mutex);
        if (!first) first = std::current_exception();
      }
    }
  });
  if (first) std::rethrow_exception(first);
}

void CpuBackend::begin_pass(const BatchPlan& plan) {
  const ModelConfig& c = model_.config();
  plan_ = &plan;
  first_.clear();
  positions_.clear();
  verify_first_.clear();
  verify_rows_.clear();
  verify_blocks_.clear();
  const int32_t bs = kv_layout().block_size;
  for (const SeqStep& s : plan.seqs) {
    first_.push_back(static_cast<int64_t>(positions_.size()));
    verify_first_.push_back(s.verify ? static_cast<int32_t>(verify_blocks_.size()) : -1);
    verify_rows_.push_back(s.verify ? static_cast<int32_t>(s.tokens.size()) : 0);
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      const int32_t pos = s.pos0 + static_cast<int32_t>(i);
      positions_.push_back(pos);
      if (s.verify) verify_blocks_.push_back((*s.blocks)[pos / bs]);
    }
  }
  verify_running_.resize(verify_blocks_.size() * c.n_layers * kv_->running_floats());
  const int64_t T = static_cast<int64_t>(positions_.size());
  for (int a = 0; a < static_cast<int>(acts_.size()); ++a)
    acts_[a].resize(T * act_width(model_.config(), static_cast<Act>(a)));

  // Embedding lookup (quantized rows dequantized on the fly), gemma scales by sqrt(dim).
  float* x = act(Act::kX);
  int64_t t = 0;
  for (const SeqStep& s : plan.seqs)
    for (const int32_t id : s.tokens) {
      FATHOM_CHECK(id >= 0 && id < weights_.token_embd.rows, "token id out of range");
      cpu::dequantize_row(weights_.token_embd.type, weights_.token_embd.data, c.dim, id, &x[t++ * c.dim]);
    }
  if (c.embed_scale != 1.0f) cpu::scale_inplace(x, c.embed_scale, T * c.dim);

  // RoPE tables: one per distinct rotation — llama has one, gemma3 two (local / global).
  const int32_t half = c.rope_dim / 2;
  const auto global = std::find_if(c.layers.begin(), c.layers.end(), [](const LayerConfig& l) { return !l.sliding; });
  const LayerConfig& g = global != c.layers.end() ? *global : c.layers.front();
  rope_cos_.resize(T * half);
  rope_sin_.resize(T * half);
  layer_rope_table(c, g, positions_.data(), T, rope_cos_.data(), rope_sin_.data());
  const auto local = std::find_if(c.layers.begin(), c.layers.end(), [](const LayerConfig& l) { return l.sliding; });
  if (local != c.layers.end()) {
    rope_cos_local_.resize(T * half);
    rope_sin_local_.resize(T * half);
    layer_rope_table(c, *local, positions_.data(), T, rope_cos_local_.data(), rope_sin_local_.data());
  }
}

void CpuBackend::rms_norm(Act in, Act out, int32_t layer, LayerVector w, int64_t rows, int32_t width) {
  cpu::rms_norm(act(in), vector(layer, w).data(), act(out), rows, width, model_.config().rms_eps);
}

void CpuBackend::matmul(int32_t layer, std::span<const MatmulOut> outs, Act in) {
  const int64_t T = static_cast<int64_t>(positions_.size());
  if (outs.size() == 1) {
    const WeightMatrix& w = matrix(layer, outs[0].w);
    cpu::matmul(*threads_, w.type, w.data, w.rows, w.cols, act(in), T, act(outs[0].out), options_.precision,
                w.packed.get());
    return;
  }
  // Matrices that share their input run as one pool job (the input is quantized once).
  std::array<cpu::MatmulTarget, 3> targets{};
  FATHOM_CHECK(outs.size() <= targets.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    const WeightMatrix& w = matrix(layer, outs[i].w);
    targets[i] = cpu::MatmulTarget{w.type, w.data, w.rows, act(outs[i].out), w.packed.get()};
  }
  cpu::matmul_group(*threads_, targets.data(), static_cast<int>(outs.size()), matrix(layer, outs[0].w).cols, act(in), T,
                    options_.precision);
}

void CpuBackend::add_bias(Act x, int32_t layer, LayerVector bias) {
  const std::vector<float>& b = vector(layer, bias);
  if (b.empty()) return;
  const int64_t n = act_width(model_.config(), x), T = static_cast<int64_t>(positions_.size());
  for (int64_t r = 0; r < T; ++r) cpu::add_inplace(act(x) + r * n, b.data(), n);
}

void CpuBackend::rope(int32_t layer) {
  const ModelConfig& c = model_.config();
  const bool sliding = c.layers[layer].sliding;
  const float* cos_t = sliding ? rope_cos_local_.data() : rope_cos_.data();
  const float* sin_t = sliding ? rope_sin_local_.data() : rope_sin_.data();
  const int64_t T = static_cast<int64_t>(positions_.size());
  cpu::rope_apply(act(Act::kQ), T, c.n_heads, c.head_dim, c.rope_dim, c.rope_neox, cos_t, sin_t);
  cpu::rope_apply(act(Act::kK), T, c.n_kv_heads, c.head_dim, c.rope_dim, c.rope_neox, cos_t, sin_t);
}

void CpuBackend::append_kv(int32_t layer) {
  const int64_t kv_dim = model_.config().kv_dim();
  const float* k = act(Act::kK);
  const float* v = act(Act::kV);
  const size_t running = kv_->running_floats();
  int64_t t = 0;
  for (size_t si = 0; si < plan_->seqs.size(); ++si) {  // append checks the blocks it writes and reads are device-tier ones
    const SeqStep& s = plan_->seqs[si];
    for (size_t i = 0; i < s.tokens.size(); ++i, ++t) {
      float* saved = verify_first_[si] < 0 ? nullptr
                                           : verify_running_.data() +
                                                 ((verify_first_[si] + i) * model_.config().n_layers + layer) * running;
      kv_->append(layer, s.blocks->data(), s.pos0 + static_cast<int32_t>(i), k + t * kv_dim, v + t * kv_dim, saved);
    }
  }
}

void CpuBackend::rollback_kv(int32_t seq, int32_t kept_rows) {
  FATHOM_CHECK(seq >= 0 && seq < static_cast<int32_t>(verify_first_.size()) && verify_first_[seq] >= 0 && kept_rows >= 1,
               "rollback of a step that is not a verify step");
  const size_t row = static_cast<size_t>(verify_first_[seq] + kept_rows - 1);
  FATHOM_CHECK(kept_rows <= verify_rows_[seq], "rollback keeps more rows than the step has");
  const int32_t n_layers = model_.config().n_layers;
  const size_t running = kv_->running_floats();
  for (int32_t l = 0; l < n_layers; ++l)
    kv_->set_running(l, verify_blocks_[row], verify_running_.data() + (row * n_layers + l) * running);
}

void CpuBackend::read_running(int32_t slot, std::vector<float>& out) {
  const size_t running = kv_->running_floats();
  out.resize(running * model_.config().n_layers);
  for (int32_t l = 0; l < model_.config().n_layers; ++l) kv_->get_running(l, slot, out.data() + l * running);
}

void CpuBackend::write_running(int32_t slot, const std::vector<float>& in) {
  const size_t running = kv_->running_floats();
  FATHOM_CHECK(in.size() == running * model_.config().n_layers, "running planes of another shape");
  for (int32_t l = 0; l < model_.config().n_layers; ++l) kv_->set_running(l, slot, in.data() + l * running);
}

DecodeArgs CpuBackend::decode_args(int32_t layer, int32_t seq) {
  const ModelConfig& c = model_.config();
  const int64_t row = first_[seq] * c.q_dim();
  return DecodeArgs{act(Act::kQ) + row, act(Act::kAttn) + row, c.n_heads, plan_->seqs[seq].pos0, c.attn_scale,
                    c.attn_softcap, layer_sinks(layer)};
}

void CpuBackend::observe(int32_t layer, int32_t seq, const PagedKvView& view) {
  if (observer_ && plan_->seqs[seq].tokens.size() == 1)
    observer_(layer, model_.config().layers[layer].sliding, view, decode_args(layer, seq));
}

AttentionArgs CpuBackend::dense_args(int32_t layer, int32_t seq, int32_t window) {
  const ModelConfig& c = model_.config();
  const SeqStep& s = plan_->seqs[seq];
  const int64_t row = first_[seq] * c.q_dim();
  return AttentionArgs{act(Act::kQ) + row, act(Act::kAttn) + row, static_cast<int32_t>(s.tokens.size()),
                       c.n_heads, s.pos0, window, c.attn_scale, c.attn_softcap, layer_sinks(layer)};
}

void CpuBackend::attend_dense(int32_t layer, int32_t seq, int32_t window) {
  const SeqStep& s = plan_->seqs[seq];
  const PagedKvView view = kv_->view(layer, s.blocks->data());
  const AttentionArgs args = dense_args(layer, seq, window);
  const int32_t bs = kv_layout().block_size;
  const int32_t first_block = window > 0 ? std::max(0, s.pos0 - window + 1) / bs : 0;
  if (!reads_host(seq, first_block)) {
    observe(layer, seq, view);
    cpu::paged_attention(*threads_, view, args);
    return;
  }
  const int32_t n_blocks = (s.pos0 + static_cast<int32_t>(s.tokens.size()) - 1) / bs + 1;
  StagedChunks chunks(*kv_, *host_kv_, layer, *s.blocks, n_blocks, cpu::key_chunk_positions(bs) / bs, kv_blocks(),
                      staging_slots_);
  cpu::paged_attention_chunked(*threads_, view, args, chunks);
  step_.staged_bytes += chunks.staged_bytes();
}

int64_t CpuBackend::attend_dense_decode(int32_t layer, int32_t seq) {
  attend_dense(layer, seq, 0);
  return dense_kv_bytes(kv_layout(), plan_->seqs[seq].pos0 + 1);
}

int32_t CpuBackend::sparse_break_even(const AttentionPolicy& policy) {
  const AttentionPolicy probe = break_even_probe(policy);
  for (const MeasuredBreakEven& m : break_evens_)  // a few entries: kinds × ratio buckets (× HiP variants)
    if (same_break_even_probe(m.probe, probe)) return m.min_keys;
  const ModelConfig& c = model_.config();
  const BreakEven be = measure_break_even(*threads_, kv_layout(), c.n_heads, c.attn_scale, probe, c.context_length);
  break_evens_.push_back({probe, be.min_keys});
  return be.min_keys;
}

int64_t CpuBackend::attend_sparse(int32_t layer, int32_t seq, const AttentionPolicy& policy, LayerPolicyState& state) {
  if (reads_host(seq, 0)) {
    const int k = static_cast<int>(policy.kind);
    // Policies that gather rows read host-tier ones through the hot-row cache where their layout
    // allows (PolicyDef::cpu_reads_host_tier); else the step decodes densely over both tiers.
    PagedKvView view = kv_->view(layer, plan_->seqs[seq].blocks->data());
    if (cpu_reads_host_tier(view, policy)) {
      hot_rows_->bind(layer, view.block_table);
      view.host_rows = hot_rows_->map(layer);
      view.prefetcher = hot_rows_.get();
      auto count = [&] {
        const HotRows::Counts c = hot_rows_->take_counts();
        step_.hot_rows.hits[k] += c.hits;
        step_.hot_rows.misses[k] += c.misses;
        step_.staged_bytes += c.bytes;
      };
      try {
        const int64_t bytes = cpu_sparse_decode(*threads_, view, decode_args(layer, seq), policy, state);
        count();
        return bytes;
      } catch (const HotRowsFull&) {  // one attention call needs more rows than the cache holds
        count();
        ++step_.hot_rows.fallbacks[k];
      }
    }
    return attend_dense_decode(layer, seq);
  }
  const PagedKvView view = kv_->view(layer, plan_->seqs[seq].blocks->data());
  observe(layer, seq, view);
  return cpu_sparse_decode(*threads_, view, decode_args(layer, seq), policy, state);
}

void CpuBackend::attend_resident_decode(ThreadPool& pool, int32_t layer, DecodeStep& step) {
  const PagedKvView view = kv_->view(layer, plan_->seqs[step.seq].blocks->data());
  if (step.policy != nullptr) step.bytes = cpu_sparse_decode(pool, view, decode_args(layer, step.seq), *step.policy, *step.state);
  else cpu::paged_attention(pool, view, dense_args(layer, step.seq, step.window));
}

void CpuBackend::attend_decodes(int32_t layer, std::span<DecodeStep> steps) {
  const int threads = threads_->size();
  bool side_by_side = threads > 1 && steps.size() >= static_cast<size_t>(threads) && !observer_;
  for (size_t i = 0; side_by_side && i < steps.size(); ++i) side_by_side = !reads_host(steps[i].seq, 0);
  if (!side_by_side) {
    ForwardOps::attend_decodes(layer, steps);
    return;
  }
  // Largest first: the last steps to go out are the short ones, so the threads end close together.
  std::vector<DecodeStep*> order;
  int64_t total = 0;
  for (DecodeStep& s : steps) {
    order.push_back(&s);
    total += s.cost;
  }
  std::stable_sort(order.begin(), order.end(), [](const DecodeStep* a, const DecodeStep* b) { return a->cost > b->cost; });
  // A step worth more than an even share of what is left would by itself outlast the other
  // threads: it runs alone over the whole pool. So do the smallest steps beyond a whole number per
  // thread (3 equal steps on 2 threads: 2 side by side, then 1 over both).
  size_t first = 0;
  int64_t rest = total;
  while (first < order.size() && order[first]->cost * threads > rest) {
    rest -= order[first]->cost;
    attend_resident_decode(*threads_, layer, *order[first++]);
  }
  const size_t last = order.size() - (order.size() - first) % threads;
  std::vector<std::exception_ptr> errors(last - first);
  threads_->for_each_chunk(static_cast<int64_t>(errors.size()), [&](int64_t i, int thread) {
    try {
      attend_resident_decode(*serial_pools_[thread], layer, *order[first + i]);
    } catch (...) {  // rethrown below: a worker thread must not unwind
      errors[i] = std::current_exception();
    }
  });
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  for (size_t i = last; i < order.size(); ++i) attend_resident_decode(*threads_, layer, *order[i]);
}

int64_t CpuBackend::attend_group(int32_t layer, const AttentionGroup& g) {
  const int32_t n = static_cast<int32_t>(g.members.size());
  std::vector<PagedKvView> views(n);
  std::vector<DecodeArgs> args(n);
  std::vector<int32_t> local(plan_->seqs.size(), -1);
  for (int32_t j = 0; j < n; ++j) {
    local[g.members[j]] = j;
    views[j] = kv_->view(layer, plan_->seqs[g.members[j]].blocks->data());
    args[j] = decode_args(layer, g.members[j]);
  }
  std::vector<ref::SharedSegment> segments;
  for (const SharedSpan& span : g.segments) {
    ref::SharedSegment seg{&views[local[span.members[0]]], span.begin, span.end, {}};
    for (int32_t m : span.members) seg.members.push_back(local[m]);
    segments.push_back(std::move(seg));
  }
  // Over a tiered cache: a member's view with host blocks is read through its own staging (a shared
  // segment through its first member's table, so the group stages the shared blocks once).
  std::vector<std::unique_ptr<StagedChunks>> staged(n);
  const int32_t bs = kv_layout().block_size;
  const cpu::ChunkSourceFor source_for = [&](const PagedKvView& v) -> cpu::KeyChunkSource* {
    const int32_t j = static_cast<int32_t>(&v - views.data());
    FATHOM_CHECK(j >= 0 && j < n, "a group pass reads a view outside the group");
    const SeqStep& s = plan_->seqs[g.members[j]];
    if (!reads_host(g.members[j], 0)) return nullptr;
    if (!staged[j])
      staged[j] = std::make_unique<StagedChunks>(*kv_, *host_kv_, layer, *s.blocks, s.pos0 / bs + 1,
                                                 cpu::key_chunk_positions(bs) / bs, kv_blocks(), staging_slots_);
    return staged[j].get();
  };
  const int64_t bytes = cpu::bifurcated_decode(*threads_, segments, views.data(), args.data(), n, source_for);
  for (const auto& st : staged)
    if (st) step_.staged_bytes += st->staged_bytes();
  return bytes;
}

void CpuBackend::route_experts(int32_t layer) {
  const ModelConfig& c = model_.config();
  const int64_t T = static_cast<int64_t>(positions_.size());
  const WeightMatrix& r = weights_.layers[layer].router;
  router_logits_.resize(T * c.n_experts);
  cpu::matmul(*threads_, r.type, r.data, r.rows, r.cols, act(Act::kXn), T, router_logits_.data(), options_.precision,
              r.packed.get());
  const std::vector<float>& bias = weights_.layers[layer].router_bias;
  if (!bias.empty())
    for (int64_t t = 0; t < T; ++t) cpu::add_inplace(&router_logits_[t * c.n_experts], bias.data(), c.n_experts);
  route_tokens(router_logits_.data(), T, c.n_experts, c.n_experts_used, routing_);
}

void CpuBackend::expert_matmul(int32_t layer, std::span<const ExpertMatmulOut> outs, Act in) {
  FATHOM_CHECK(!outs.empty() && outs.size() <= 3 && (in == Act::kXn || in == Act::kGate));
  const LayerWeights& L = weights_.layers[layer];
  const int64_t K = expert_matrices(L, outs[0].w)[0].cols;
  // One token (a single sequence's decode step): every active expert reads the same row, so all
  // their matrices go out as one pool job, in groups of kMaxGroup (bitwise what one job per expert gives).
  constexpr size_t kMaxGroup = 8;
  std::vector<cpu::MatmulTarget> shared;
  for (int32_t e = 0; e < routing_.experts; ++e) {
    const int32_t first = routing_.expert_begin[e], n = routing_.expert_begin[e + 1] - first;
    if (n == 0) continue;
    const float* x = act(in) + first * K;
    if (in == Act::kXn && routing_.tokens > 1) {  // the pairs' token rows, gathered
      expert_in_.resize(static_cast<size_t>(n) * K);
      for (int32_t i = 0; i < n; ++i)
        std::copy_n(act(in) + routing_.pair_token[first + i] * K, K, &expert_in_[static_cast<size_t>(i) * K]);
      x = expert_in_.data();
    } else if (in == Act::kXn) {
      x = act(in);
    }
    std::array<cpu::MatmulTarget, 3> targets{};
    for (size_t i = 0; i < outs.size(); ++i) {
      const WeightMatrix& w = expert_matrices(L, outs[i].w)[e];
      FATHOM_CHECK(w.cols == K);
      targets[i] = cpu::MatmulTarget{w.type, w.data, w.rows, act(outs[i].out) + first * w.rows, w.packed.get()};
      step_.expert_bytes += static_cast<int64_t>(w.bytes());
    }
    if (in == Act::kXn && routing_.tokens == 1) {
      shared.insert(shared.end(), targets.begin(), targets.begin() + static_cast<std::ptrdiff_t>(outs.size()));
      continue;
    }
    if (outs.size() == 1)
      cpu::matmul(*threads_, targets[0].type, targets[0].W, targets[0].N, K, x, n, targets[0].y, options_.precision,
                  targets[0].packed);
    else
      cpu::matmul_group(*threads_, targets.data(), static_cast<int>(outs.size()), K, x, n, options_.precision);
  }
  for (size_t i = 0; i < shared.size(); i += kMaxGroup)
    cpu::matmul_group(*threads_, shared.data() + i, static_cast<int>(std::min(kMaxGroup, shared.size() - i)), K,
                      act(in), 1, options_.precision);
  for (const ExpertMatmulOut& o : outs) {  // gpt-oss: each pair's row plus its expert's bias row
    const std::vector<float>& bias = expert_biases(L, o.w);
    if (bias.empty()) continue;
    const int64_t rows = expert_matrices(L, o.w)[0].rows;
    for (int32_t e = 0; e < routing_.experts; ++e)
      for (int32_t p = routing_.expert_begin[e]; p < routing_.expert_begin[e + 1]; ++p)
        cpu::add_inplace(act(o.out) + p * rows, bias.data() + e * rows, rows);
  }
}

void CpuBackend::combine_experts(Act out) {
  const int64_t dim = model_.config().dim;
  const float* y = act(Act::kExpertOut);
  float* o = act(out);
  for (int64_t t = 0; t < routing_.tokens; ++t) {
    float* row = o + t * dim;
    std::fill_n(row, dim, 0.0f);
    for (int32_t j = 0; j < routing_.used; ++j) {
      const int32_t p = routing_.token_pair[t * routing_.used + j];
      const float w = routing_.pair_weight[p];
      const float* yr = y + static_cast<int64_t>(p) * dim;
      for (int64_t d = 0; d < dim; ++d) row[d] += w * yr[d];
    }
  }
}

void CpuBackend::glu(Activation a) {
  const int64_t n = static_cast<int64_t>(positions_.size()) * act_width(model_.config(), Act::kGate);
  switch (a) {
    case Activation::kSilu: cpu::silu_mul(act(Act::kGate), act(Act::kUp), n); break;
    case Activation::kGeluTanh: cpu::gelu_tanh_mul(act(Act::kGate), act(Act::kUp), n); break;
    case Activation::kSwigluOai: cpu::swiglu_oai_mul(act(Act::kGate), act(Act::kUp), n); break;
  }
}

void CpuBackend::add(Act x, Act y) {
  cpu::add_inplace(act(x), act(y), static_cast<int64_t>(positions_.size()) * act_width(model_.config(), x));
}

void CpuBackend::final_norm(std::span<const int64_t> rows) {
  const ModelConfig& c = model_.config();
  const int64_t n = static_cast<int64_t>(rows.size());
  picked_.resize(n * c.dim);
  const float* x = act(Act::kX);
  for (int64_t i = 0; i < n; ++i) std::copy_n(x + rows[i] * c.dim, c.dim, &picked_[i * c.dim]);
  cpu::rms_norm(picked_.data(), weights_.output_norm.data(), picked_.data(), n, c.dim, c.rms_eps);
}

void CpuBackend::hidden(std::span<const int64_t> rows, std::vector<float>& out) {
  final_norm(rows);
  out = picked_;
}

void CpuBackend::logits(std::span<const int64_t> rows, std::vector<float>& out) {
  const int64_t n = static_cast<int64_t>(rows.size());
  final_norm(rows);
  const WeightMatrix& w = weights_.output;
  out.resize(n * w.rows);
  if (n == 0) return;
  cpu::matmul(*threads_, w.type, w.data, w.rows, w.cols, picked_.data(), n, out.data(), options_.precision,
              w.packed.get());
}

}  // namespace fathom
