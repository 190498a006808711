#pragma once
// The host tier of the KV cache: a byte budget for blocks swapped out of the device pool.
// (On the CPU backend both tiers are host memory; the tier boundary is what a GPU build pages
// across, and the accounting is the same.) The bytes themselves travel with the sequence.
#include <cstdint>

namespace fathom {

class HostTier {
 public:
  explicit HostTier(int64_t budget_bytes) : budget_(budget_bytes) {}
  bool try_reserve(int64_t bytes) {
    if (used_ + bytes > budget_) return false;
    used_ += bytes;
    return true;
  }
  void release(int64_t bytes) { used_ -= bytes; }
  int64_t used() const { return used_; }
  int64_t budget() const { return budget_; }

 private:
  int64_t budget_;
  int64_t used_ = 0;
};

}  // namespace fathom
