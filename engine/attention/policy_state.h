#pragma once
// The state a decode attention policy keeps across the steps of one sequence, per layer (HiP's
// cached mask, ALISA's attention mass): each policy defines its own type (a PolicyLayerState) in
// its own files and finds it through layer_state<T>(); a backend may keep its own beside it
// (the CUDA backend: ALISA's mass on the device). Reset when the sequence is recomputed, copied
// on fork.
#include <cstdint>
#include <memory>
#include <vector>

namespace fathom {

// Owns a polymorphic, cloneable state; copying the owner clones it (a fork gets its own copy),
// destroying it frees it (a finished or recomputed sequence).
template <typename Base>
class ClonedPtr {
 public:
  ClonedPtr() = default;
  ClonedPtr(const ClonedPtr& o) : p_(o.p_ ? o.p_->clone() : nullptr) {}
  ClonedPtr& operator=(const ClonedPtr& o) {
    if (this != &o) p_ = o.p_ ? o.p_->clone() : nullptr;
    return *this;
  }
  ClonedPtr(ClonedPtr&&) noexcept = default;
  ClonedPtr& operator=(ClonedPtr&&) noexcept = default;
  Base* get() const { return p_.get(); }
  void reset(std::unique_ptr<Base> p) { p_ = std::move(p); }

 private:
  std::unique_ptr<Base> p_;
};

// A policy's own per-layer state (engine/attention/policies/).
class PolicyLayerState {
 public:
  virtual ~PolicyLayerState() = default;
  virtual std::unique_ptr<PolicyLayerState> clone() const = 0;
};

// State a backend keeps for one layer of one sequence in its own memory, opaque to the engine.
class BackendLayerState {
 public:
  virtual ~BackendLayerState() = default;
  virtual std::unique_ptr<BackendLayerState> clone() const = 0;  // a fork's copy
};
using BackendLayerStatePtr = ClonedPtr<BackendLayerState>;

struct LayerPolicyState {
  ClonedPtr<PolicyLayerState> policy;  // the policy's own state (layer_state<T>)
  BackendLayerStatePtr backend;        // a backend's own per-layer state (unused by the CPU backend)
  // This layer's rank among the layers the policy reads (layer_uses_policy): how many such layers
  // lie below it. Set by the forward before the layer's first sparse step; −1 until then.
  int32_t rank = -1;
};

// Per sequence, one entry per layer.
struct SeqPolicyState {
  std::vector<LayerPolicyState> layers;
};

// The state of type T in `slot`, created there if absent (or if another policy's: a layer's
// state serves one policy at a time).
template <typename T, typename Base>
T& state_of(ClonedPtr<Base>& slot) {
  if (dynamic_cast<T*>(slot.get()) == nullptr) slot.reset(std::make_unique<T>());
  return static_cast<T&>(*slot.get());
}
template <typename T>
T& layer_state(LayerPolicyState& st) {
  return state_of<T>(st.policy);
}
// The state of type T if the layer has one (else null).
template <typename T>
const T* find_layer_state(const LayerPolicyState& st) {
  return dynamic_cast<const T*>(st.policy.get());
}

}  // namespace fathom
