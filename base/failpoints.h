#pragma once
// Fault injection for testing failure paths in a running process (the way trusted servers test
// them: FoundationDB's buggify, TiKV's fail-rs). Configured once from the environment:
//
//   FATHOM_FAILPOINTS=point:action[@N][,point:action[@N]...]
//
// `point` names a place in the code (see kFailpointNames), `action` is `throw` (the place throws
// fathom::Error "failpoint <point> fired"), and @N makes it fire on every N-th hit only (hits
// counted per point from process start; without @N every hit fires). Example:
// FATHOM_FAILPOINTS=forward:throw@7 makes every 7th forward step throw.
//
// With the variable unset the cost of a failpoint is one relaxed atomic load.
#include <cstdint>
#include <string>
#include <string_view>

namespace fathom::failpoints {

// The places that can fail (kept in one list so a misspelt name is a start-up error):
//   forward      every forward pass (backend-independent, before the layer schedule runs)
//   kv_alloc     every KV block allocation
//   kv_copy      every whole-block copy (copy-on-write, swap out, swap in)
//   detokenize   every token turned into text
inline constexpr std::string_view kFailpointNames[] = {"forward", "kv_alloc", "kv_copy", "detokenize"};

// Parses a specification (the grammar above) and replaces the active set; an empty string turns
// every failpoint off. Throws fathom::Error naming the bad entry. Not thread-safe against
// concurrent hits: call it at start-up (or in tests between runs).
void configure(std::string_view spec);

// Reads FATHOM_FAILPOINTS (once per process; later calls do nothing). Throws like configure().
void configure_from_environment();

// Counts a hit of `point` and throws fathom::Error when it fires. `point` must be one of
// kFailpointNames.
void hit(std::string_view point);

// The active specification, normalised ("" when none), for the start-up log.
std::string describe();

}  // namespace fathom::failpoints
