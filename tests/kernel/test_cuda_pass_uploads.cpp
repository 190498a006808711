// The CUDA backend's per-pass upload area (engine/backend/cuda/pass_uploads.h) under the emulator:
// what the host puts is what the device reads at the returned pointer, aligned; earlier puts stay
// valid when the area grows a new chunk mid-pass; reset() starts over in the largest chunk.
#include "engine/backend/cuda/pass_uploads.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <vector>

namespace fathom::cuda_backend_detail {
namespace {

template <typename T>
std::vector<T> read_back(const T* device, size_t n) {
  std::vector<T> host(n);
  EXPECT_EQ(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

TEST(PassUploads, PutsStayReadableAcrossGrowthUntilReset) {
  PassUploads uploads;
  EXPECT_EQ(uploads.put(std::vector<int32_t>{}), nullptr);
  std::vector<std::vector<int64_t>> puts;
  std::vector<const int64_t*> where;
  for (size_t n : {3, 1000, 20000, 7, 50000}) {  // past the first 64 KiB chunk, then past the next
    std::vector<int64_t> v(n);
    std::iota(v.begin(), v.end(), static_cast<int64_t>(n) * 1000);
    where.push_back(uploads.put(v));
    puts.push_back(std::move(v));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(where.back()) % 16, 0u);
  }
  for (size_t i = 0; i < puts.size(); ++i) EXPECT_EQ(read_back(where[i], puts[i].size()), puts[i]) << i;
  uploads.reset();
  const std::vector<int32_t> small = {1, 2, 3};
  const int32_t* again = uploads.put(small);
  EXPECT_EQ(read_back(again, 3), small);
}

}  // namespace
}  // namespace fathom::cuda_backend_detail
