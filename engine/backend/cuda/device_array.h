#pragma once
// Device memory for the CUDA backend: a growable DeviceArray, and the error check that turns a
// failed CUDA call into fathom::Error (the engine's error boundary then fails the step's requests).
#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "kernels/cuda/emu/cuda_emu.h"

namespace fathom {
namespace cuda_backend_detail {  // named: the test includes the backend's sources in one TU

inline void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuda backend: ") + what + ": " + cudaGetErrorString(e));
}
#define FATHOM_CUDA_BACKEND_OK(expr) ::fathom::cuda_backend_detail::cuda_ok((expr), #expr)

// A device allocation of n elements of T; reserve() grows it (contents not kept).
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  ~DeviceArray() { release(); }
  DeviceArray(DeviceArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  void reserve(size_t n) {
    if (n <= n_ && p_ != nullptr) return;
    release();
    FATHOM_CUDA_BACKEND_OK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
    n_ = n;
  }
  void upload(const T* host, size_t n) {
    reserve(n);
    if (n > 0) FATHOM_CUDA_BACKEND_OK(cudaMemcpy(p_, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  T* get() const { return p_; }

 private:
  void release() {
    if (p_ != nullptr) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace cuda_backend_detail
}  // namespace fathom
