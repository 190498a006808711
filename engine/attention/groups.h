#pragma once
// Finds the attention groups of a batch (engine/batch_plan.h): one-token dense (or auto) decode steps
// that share leading physical KV blocks, nested by how far they share.
#include <cstdint>
#include <vector>

#include "engine/batch_plan.h"

namespace fathom {

struct GroupRule {
  int32_t min_seqs = 4;      // a segment needs at least this many members ...
  int32_t min_prefix = 256;  // ... and this many tokens to pay (bench/results/bifurcated.md)
};

// Groups by the first physical block, then recursively: each level is the longest run of
// blocks all members share (only blocks strictly before every member's current position's
// block), split by the next block. A level that does not satisfy `rule` ends the nesting there
// (its members read that range as their own suffix).
std::vector<AttentionGroup> find_attention_groups(const BatchPlan& plan, int32_t block_size, const GroupRule& rule);

}  // namespace fathom
