#pragma once
// A forward-pass backend: runs a whole BatchPlan (what Model::forward runs on the CPU) on some
// device, holding its own copy of the weights and its own paged KV storage.
//
// Ownership of KV blocks. The scheduler keeps allocating block ids from the model's CPU-side
// BlockPool (Model::kv_pool()), which then only acts as the allocator (ids, reference counts,
// free list, prefix cache); a device backend keeps its own K/V storage with the same number of
// blocks, addressed by the same ids, so a SeqStep's block table means the same on both sides.
// The data of a block lives only where the backend writes it: block data moves (copy-on-write of
// a forked sequence's partial block, swapping to the host tier) must go through the backend's
// copy_block / read_block / write_block, not the pool's.
//
// Threading: one backend is driven by one thread (the engine thread), like Model::forward.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/attention/policy.h"
#include "engine/batch_plan.h"
#include "engine/model.h"

namespace fathom {

class ForwardBackend {
 public:
  virtual ~ForwardBackend() = default;

  // "cpu", "cuda": for logs and /metrics.
  virtual std::string name() const = 0;

  // Runs the plan exactly as Model::forward specifies: appends every step's K/V at its
  // positions (block tables index the allocator's block ids), attends, and writes
  // plan.logits_rows() rows of vocab floats to `logits` (host memory, resized). Throws
  // fathom::Error on a device failure.
  virtual void forward(const BatchPlan& plan, std::vector<float>& logits) = 0;

  // KV bytes read by decode attention since the last call, per policy of the reading request
  // (indexed by PolicyKind), then reset: as Model::take_kv_read_bytes.
  virtual std::array<int64_t, kPolicyKinds> take_kv_read_bytes() = 0;

  // Block data moves, the backend's twins of BlockPool::copy_block / read_block / write_block.
  // block_bytes(): bytes of one block across every layer, the size read_block writes and
  // write_block reads (the backend's own layout: not necessarily the CPU pool's).
  virtual size_t block_bytes() const = 0;
  virtual void copy_block(int32_t src, int32_t dst) = 0;
  virtual void read_block(int32_t block, std::byte* dst) = 0;
  virtual void write_block(int32_t block, const std::byte* src) = 0;
};

// The CPU backend: Model's own forward pass and KV pool.
class CpuBackend final : public ForwardBackend {
 public:
  explicit CpuBackend(Model& model) : model_(model) {}
  std::string name() const override { return "cpu"; }
  void forward(const BatchPlan& plan, std::vector<float>& logits) override { model_.forward(plan, logits); }
  std::array<int64_t, kPolicyKinds> take_kv_read_bytes() override { return model_.take_kv_read_bytes(); }
  size_t block_bytes() const override { return model_.kv_pool().layout().block_bytes(); }
  void copy_block(int32_t src, int32_t dst) override { model_.kv_pool().copy_block(src, dst); }
  void read_block(int32_t block, std::byte* dst) override { model_.kv_pool().read_block(block, dst); }
  void write_block(int32_t block, const std::byte* src) override { model_.kv_pool().write_block(block, src); }

 private:
  Model& model_;
};

}  // namespace fathom
