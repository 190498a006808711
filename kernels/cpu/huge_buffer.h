#pragma once
// Zeroed, page-aligned memory for the KV planes and the repacked weights, backed by transparent
// huge pages where the kernel allows them (madvise(MADV_HUGEPAGE); Debian's default THP mode is
// "madvise"). Why: attention reads each (block, kv head) tile — 2-8 KiB — from a block scattered in a plane
// of up to gigabytes; with 4 KiB pages nearly every tile is a TLB miss (a two-level page walk in
// a VM). Measured on a shuffled 16k-token f16 cache (d 64, 16 layers' worth, 1 thread): dense
// attention 1.2-1.5x faster with 2 MiB pages. Weights streamed at decode cross a 4 KiB page every
// few rows, where the hardware prefetcher stops and a page walk starts. Falls back to ordinary pages silently.
#include <cstddef>

namespace fathom {

// The kernel's page size (4 KiB on x86-64; 16 or 64 KiB on some arm64 kernels).
size_t page_bytes();

// Zeroed pages that several HugePageBuffers map at their ends (a memfd): every buffer built over
// the same SharedPages reads and writes the same bytes there. The tiered KV cache's recompute
// scratch is one such region per plane, mapped after every layer's blocks, so a block id in it
// names the same memory in every layer (docs/tiered_kv.md, "Cache or recompute").
class SharedPages {
 public:
  explicit SharedPages(size_t bytes);  // rounded up to whole pages; throws std::bad_alloc
  ~SharedPages();
  SharedPages(const SharedPages&) = delete;
  SharedPages& operator=(const SharedPages&) = delete;
  int fd() const { return fd_; }
  size_t size() const { return size_; }

 private:
  int fd_ = -1;
  size_t size_ = 0;
};

class HugePageBuffer {
 public:
  HugePageBuffer() = default;
  explicit HugePageBuffer(size_t bytes);  // all bytes zero, every page faulted in
  // `bytes` of its own (a whole number of pages, page_bytes()) followed by `tail`'s pages: size()
  // is bytes + tail.size(). `tail` may be destroyed afterwards: the mapping keeps its pages.
  HugePageBuffer(size_t bytes, const SharedPages& tail);
  ~HugePageBuffer();
  HugePageBuffer(HugePageBuffer&& other) noexcept;
  HugePageBuffer& operator=(HugePageBuffer&& other) noexcept;
  HugePageBuffer(const HugePageBuffer&) = delete;
  HugePageBuffer& operator=(const HugePageBuffer&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  // Maps `bytes` (2 MiB aligned) and faults in the first `fault_bytes`.
  void map(size_t bytes, size_t fault_bytes);

  std::byte* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;  // bytes mapped at data_ (size_ rounded up to whole huge pages)
};

}  // namespace fathom
