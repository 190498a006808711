#include "server/key_limiter.h"

namespace fathom {

KeyLimiter::KeyLimiter(size_t keys, int32_t per_key)
    : keys_(keys), per_key_(per_key), in_flight_(std::make_unique<std::atomic<int32_t>[]>(keys == 0 ? 1 : keys)) {}

std::optional<KeyLimiter::Slot> KeyLimiter::acquire(std::optional<size_t> index) {
  if (per_key_ <= 0 || !index || *index >= keys_) return Slot();
  std::atomic<int32_t>& count = in_flight_[*index];
  for (int32_t seen = count.load(std::memory_order_acquire); seen < per_key_;)
    if (count.compare_exchange_weak(seen, seen + 1, std::memory_order_acq_rel)) return Slot(&count);
  return std::nullopt;
}

std::string KeyLimiter::refusal() const {
  return "this API key has " + std::to_string(per_key_) +
         " requests in progress (limits.max_requests_per_key); retry when one ends";
}

}  // namespace fathom
