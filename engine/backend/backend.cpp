#include "engine/backend/backend.h"

#include <algorithm>
#include <climits>

#include "base/error.h"
#include "base/failpoints.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/model/model.h"

namespace fathom {

Backend::Backend(const Model& model, const KvLayout& layout, int32_t num_blocks)
    : model_(model), kv_layout_(layout), kv_blocks_(num_blocks) {
  FATHOM_CHECK(num_blocks >= 1);
}

Backend::~Backend() = default;

void Backend::check_policy(const AttentionPolicy& requested) const {
  const AttentionPolicy policy = resolve_auto(requested);
  if (implements(policy.kind)) return;
  std::string available;
  for (PolicyKind k = 0; k < policy_count(); ++k)
    if (implements(resolve_auto(AttentionPolicy(k)).kind)) {
      if (!available.empty()) available += ", ";
      available += policy_name(k);
    }
  throw Error("attention policy '" + policy.name() + "' is not implemented by the " + name() + " backend (available: " +
              available + ")");
}

void Backend::copy_block(int32_t src, int32_t dst) {
  failpoints::hit("kv_copy");
  copy_block_impl(src, dst);
}

void Backend::read_block(int32_t block, std::byte* dst) {
  failpoints::hit("kv_copy");
  read_block_impl(block, dst);
}

void Backend::write_block(int32_t block, const std::byte* src) {
  failpoints::hit("kv_copy");
  write_block_impl(block, src);
}

int32_t Backend::reserve_host_tier(int32_t, int32_t) { return 0; }

void Backend::copy_slot(KvTier from, int32_t from_slot, KvTier to, int32_t to_slot) {
  failpoints::hit("kv_copy");
  if (from == KvTier::kDevice && to == KvTier::kDevice) copy_block_impl(from_slot, to_slot);  // every backend has it
  else copy_slot_impl(from, from_slot, to, to_slot);
}

void Backend::exchange_slots(int32_t device_slot, int32_t host_slot) {
  failpoints::hit("kv_copy");
  exchange_slots_impl(device_slot, host_slot);
}

StepStats& StepStats::operator+=(const StepStats& o) {
  staged_bytes += o.staged_bytes;
  expert_bytes += o.expert_bytes;
  for (int k = 0; k < kMaxPolicies; ++k) {
    hot_rows.hits[k] += o.hot_rows.hits[k];
    hot_rows.misses[k] += o.hot_rows.misses[k];
    hot_rows.fallbacks[k] += o.hot_rows.fallbacks[k];
    kv_read[k] += o.kv_read[k];
    for (int ran = 0; ran < kMaxPolicies; ++ran) attention_steps[k][ran] += o.attention_steps[k][ran];
  }
  return *this;
}

StepStats Backend::forward(const BatchPlan& plan, std::vector<float>& logits, std::vector<float>* hidden) {
  step_ = {};
  run_forward(model_.config(), kv_layout_, *this, plan, logits, hidden, step_.kv_read, step_.attention_steps);
  return step_;
}

int32_t Backend::prepare_break_even(const AttentionPolicy& requested) {
  const AttentionPolicy p = resolve_auto(requested);
  if (p.kind == kDensePolicy || p.min_keys != AttentionPolicy::kMeasuredBreakEven) return -1;
  return sparse_break_even(p);
}

int32_t kv_blocks_for_budget(const Model& model, const ModelOptions& options, size_t block_bytes) {
  if (options.block_size <= 0 || options.block_size > 1024)
    throw Error("kv block size must be in [1, 1024], got " + std::to_string(options.block_size));
  int64_t bytes = options.kv_cache_bytes;
  if (bytes <= 0) bytes = static_cast<int64_t>(block_bytes) * (model.config().context_length / options.block_size + 64);
  const int64_t blocks = bytes / static_cast<int64_t>(block_bytes);
  if (blocks < 1) throw Error("kv cache budget of " + std::to_string(bytes) + " bytes holds no block");
  return static_cast<int32_t>(std::min<int64_t>(blocks, INT32_MAX));
}

namespace {
BackendFactory& cuda_factory() {
  static BackendFactory factory;
  return factory;
}
}  // namespace

void register_cuda_backend(BackendFactory factory) { cuda_factory() = std::move(factory); }

std::unique_ptr<Backend> make_backend(const Model& model, const ModelOptions& options) {
  if (options.backend == "cpu") return std::make_unique<CpuBackend>(model, options);
  if (options.backend == "cuda") {
    if (!cuda_factory()) throw Error("--backend cuda: this build has no CUDA backend (nvcc was not found at build time)");
    return cuda_factory()(model, options);
  }
  throw Error("unknown backend '" + options.backend + "' (expected cpu or cuda)");
}

}  // namespace fathom
