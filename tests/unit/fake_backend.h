#pragma once
// A Backend without compute for the scheduler's tests (test_scheduler, test_scheduler_parts): the
// real KV bookkeeping of the base class, no-op ops, and logits that are a function of position.
#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "engine/backend/backend.h"
#include "engine/model/model.h"

namespace fathom {

// Every op is a no-op but logits: row r of a step gets a one-hot at token 100 + position % 50
// (never an end-of-generation token). `fail` decides per forward pass whether it throws.
class FakeBackend final : public Backend {
 public:
  FakeBackend(const Model& model, int32_t blocks, int32_t host = 0, int32_t block_size = 16, int32_t scratch = 0)
      : Backend(model, KvLayout{model.config().n_layers, 1, 8, block_size, KvDtype::kF32, false}, blocks),
        host_blocks(host),
        scratch_blocks(scratch) {}
  std::string name() const override { return "fake"; }
  bool implements(PolicyKind kind) const override { return kind == kDensePolicy; }
  bool implements_groups() const override { return false; }
  // Speculative decoding: rollback_kv is recorded as (plan index, kept rows), on when `rollback`.
  bool rollback = false;
  std::vector<std::pair<int32_t, int32_t>> rollbacks;
  bool implements_rollback() const override { return rollback; }
  void rollback_kv(int32_t seq, int32_t kept) override { rollbacks.emplace_back(seq, kept); }
  size_t block_bytes() const override { return 64; }

  std::function<bool(const BatchPlan&)> fail;
  int passes = 0;
  int slot_copies = 0;  // block copies within or between tiers (a fork's partial block, tier moves)
  int32_t host_blocks = 0;  // the host tier this backend offers
  int32_t reserve_host_tier(int32_t blocks, int32_t) override { return std::min(blocks, host_blocks); }
  int32_t scratch_blocks = 0;  // the recompute scratch it offers: entries kv_blocks() + i
  int32_t reserve_recompute_scratch(int32_t blocks) override { return std::min(blocks, scratch_blocks); }
  int32_t recompute_slot(int32_t i) const override { return kv_blocks() + i; }

 protected:
  void copy_block_impl(int32_t, int32_t) override { ++slot_copies; }
  void read_block_impl(int32_t, std::byte*) override {}
  void write_block_impl(int32_t, const std::byte*) override {}
  void copy_slot_impl(KvTier, int32_t, KvTier, int32_t) override { ++slot_copies; }
  void exchange_slots_impl(int32_t, int32_t) override {}
  void begin_pass(const BatchPlan& plan) override {
    ++passes;
    if (fail && fail(plan)) throw Error("injected device failure");
    positions_.clear();
    const int32_t bs = kv_layout().block_size;
    for (const SeqStep& s : plan.seqs)
      for (size_t i = 0; i < s.tokens.size(); ++i) {
        const int32_t pos = s.pos0 + static_cast<int32_t>(i);
        positions_.push_back(pos);
        // What a real backend relies on: the step writes device slots only (physical >= 0).
        auto outside = [&](int32_t b) { return (*s.blocks)[b] < 0 || (*s.blocks)[b] >= kv_blocks() + scratch_blocks; };
        if (outside(pos / bs) || (pos % bs == 0 && pos > 0 && outside(pos / bs - 1)))
          throw std::logic_error("a step writes (or reads the V sum of the block before) outside the device tier");
      }
  }
  void rms_norm(Act, Act, int32_t, LayerVector, int64_t, int32_t) override {}
  void matmul(int32_t, std::span<const MatmulOut>, Act) override {}
  void add_bias(Act, int32_t, LayerVector) override {}
  void rope(int32_t) override {}
  void append_kv(int32_t) override {}
  void attend_dense(int32_t, int32_t, int32_t) override {}
  int64_t attend_sparse(int32_t, int32_t, const AttentionPolicy&, LayerPolicyState&) override { return 0; }
  int64_t attend_group(int32_t, const AttentionGroup&) override { return 0; }
  void glu(Activation) override {}
  void add(Act, Act) override {}
  // Row r's hidden state: its position in every dimension.
  void hidden(std::span<const int64_t> rows, std::vector<float>& out) override {
    const int32_t dim = model_.config().dim;
    out.resize(rows.size() * static_cast<size_t>(dim));
    for (size_t r = 0; r < rows.size(); ++r)
      std::fill_n(out.begin() + static_cast<std::ptrdiff_t>(r * dim), dim, static_cast<float>(positions_[rows[r]]));
  }
  void logits(std::span<const int64_t> rows, std::vector<float>& out) override {
    const int32_t vocab = model_.vocab();
    out.assign(rows.size() * static_cast<size_t>(vocab), 0.0f);
    for (size_t r = 0; r < rows.size(); ++r) out[r * vocab + 100 + positions_[rows[r]] % 50] = 10.0f;
  }

 private:
  std::vector<int32_t> positions_;
};

}  // namespace fathom
