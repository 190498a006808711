#pragma once
// At most limits.max_requests_per_key generation and embedding requests in flight (queued or
// running; an HTTP stream until it is sent) per API key, over HTTP and gRPC together: without it
// one key's client could fill the engine's seats and queue, and every other key's request would
// get 429 until it stopped. One counter per configured key (the index api_key_index gives), so the
// state is bounded by the configuration.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace fathom {

class KeyLimiter {
 public:
  // `keys`: how many API keys are configured; `per_key` 0: no limit.
  KeyLimiter(size_t keys, int32_t per_key);

  // A request's hold on its key's share, released when it is destroyed.
  class Slot {
   public:
    Slot() = default;
    explicit Slot(std::atomic<int32_t>* count) : count_(count) {}
    Slot(Slot&& o) noexcept : count_(o.count_) { o.count_ = nullptr; }
    Slot& operator=(Slot&&) = delete;
    Slot(const Slot&) = delete;
    ~Slot() {
      if (count_) count_->fetch_sub(1, std::memory_order_acq_rel);
    }

   private:
    std::atomic<int32_t>* count_ = nullptr;
  };

  // A slot for the key at `index` (nullopt: no key, as when keys are off: an empty slot); nullopt
  // when that key already has per_key requests in flight.
  std::optional<Slot> acquire(std::optional<size_t> index);
  // What a request refused by acquire() is told (HTTP 429, gRPC RESOURCE_EXHAUSTED).
  std::string refusal() const;

 private:
  const size_t keys_;
  const int32_t per_key_;
  std::unique_ptr<std::atomic<int32_t>[]> in_flight_;
};

}  // namespace fathom
