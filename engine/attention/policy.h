#pragma once
// Decode attention policy of a request (DESIGN.md "Attention policies"): which kernel reads the
// KV cache for the one query of a decode step. Prefill is always dense.
//
// `kv_read_ratio` (0, 1] is the one knob every sparse policy understands: the fraction of the
// dense KV bytes a step may read. Each policy turns it into its own parameters at the current
// sequence length S (resolve_*); explicit parameters override what the ratio derives. At
// ratio 1 every policy attends every key, i.e. equals dense.
#include <cstdint>
#include <string>

#include "kernels/ref/hip.h"
#include "kernels/ref/sparq.h"
#include "kernels/ref/swa.h"

namespace fathom {

// kAuto is not a kernel: each step it resolves to one (resolve_auto).
enum class PolicyKind { kDense, kSparq, kHip, kSwa, kAuto };
inline constexpr int kPolicyKinds = 5;
const char* policy_name(PolicyKind k);                 // "dense", "sparq", "hip", "swa", "auto"
PolicyKind parse_policy_name(const std::string& name);  // throws fathom::Error naming the choices

struct AttentionPolicy {
  PolicyKind kind = PolicyKind::kDense;
  double kv_read_ratio = 0.125;
  // SparQ (−1: derived from the ratio at S, see ref::sparq_params_for_ratio).
  int32_t sparq_r = -1, sparq_k = -1, sparq_l = -1;
  bool sparq_reallocation = true;
  // Step 1 weighted by √ of the keys' spread per component (ref::sparq_attention's key_spread,
  // from the cache's running K moments); false: the paper's rule. At 1/8 it found 20/20 pass keys
  // on Gemma 3 at 4k and 8k where the paper's rule found 4/20 and 5/20; on fresh prompts it is right
  // on exactly dense's at 1k-8k (bench/results/sparq_key_spread.md).
  bool sparq_key_spread = true;
  // HiP (−1: derived from the ratio at S). The mask is re-estimated every `hip_refresh` steps;
  // the first `hip_dense_layers` layers stay dense (the paper's default 3). One mask per kv head
  // (ref::HipParams::per_kv_head) and a refresh every 4 steps instead of the paper's per query
  // head and 8: per kv head estimates G× fewer keys, which pays for refreshing twice as often, and
  // the mask 8 steps old is what lost the pass keys (SmolLM2 at 1k-4k, 1/8: 4-12 of 20 at R = 8,
  // 15-18 of 20 at R = 4 per kv head; one layer at 8k keys 127 µs against 185 µs per head at R = 8
  // and 166 µs dense; bench/results/sparse_quality_findings.md, "Third step").
  int32_t hip_mask_k = -1, hip_sink = -1, hip_window = -1;
  int32_t hip_block_size_k = 2, hip_refresh = 4, hip_dense_layers = 3;
  bool hip_per_kv_head = true;
  // SWA (ALISA) caching ratio (−1: the ratio itself). Its heavy hitters are chosen by the mass
  // max-pooled over `swa_pool` neighbouring positions (SnapKV's pooling, kernel 7: a multi-token
  // span such as a number is kept whole, and filler tokens next to nothing heavy are not; 1: the
  // raw mass, as the paper). Measured in bench/results/sparse_quality_findings.md.
  double swa_ratio = -1;
  int32_t swa_pool = 7;
  // Steps with fewer keys than this run densely (a sparse step does more work per key read, so
  // at short contexts it is slower than dense). kMeasuredBreakEven: the backend's measured
  // break-even for this policy (engine/backend/cpu/break_even.h); 0: sparse at every length.
  static constexpr int32_t kMeasuredBreakEven = -1;
  int32_t min_keys = kMeasuredBreakEven;

  std::string name() const { return policy_name(kind); }
  // Throws fathom::Error for a parameter out of range (the message names it).
  void validate() const;
};

// Parameters for one decode step at S = pos + 1 keys and head dimension d.
ref::SparqParams resolve_sparq(const AttentionPolicy& p, int32_t S, int32_t d);
// HiP at S keys: budget B = ratio·S tokens split as sink = min(16, B/16), window = min(256, B/4)
// and mask_k = the rest (a multiple of block_size_k, at least one block); with B ≥ S the mask
// covers everything (dense).
ref::HipParams resolve_hip(const AttentionPolicy& p, int32_t S);
// SWA at S keys: the caching ratio swa_ratio as given, else kv_read_ratio but keeping at least
// kSwaMinKept keys (1 at S <= kSwaMinKept: dense). Below that the local half of the kept set is
// too short to hold the question and a needle's digits at once (SmolLM2 at 1k keys, 1/8: 16/20
// pass keys against 20/20 at 1/4; bench/results/sparse_quality_findings.md), and the bytes saved
// are a few KiB per layer anyway.
inline constexpr int32_t kSwaMinKept = 256;
ref::SwaParams resolve_swa(const AttentionPolicy& p, int32_t S);

// What `auto` runs: SWA with p's ratio and SWA parameters, dense below SWA's measured break-even
// (or p.min_keys). SWA is the policy that kept dense's passkey answers best on both default
// models (at 1/8 everywhere but SmolLM2 8k, at 1/4 everywhere: bench/results/passkey_auto.md)
// and is also the fastest at every length measured (bench/results/sparse_quality_findings.md,
// bench/results/break_even.md); the rule lives here so that a better-measured choice changes one place.
AttentionPolicy resolve_auto(const AttentionPolicy& p);

// The policy a backend measures the break-even of on behalf of `p`: the same kind at the
// effective ratio rounded up to a power of two up to 1/8 (1/64 ... 1/8), above it to a multiple
// of 1/8 (1/4, 3/8, ... 1; a larger ratio reads more, so its break-even is the conservative
// one); for HiP also its mask scope (per kv head or per query head) and its refresh rounded down
// to a power of two no larger than the default's (1, 2, 4); every other parameter derived. A
// bounded set: clients cannot make the backend measure without end.
AttentionPolicy break_even_probe(const AttentionPolicy& p);
// Whether two probes (break_even_probe results) are the same measurement.
bool same_break_even_probe(const AttentionPolicy& a, const AttentionPolicy& b);

}  // namespace fathom
