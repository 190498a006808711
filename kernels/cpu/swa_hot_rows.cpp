#include "kernels/cpu/swa_hot_rows.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace fathom::cpu {
namespace {

constexpr size_t kAlign = 64;  // rows start on cache lines (a d 64 f16 row is exactly two)
constexpr int32_t kOneBlock = 0;  // every view's block table: one block of `capacity` slots

}  // namespace

void SwaHotRows::FreeAligned::operator()(uint8_t* p) const { std::free(p); }

SwaHotRows::SwaHotRows(const SwaHotRows& o) { *this = o; }

SwaHotRows& SwaHotRows::operator=(const SwaHotRows& o) {
  if (this == &o) return *this;
  dtype_ = o.dtype_;
  n_kv_ = o.n_kv_;
  head_dim_ = o.head_dim_;
  row_bytes_ = o.row_bytes_;
  capacity_ = 0;
  size_ = 0;
  k_.reset();
  v_.reset();
  reserve(o.capacity_);
  const size_t plane = static_cast<size_t>(n_kv_) * capacity_ * row_bytes_;
  if (plane > 0) {
    std::memcpy(k_.get(), o.k_.get(), plane);
    std::memcpy(v_.get(), o.v_.get(), plane);
  }
  size_ = o.size_;
  slot_pos_ = o.slot_pos_;
  pos_slot_ = o.pos_slot_;
  mark_ = o.mark_;
  stamp_ = o.stamp_;
  refresh_view();
  return *this;
}

bool SwaHotRows::supports(const PagedKvView& kv) {
  return kv.prefetcher == nullptr && (kv.dtype == KvDtype::kF32 || kv.dtype == KvDtype::kF16);
}

int64_t SwaHotRows::bytes() const {
  return 2LL * n_kv_ * capacity_ * row_bytes_ +
         static_cast<int64_t>(sizeof(int32_t)) * static_cast<int64_t>(slot_pos_.size() + pos_slot_.size() + mark_.size());
}

void SwaHotRows::reset(const PagedKvView& kv) {
  dtype_ = kv.dtype;
  n_kv_ = kv.n_kv_heads;
  head_dim_ = kv.head_dim;
  row_bytes_ = static_cast<int64_t>(kv_dtype_bytes(kv.dtype)) * kv.head_dim;
  capacity_ = 0;
  size_ = 0;
  k_.reset();
  v_.reset();
  slot_pos_.clear();
  pos_slot_.clear();
  mark_.clear();
  stamp_ = 0;
  refresh_view();
}

void SwaHotRows::reserve(int32_t slots) {
  if (slots <= capacity_) return;
  // Grown by half again at least: the kept set grows by one row every 2 / ratio steps.
  const int32_t cap = std::max(slots, capacity_ + capacity_ / 2);
  const size_t plane = (static_cast<size_t>(n_kv_) * cap * row_bytes_ + kAlign - 1) / kAlign * kAlign;
  Plane k(static_cast<uint8_t*>(std::aligned_alloc(kAlign, std::max(plane, kAlign))));
  Plane v(static_cast<uint8_t*>(std::aligned_alloc(kAlign, std::max(plane, kAlign))));
  if (!k || !v) throw std::bad_alloc();
  for (int32_t g = 0; g < n_kv_ && size_ > 0; ++g) {  // each head's slots keep their index
    std::memcpy(k.get() + static_cast<int64_t>(g) * cap * row_bytes_, row(k_.get(), g, 0), size_ * row_bytes_);
    std::memcpy(v.get() + static_cast<int64_t>(g) * cap * row_bytes_, row(v_.get(), g, 0), size_ * row_bytes_);
  }
  k_ = std::move(k);
  v_ = std::move(v);
  capacity_ = cap;
  slot_pos_.resize(cap, -1);
  refresh_view();
}

void SwaHotRows::refresh_view() {
  view_ = PagedKvView{};
  view_.k = k_.get();
  view_.v = v_.get();
  view_.dtype = dtype_;
  view_.block_table = &kOneBlock;
  view_.block_size = std::max(capacity_, 1);  // one block: slot s of head g at (g · capacity + s) · d
  view_.n_kv_heads = n_kv_;
  view_.head_dim = head_dim_;
}

void SwaHotRows::copy_row_in(const PagedKvView& kv, int32_t pos, int32_t slot) {
  const int64_t elem = static_cast<int64_t>(kv_dtype_bytes(dtype_));
  for (int32_t g = 0; g < n_kv_; ++g) {
    const int64_t off = (kv.tile_offset(pos / kv.block_size, g) + static_cast<int64_t>(pos % kv.block_size) * head_dim_) * elem;
    std::memcpy(row(k_.get(), g, slot), static_cast<const uint8_t*>(kv.k) + off, row_bytes_);
    std::memcpy(row(v_.get(), g, slot), static_cast<const uint8_t*>(kv.v) + off, row_bytes_);
  }
  slot_pos_[slot] = pos;
  pos_slot_[pos] = slot;
}

void SwaHotRows::move_slot(int32_t from, int32_t to) {
  for (int32_t g = 0; g < n_kv_; ++g) {
    std::memcpy(row(k_.get(), g, to), row(k_.get(), g, from), row_bytes_);
    std::memcpy(row(v_.get(), g, to), row(v_.get(), g, from), row_bytes_);
  }
  slot_pos_[to] = slot_pos_[from];
  pos_slot_[slot_pos_[to]] = to;
  slot_pos_[from] = -1;
}

int32_t SwaHotRows::update(const PagedKvView& kv, const int32_t* kept, int32_t n, int32_t S) {
  if (!supports(kv)) throw std::invalid_argument("SwaHotRows: needs a resident f32/f16 view");
  if (kv.dtype != dtype_ || kv.n_kv_heads != n_kv_ || kv.head_dim != head_dim_ || S < static_cast<int32_t>(pos_slot_.size()))
    reset(kv);
  pos_slot_.resize(S, -1);
  mark_.resize(S, 0);
  if (++stamp_ == 0) {  // wrapped: old stamps could match again
    std::fill(mark_.begin(), mark_.end(), 0u);
    stamp_ = 1;
  }
  for (int32_t i = 0; i < n; ++i) mark_[kept[i]] = stamp_;
  // Slots whose position left the set become holes (ascending).
  thread_local std::vector<int32_t> holes, entering;
  holes.clear();
  entering.clear();
  for (int32_t s = 0; s < size_; ++s)
    if (mark_[slot_pos_[s]] != stamp_) {
      pos_slot_[slot_pos_[s]] = -1;
      slot_pos_[s] = -1;
      holes.push_back(s);
    }
  for (int32_t i = 0; i < n; ++i)
    if (pos_slot_[kept[i]] < 0) entering.push_back(kept[i]);
  const int32_t held = size_ - static_cast<int32_t>(holes.size());
  reserve(held + static_cast<int32_t>(entering.size()));
  // Entering rows fill the holes lowest first, then go past the end.
  size_t h = 0;
  int32_t end = size_;
  for (int32_t p : entering) copy_row_in(kv, p, h < holes.size() ? holes[h++] : end++);
  // A smaller set: the highest held slots move down into the holes left below n.
  int32_t top = end - 1;
  for (; h < holes.size() && holes[h] < n; ++h) {
    while (slot_pos_[top] < 0) --top;
    move_slot(top--, holes[h]);
  }
  size_ = n;
  return static_cast<int32_t>(entering.size());
}

}  // namespace fathom::cpu
