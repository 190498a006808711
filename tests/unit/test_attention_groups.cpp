// find_attention_groups: which decode steps share leading physical blocks, nested, and when the
// cost rule (min sequences, min shared tokens) lets a level become a segment.
#include <gtest/gtest.h>

#include <vector>

#include "engine/attention/groups.h"

namespace fathom {
namespace {

constexpr int32_t kBs = 4;

struct Plan {
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> token{1};
  BatchPlan plan;
  AttentionPolicy sparq{policy_kind("sparq")}, automatic{policy_kind("auto")};
  // One decode step per table at position `pos` (its block is the last table entry).
  void add(std::vector<int32_t> table, int32_t pos) { tables.push_back(std::move(table)), positions.push_back(pos); }
  std::vector<int32_t> positions;
  BatchPlan& build() {
    plan.seqs.clear();
    for (size_t i = 0; i < tables.size(); ++i)
      plan.seqs.push_back(SeqStep{token, positions[i], &tables[i], LogitsWanted::kLast});
    return plan;
  }
};

TEST(AttentionGroups, ForksShareTheirPromptBlocks) {
  Plan p;
  for (int i = 0; i < 4; ++i) p.add({7, 8, 9, 20 + i}, 13);  // 3 shared blocks, own 4th block
  p.add({1, 2, 3, 4}, 13);                                  // unrelated
  const auto groups = find_attention_groups(p.build(), kBs, GroupRule{2, 8});
  ASSERT_EQ(groups.size(), 1u);
  ASSERT_EQ(groups[0].segments.size(), 1u);
  EXPECT_EQ(groups[0].segments[0].begin, 0);
  EXPECT_EQ(groups[0].segments[0].end, 12);
  EXPECT_EQ(groups[0].members, (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(AttentionGroups, NestedPrefixesMakeNestedSegments) {
  Plan p;
  p.add({1, 2, 3, 10}, 14);      // system prompt [1, 2], document A [3]
  p.add({1, 2, 3, 11}, 14);
  p.add({1, 2, 4, 5, 12}, 17);   // document B [4, 5]
  p.add({1, 2, 4, 5, 13}, 17);
  const auto groups = find_attention_groups(p.build(), kBs, GroupRule{2, 4});
  ASSERT_EQ(groups.size(), 1u);
  const auto& s = groups[0].segments;
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].begin, 0);
  EXPECT_EQ(s[0].end, 8);
  EXPECT_EQ(s[0].members.size(), 4u);
  EXPECT_EQ(s[1].begin, 8);
  EXPECT_EQ(s[1].end, 12);
  EXPECT_EQ(s[1].members, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(s[2].begin, 8);
  EXPECT_EQ(s[2].end, 16);
  EXPECT_EQ(s[2].members, (std::vector<int32_t>{2, 3}));
}

TEST(AttentionGroups, ALevelThatDoesNotPayIsFoldedIntoTheDeeperOne) {
  Plan p;
  p.add({1, 2, 3, 10}, 14);  // only block 1 shared by all four: 4 tokens < min_prefix 8
  p.add({1, 2, 3, 11}, 14);
  p.add({1, 4, 5, 12}, 14);
  p.add({1, 4, 5, 13}, 14);
  const auto groups = find_attention_groups(p.build(), kBs, GroupRule{2, 8});
  ASSERT_EQ(groups.size(), 1u);
  const auto& s = groups[0].segments;
  ASSERT_EQ(s.size(), 2u);  // each pair shares [0, 12) from position 0
  EXPECT_EQ(s[0].begin, 0);
  EXPECT_EQ(s[0].end, 12);
  EXPECT_EQ(s[1].begin, 0);
  EXPECT_EQ(s[1].end, 12);
}

TEST(AttentionGroups, TheCurrentBlockIsNeverShared) {
  Plan p;
  p.add({1, 2}, 5);  // position 5 lives in block 2 (index 1): only block 1 may be shared
  p.add({1, 2}, 6);
  const auto groups = find_attention_groups(p.build(), kBs, GroupRule{2, 4});
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].segments[0].end, 4);
}

TEST(AttentionGroups, RuleAndPoliciesExcludeSequences) {
  Plan p;
  for (int i = 0; i < 3; ++i) p.add({7, 8, 9, 20 + i}, 13);
  EXPECT_TRUE(find_attention_groups(p.build(), kBs, GroupRule{4, 8}).empty()) << "3 < min_seqs";
  EXPECT_TRUE(find_attention_groups(p.build(), kBs, GroupRule{2, 16}).empty()) << "12 < min_prefix";
  BatchPlan& plan = p.build();
  plan.seqs[0].policy = &p.sparq;  // a sparse-policy step is not grouped
  const auto groups = find_attention_groups(plan, kBs, GroupRule{2, 8});
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].members, (std::vector<int32_t>{1, 2}));
}

TEST(AttentionGroups, AutoStepsAreGrouped) {
  Plan p;
  for (int i = 0; i < 3; ++i) p.add({7, 8, 9, 20 + i}, 13);
  BatchPlan& plan = p.build();
  for (SeqStep& s : plan.seqs) s.policy = &p.automatic;
  const auto groups = find_attention_groups(plan, kBs, GroupRule{2, 8});
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].members, (std::vector<int32_t>{0, 1, 2}));
}

}  // namespace
}  // namespace fathom
