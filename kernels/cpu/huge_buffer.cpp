#include "kernels/cpu/huge_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <new>
#include <utility>

namespace fathom {
namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}  // namespace

size_t page_bytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

SharedPages::SharedPages(size_t bytes) : size_((bytes + page_bytes() - 1) / page_bytes() * page_bytes()) {
  fd_ = memfd_create("fathom-kv-shared", MFD_CLOEXEC);
  if (fd_ < 0) throw std::bad_alloc();
  if (ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
    close(fd_);
    throw std::bad_alloc();
  }
}

SharedPages::~SharedPages() {
  if (fd_ >= 0) close(fd_);
}

HugePageBuffer::HugePageBuffer(size_t bytes, const SharedPages& tail) {
  if (bytes % page_bytes() != 0) throw std::bad_alloc();  // a caller's bug: the tail must start on a page
  map(bytes + tail.size(), bytes);
  if (tail.size() == 0) return;
  // Replace the last tail.size() bytes of the private mapping by the shared pages, and fault them in.
  void* at = mmap(data_ + bytes, tail.size(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, tail.fd(), 0);
  if (at == MAP_FAILED) {
    munmap(data_, mapped_);
    data_ = nullptr;
    throw std::bad_alloc();
  }
  for (size_t off = bytes; off < size_; off += page_bytes()) data_[off] = std::byte{0};
}

HugePageBuffer::HugePageBuffer(size_t bytes) { map(bytes, bytes); }

void HugePageBuffer::map(size_t bytes, size_t fault_bytes) {
  size_ = bytes;
  if (bytes == 0) return;
  mapped_ = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  // Over-map by one huge page and trim, so the region starts on a 2 MiB boundary.
  const size_t span = mapped_ + kHugePage;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > base) munmap(raw, aligned - base);
  const uintptr_t end = base + span, used_end = aligned + mapped_;
  if (end > used_end) munmap(reinterpret_cast<void*>(used_end), end - used_end);
  data_ = reinterpret_cast<std::byte*>(aligned);
  madvise(data_, mapped_, MADV_HUGEPAGE);  // advisory: failure leaves ordinary pages
  for (size_t off = 0; off < fault_bytes; off += page_bytes()) data_[off] = std::byte{0};  // now, not mid-request
}

HugePageBuffer::~HugePageBuffer() {
  if (data_) munmap(data_, mapped_);
}

HugePageBuffer::HugePageBuffer(HugePageBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      mapped_(std::exchange(other.mapped_, 0)) {}

HugePageBuffer& HugePageBuffer::operator=(HugePageBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) munmap(data_, mapped_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    mapped_ = std::exchange(other.mapped_, 0);
  }
  return *this;
}

}  // namespace fathom
