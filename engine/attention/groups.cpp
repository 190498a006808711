#include "engine/attention/groups.h"

#include <algorithm>
#include <map>

#include "engine/attention/policy_registry.h"

namespace fathom {

namespace {

struct Finder {
  const BatchPlan& plan;
  int32_t bs;
  GroupRule rule;

  // Blocks of member i that may be shared: whole blocks before its current token's block.
  int32_t limit(int32_t i) const { return plan.seqs[i].pos0 / bs; }
  int32_t block(int32_t i, int32_t b) const { return (*plan.seqs[i].blocks)[b]; }

  // `members` share blocks [0, from) and are covered by segments up to `from`. Finds the run
  // they all share from there; a run that pays becomes a segment, one that does not is left to
  // the sub-groups (which then start their own segment at `from`). Appends to `out`.
  void grow(const std::vector<int32_t>& members, int32_t from, std::vector<SharedSpan>& out) const {
    int32_t cap = limit(members[0]);
    for (int32_t m : members) cap = std::min(cap, limit(m));
    int32_t end = from;
    while (end < cap && std::all_of(members.begin(), members.end(),
                                    [&](int32_t m) { return block(m, end) == block(members[0], end); }))
      ++end;
    const bool pays = static_cast<int32_t>(members.size()) >= rule.min_seqs && (end - from) * bs >= rule.min_prefix;
    if (pays) out.push_back(SharedSpan{from * bs, end * bs, members});
    std::map<int32_t, std::vector<int32_t>> next;  // members that go on, by their block at `end`
    for (int32_t m : members)
      if (end < limit(m)) next[block(m, end)].push_back(m);
    for (auto& [b, sub] : next)
      if (static_cast<int32_t>(sub.size()) >= rule.min_seqs && sub.size() < members.size())
        grow(sub, pays ? end : from, out);
  }
};

}  // namespace

std::vector<AttentionGroup> find_attention_groups(const BatchPlan& plan, int32_t block_size, const GroupRule& rule) {
  std::map<int32_t, std::vector<int32_t>> by_first;
  for (int32_t i = 0; i < static_cast<int32_t>(plan.seqs.size()); ++i) {
    const SeqStep& s = plan.seqs[i];
    // auto joins groups too: a group's output is exactly dense's and each of its n samples reads
    // 1/n of the shared prompt (SWA's 1/8 is fewer bytes only while n < 8).
    const bool groupable = s.policy == nullptr || policy_def(s.policy->kind).groupable;
    // A negative first entry is a dropped block (recomputed per sequence, never shared).
    if (s.tokens.size() == 1 && groupable && s.pos0 >= block_size && (*s.blocks)[0] >= 0)
      by_first[(*s.blocks)[0]].push_back(i);
  }
  const Finder f{plan, block_size, rule};
  std::vector<AttentionGroup> groups;
  for (auto& [b, members] : by_first) {
    if (static_cast<int32_t>(members.size()) < rule.min_seqs) continue;
    AttentionGroup g;
    f.grow(members, 0, g.segments);
    if (g.segments.empty()) continue;
    for (const SharedSpan& seg : g.segments)
      for (int32_t m : seg.members)
        if (std::find(g.members.begin(), g.members.end(), m) == g.members.end()) g.members.push_back(m);
    groups.push_back(std::move(g));
  }
  return groups;
}

}  // namespace fathom
