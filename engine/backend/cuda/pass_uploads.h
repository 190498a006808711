#pragma once
// Small per-pass uploads (the hot-row cache's copy lists and map changes) without a cudaMemcpy each: the
// host writes them into mapped pinned memory and the kernels launched after read them there in
// place, so the host never waits for the device to upload a few KB. Everything put during a pass
// stays valid until reset(), which the backend calls when the next pass starts — after the last
// pass's synchronous copy of its logits, or after synchronising the stream when a pass was
// abandoned — so no queued kernel still reads what is overwritten.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#include "engine/backend/cuda/device_array.h"

namespace fathom {
namespace cuda_backend_detail {

class PassUploads {
 public:
  // Copies v into the area and returns the device's pointer to it (null for an empty v).
  template <typename T>
  const T* put(const std::vector<T>& v) {
    if (v.empty()) return nullptr;
    const size_t bytes = v.size() * sizeof(T);
    if (chunks_.empty() || chunks_.back().used + bytes + kAlign > chunks_.back().size) {
      const size_t size = std::max<size_t>({bytes + kAlign, kMinChunk, chunks_.empty() ? 0 : 2 * chunks_.back().size});
      chunks_.emplace_back();
      chunks_.back().mem.reserve(size);
      chunks_.back().size = size;
    }
    Chunk& c = chunks_.back();
    c.used = (c.used + kAlign - 1) / kAlign * kAlign;
    std::memcpy(c.mem.host() + c.used, v.data(), bytes);
    const T* device = reinterpret_cast<const T*>(c.mem.get() + c.used);
    c.used += bytes;
    return device;
  }
  // Forgets everything put so far (see above for when that is safe); keeps the largest chunk.
  void reset() {
    if (chunks_.size() > 1) chunks_.erase(chunks_.begin(), chunks_.end() - 1);
    if (!chunks_.empty()) chunks_.back().used = 0;
  }

 private:
  static constexpr size_t kAlign = 16, kMinChunk = size_t{1} << 16;
  struct Chunk {
    DeviceArray<std::byte> mem{Memory::kMappedHost};
    size_t used = 0, size = 0;
  };
  std::vector<Chunk> chunks_;
};

}  // namespace cuda_backend_detail
}  // namespace fathom
