#pragma once
// A test fixture's KV planes in 2 MiB-page buffers, for the attention benchmarks
// (bench_sparse_attention, bench_gather).
#include <cstring>

#include "kernels/cpu/huge_buffer.h"
#include "tests/kernel/paged_kv_fixture.h"

namespace fathom {

// The fixture's planes copied into 2 MiB-page buffers, as the CPU backend's KV storage holds them
// (with the fixture's 4 KiB-page vectors nearly every tile read is a TLB miss the engine does
// not have; the sparse kernels, which touch many tiles for few bytes each, suffered most).
struct HugeKv {
  HugePageBuffer k, v, k_t, v_sum;
  PagedKvView view;
  explicit HugeKv(const testing::PagedKvFixture& f)
      : k(f.k.size()), v(f.v.size()), k_t(f.k_t.size()), v_sum(f.v_sum.size() * sizeof(float)), view(f.view(true, true)) {
    std::memcpy(k.data(), f.k.data(), f.k.size());
    std::memcpy(v.data(), f.v.data(), f.v.size());
    std::memcpy(k_t.data(), f.k_t.data(), f.k_t.size());
    std::memcpy(v_sum.data(), f.v_sum.data(), f.v_sum.size() * sizeof(float));
    view.k = k.data();
    view.v = v.data();
    view.k_t = k_t.data();
    view.v_sum = reinterpret_cast<const float*>(v_sum.data());
  }
};

}  // namespace fathom
