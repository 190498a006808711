#pragma once
// Writing back and dropping a range of memory from every level of the CPU's caches, so that the
// next read of it comes from DRAM. For measurements that must see memory as a decode step does
// (its other layers and the weights evict each layer's KV between two reads of it) on a machine
// whose last-level cache would otherwise hold the whole working set (this VM's L3: 480 MiB).
#include <cstddef>

namespace fathom::cpu {

// clflushopt (clflush without it) over every 64-byte line of [p, p + bytes), then a fence; a no-op
// off x86-64. Cost: about the bytes ÷ a few GB/s.
void evict_from_cache(const void* p, size_t bytes);

}  // namespace fathom::cpu
