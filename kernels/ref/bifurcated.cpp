#include "kernels/ref/bifurcated.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace fathom::ref {

int64_t bifurcated_attention(const std::vector<SharedSegment>& segments, const PagedKvView* seq_kv,
                             const DecodeArgs* seq_args, int32_t n_seqs) {
  if (n_seqs == 0) return 0;
  const int32_t d = seq_kv[0].head_dim, n_kv = seq_kv[0].n_kv_heads;
  const int32_t n_heads = seq_args[0].n_heads, group = n_heads / n_kv;
  const LogitScale scale = seq_args[0].logit_scale();
  // states[i][h]: running merged state of sequence i, query head h.
  std::vector<std::vector<AttentionState>> states(n_seqs, std::vector<AttentionState>(n_heads, empty_state(d)));
  std::vector<int32_t> covered(n_seqs, 0);  // Σ segment lengths per sequence
  std::vector<int32_t> suffix_begin(n_seqs, 0);
  int64_t bytes = 0;
  std::vector<float> q;
  std::vector<AttentionState> part;
  for (const SharedSegment& seg : segments) {
    const int32_t rows = static_cast<int32_t>(seg.members.size()) * group;
    const std::vector<int32_t> pos = position_range(seg.begin, seg.end);
    for (int32_t i : seg.members) {
      if (seg.end > seq_args[i].pos + 1) throw std::invalid_argument("bifurcated: segment past the query");
      covered[i] += seg.end - seg.begin;
      suffix_begin[i] = std::max(suffix_begin[i], seg.end);
    }
    for (int32_t g = 0; g < n_kv; ++g) {
      q.resize(static_cast<size_t>(rows) * d);  // [members][group][d]: the b·G query rows
      for (size_t m = 0; m < seg.members.size(); ++m)
        std::copy_n(seq_args[seg.members[m]].q + static_cast<int64_t>(g) * group * d, group * d,
                    q.begin() + m * group * d);
      part.resize(rows);
      bytes += partial_attention(*seg.kv, g, q.data(), rows, scale, pos.data(), static_cast<int64_t>(pos.size()),
                                 part.data());
      for (size_t m = 0; m < seg.members.size(); ++m)
        for (int32_t j = 0; j < group; ++j) {
          AttentionState& st = states[seg.members[m]][g * group + j];
          st = merge_states(st, part[m * group + j]);
        }
    }
  }
  for (int32_t i = 0; i < n_seqs; ++i) {
    if (covered[i] != suffix_begin[i]) throw std::invalid_argument("bifurcated: segments do not tile a prefix");
    const DecodeArgs& a = seq_args[i];
    const std::vector<int32_t> pos = position_range(suffix_begin[i], a.pos + 1);
    part.resize(group);
    for (int32_t g = 0; g < n_kv; ++g) {
      bytes += partial_attention(seq_kv[i], g, a.q + static_cast<int64_t>(g) * group * d, group, scale, pos.data(),
                                 static_cast<int64_t>(pos.size()), part.data());
      for (int32_t j = 0; j < group; ++j) {
        const AttentionState st = merge_states(states[i][g * group + j], part[j]);
        // A sink joins the denominator: o · e^s / (e^s + e^sink), s the state's log-sum-exp.
        const double keep =
            a.sinks == nullptr ? 1.0 : 1.0 / (1.0 + std::exp(static_cast<double>(a.sinks[g * group + j]) - st.s));
        float* out = a.out + static_cast<int64_t>(g * group + j) * d;
        for (int32_t c = 0; c < d; ++c) out[c] = static_cast<float>(st.o[c] * keep);
      }
    }
  }
  return bytes;
}

}  // namespace fathom::ref
