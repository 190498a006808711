#pragma once
// Device memory for the CUDA backend: a growable DeviceArray (device memory, or page-locked host
// memory mapped into the device's address space: the host KV tier), and the error check that
// turns a failed CUDA call into fathom::Error (the engine's error boundary then fails the step's
// requests).
#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "kernels/cuda/emu/cuda_emu.h"

namespace fathom {
namespace cuda_backend_detail {  // named: unique across the CUDA sources

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuda backend: ") + what + ": " + cudaGetErrorString(e));
}
#define FATHOM_CUDA_BACKEND_OK(expr) ::fathom::cuda_backend_detail::cuda_ok((expr), #expr)

// Where a DeviceArray lives: device memory, or page-locked host memory the device reads in place
// (cudaHostAllocMapped; get() is the device's pointer to it).
enum class Memory { kDevice, kMappedHost };

// A device allocation of n elements of T; reserve() grows it (contents not kept).
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(Memory memory) : memory_(memory) {}
  ~DeviceArray() { release(); }
  DeviceArray(DeviceArray&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), host_(std::exchange(o.host_, nullptr)), n_(std::exchange(o.n_, 0)),
        memory_(o.memory_) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      host_ = std::exchange(o.host_, nullptr);
      n_ = std::exchange(o.n_, 0);
      memory_ = o.memory_;
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  // For scratch that grows with a sequence (a step's workspace, its kept positions): n rounded up
  // to a power of two, at least 1024, so the buffer is reallocated O(log n) times and not at every
  // step (the cudaFree of the old buffer synchronises the device).
  void reserve_grow(size_t n) {
    if (n <= n_ && p_ != nullptr) return;
    size_t rounded = 1024;
    while (rounded < n) rounded *= 2;
    reserve(rounded);
  }

  void reserve(size_t n) {
    if (n <= n_ && p_ != nullptr) return;
    release();
    const size_t bytes = std::max<size_t>(n, 1) * sizeof(T);
    if (memory_ == Memory::kDevice) {
      FATHOM_CUDA_BACKEND_OK(cudaMalloc(&p_, bytes));
    } else {
      FATHOM_CUDA_BACKEND_OK(cudaHostAlloc(&host_, bytes, cudaHostAllocMapped));
      void* device = nullptr;
      FATHOM_CUDA_BACKEND_OK(cudaHostGetDevicePointer(&device, host_, 0));
      p_ = static_cast<T*>(device);
    }
    n_ = n;
  }
  void upload(const T* host, size_t n) {
    reserve(n);
    if (n > 0) FATHOM_CUDA_BACKEND_OK(cudaMemcpy(p_, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  T* get() const { return p_; }
  T* host() const { return host_; }  // kMappedHost: the host's pointer to the same bytes (else null)

 private:
  void release() {
    if (host_ != nullptr) {
      cudaFreeHost(host_);
    } else if (p_ != nullptr) {
      cudaFree(p_);
    }
    p_ = host_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;     // the device's pointer
  T* host_ = nullptr;  // kMappedHost: the host's pointer to the same bytes
  size_t n_ = 0;
  Memory memory_ = Memory::kDevice;
};

}  // namespace cuda_backend_detail
}  // namespace fathom
