#pragma once
// Decode attention policy of a request (DESIGN.md "Attention policies"): which kernel reads the
// KV cache for the one query of a decode step. Prefill is always dense.
//
// `kv_read_ratio` (0, 1] is the one knob every sparse policy understands: the fraction of the
// dense KV bytes a step may read. Each policy turns it into its own parameters at the current
// sequence length S; explicit parameters override what the ratio derives. At ratio 1 every
// policy attends every key, i.e. equals dense.
//
// The policies themselves are registered in engine/attention/policy_registry.cpp, one line each;
// a policy's parameters (names, defaults, bounds) are a ParamSpec table in its own header
// (engine/attention/policies/), read here through Param handles. A request carries the
// parameters of every registered policy, so a server default set for one policy holds when a
// request switches to it.
#include <array>
#include <cstdint>
#include <span>
#include <string>

namespace fathom {

// A policy's index in the registry (policy_registry.cpp). Dense is always 0.
using PolicyKind = int32_t;
inline constexpr PolicyKind kDensePolicy = 0;
inline constexpr int kMaxPolicies = 8;        // registry capacity (per-policy counters are arrays)
inline constexpr int kMaxPolicyParams = 8;    // parameters per policy

int policy_count();                                        // registered policies
const char* policy_name(PolicyKind k);                     // the canonical name ("dense", "sparq", ...)
PolicyKind policy_kind(const std::string& name);            // by name or alias; throws fathom::Error naming the choices
std::string policy_names();                                 // "dense, sparq, ..." for messages

// One parameter of a policy, as written in its options object ("hip": {"refresh": 4}).
enum class ParamType {
  kInt,      // an integer >= min
  kOddInt,   // an odd integer >= min
  kBool,     // true or false
  kRatio,    // a number in (0, 1]
};
struct ParamSpec {
  const char* name;
  ParamType type;
  double initial;   // the default; kDerived: derived from kv_read_ratio at each step
  double min = 0;   // kInt, kOddInt: the smallest value a client may set
  double max = 1 << 30;  // kInt, kOddInt: the largest (every value fits an int32_t)
};
inline constexpr double kDerived = -1;  // an unset parameter the policy derives

// A handle to parameter `index` of the policy whose table is `table` (a policy header's
// constants, e.g. hip::kRefresh): reads and writes check that the table is the one addressed.
struct Param {
  std::span<const ParamSpec> table;
  int index;
};

struct AttentionPolicy {
  PolicyKind kind = kDensePolicy;
  double kv_read_ratio = 0.125;
  // Steps with fewer keys than this run densely (a sparse step does more work per key read, so
  // at short contexts it is slower than dense). kMeasuredBreakEven: the backend's measured
  // break-even for this policy (engine/backend/cpu/break_even.h); 0: sparse at every length.
  static constexpr int32_t kMeasuredBreakEven = -1;
  int32_t min_keys = kMeasuredBreakEven;

  AttentionPolicy();  // dense, every policy's parameters at their defaults
  explicit AttentionPolicy(PolicyKind k, double ratio = 0.125);
  static AttentionPolicy named(const std::string& name, double ratio = 0.125) {
    return AttentionPolicy(policy_kind(name), ratio);
  }

  std::string name() const { return policy_name(kind); }
  bool is(const char* name) const;  // kind is the policy `name` (canonical)

  // Parameters (of any registered policy, not only `kind`'s).
  double number(Param p) const { return values_[slot(p)]; }
  int32_t integer(Param p) const { return static_cast<int32_t>(values_[slot(p)]); }
  bool flag(Param p) const { return values_[slot(p)] != 0; }
  bool is_set(Param p) const { return values_[slot(p)] != kDerived; }  // not derived
  AttentionPolicy& set(Param p, double value) {
    values_[slot(p)] = value;
    return *this;
  }
  // The raw values of the policy whose table is `table` (for comparisons, e.g. break-even probes).
  std::span<const double> values_of(std::span<const ParamSpec> table) const;

  // Throws fathom::Error for a parameter out of range (the message names it: "hip.refresh").
  void validate() const;

 private:
  size_t slot(Param p) const;
  std::array<double, kMaxPolicies * kMaxPolicyParams> values_{};
};

// What a request's policy runs as (auto: the policy it stands for); the policy itself otherwise.
AttentionPolicy resolve_auto(const AttentionPolicy& p);

// The policy a backend measures the break-even of on behalf of `p`: the same kind at the
// effective ratio rounded up to a power of two up to 1/8 (1/64 ... 1/8), above it to a multiple
// of 1/8 (1/4, 3/8, ... 1; a larger ratio reads more, so its break-even is the conservative
// one); each policy may keep a few of its own parameters in the probe (HiP: its mask scope and
// refresh bucket); every other parameter derived. A bounded set: clients cannot make the backend
// measure without end.
AttentionPolicy break_even_probe(const AttentionPolicy& p);
// Whether two probes (break_even_probe results) are the same measurement.
bool same_break_even_probe(const AttentionPolicy& a, const AttentionPolicy& b);
// Whether a probe has the default value of every parameter its policy keeps in probes (the
// break-even /metrics exports: one series per policy and ratio).
bool is_default_probe(const AttentionPolicy& probe);

// True when `layer` reads the KV cache through the sparse policy (else dense): sliding-window
// layers already read at most their window and stay dense; a policy may keep leading layers dense
// (HiP).
bool layer_uses_policy(const AttentionPolicy& p, int32_t layer, bool sliding);

// How many layers below `layer` read through `p` (LayerPolicyState::rank), with sliding(l) telling
// whether layer l is a sliding-window one: the layers a policy reads take consecutive ranks,
// whatever their indices (Gemma 3's global layers are 5, 11, 17, ...).
template <typename SlidingOf>
int32_t policy_layer_rank(const AttentionPolicy& p, int32_t layer, SlidingOf&& sliding) {
  int32_t rank = 0;
  for (int32_t l = 0; l < layer; ++l) rank += layer_uses_policy(p, l, sliding(l)) ? 1 : 0;
  return rank;
}

// True when the policy would select every one of the S keys at head dimension d: the step is
// dense attention and runs the dense kernel — the output is then exactly dense (one kernel's
// rounding, not the gather kernels'), and no selection work is spent.
bool selects_every_key(const AttentionPolicy& p, int32_t S, int32_t d);

}  // namespace fathom
