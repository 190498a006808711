#pragma once
// A compacted copy of SWA's heavy hitters for one layer of one sequence: the K and V rows of the
// kept older positions, packed per kv head into consecutive slots, so that a decode step reads them
// as one stream instead of gathering short runs of rows from blocks scattered over the cache.
//
// Why: gathered rows cost the memory system's scattered-line rate (README, "Gathered rows cost…":
// ~13 GB/s for SWA's ~15-key runs against ~30 streamed on the same host), and prefetching them
// earlier does not move that floor. The kept set changes by a few positions a step (the mass it is
// chosen by decays slowly), so keeping the copy current costs those few rows' copies; the copy is a
// stream at every step after. It is the "hot set" a tiered cache keeps resident (HiP's hot-token
// cache), here for the CPU backend's resident views.
//
// Memory: 2 · kv_heads · |heavy hitters| · row bytes, SWA's k_global = S · ratio / 2 rows: at the
// default 1/4 one eighth of the layer's KV bytes (plus 8 bytes a position of bookkeeping), freed
// with the sequence's policy state. f32 / f16 only (INT8 rows carry parameters the copy does not).
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/paged_kv.h"

namespace fathom::cpu {

class SwaHotRows {
 public:
  SwaHotRows() = default;
  SwaHotRows(const SwaHotRows& o);
  SwaHotRows& operator=(const SwaHotRows& o);
  SwaHotRows(SwaHotRows&&) noexcept = default;
  SwaHotRows& operator=(SwaHotRows&&) noexcept = default;

  // Whether a copy can stand in for `kv`'s rows: a resident view (no prefetcher), f32 or f16.
  static bool supports(const PagedKvView& kv);

  // Makes slots [0, n) hold exactly the rows of positions kept[0..n) (distinct, each < S; any
  // order), copying from `kv` the rows of the positions not already held. A sequence of S keys
  // shorter than the last call's, or another KV shape, starts the copy afresh (rows are immutable
  // while a sequence only grows). Returns the number of rows copied in (per kv head).
  int32_t update(const PagedKvView& kv, const int32_t* kept, int32_t n, int32_t S);

  // The copy as a view: position s of kv head g is slot s (s < size()); no transposed K, no tiers.
  const PagedKvView& view() const { return view_; }
  // The position each slot holds: [size()].
  const int32_t* slot_positions() const { return slot_pos_.data(); }
  int32_t size() const { return size_; }
  // Bytes held (row copies and bookkeeping).
  int64_t bytes() const;

 private:
  void reset(const PagedKvView& kv);
  void reserve(int32_t slots);
  void copy_row_in(const PagedKvView& kv, int32_t pos, int32_t slot);
  void move_slot(int32_t from, int32_t to);
  uint8_t* row(uint8_t* plane, int32_t g, int32_t slot) const {
    return plane + (static_cast<int64_t>(g) * capacity_ + slot) * row_bytes_;
  }
  void refresh_view();

  struct FreeAligned {
    void operator()(uint8_t* p) const;
  };
  using Plane = std::unique_ptr<uint8_t[], FreeAligned>;

  KvDtype dtype_ = KvDtype::kF32;
  int32_t n_kv_ = 0, head_dim_ = 0;
  int64_t row_bytes_ = 0;
  int32_t capacity_ = 0, size_ = 0;
  Plane k_, v_;                      // [n_kv][capacity][head_dim], dtype
  std::vector<int32_t> slot_pos_;    // [capacity] position held by each slot
  std::vector<int32_t> pos_slot_;    // [S] slot holding each position, −1: none
  std::vector<uint32_t> mark_;       // [S] update()'s stamp: in this call's kept set
  uint32_t stamp_ = 0;
  PagedKvView view_;
};

}  // namespace fathom::cpu
