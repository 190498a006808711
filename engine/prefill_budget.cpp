#include "engine/prefill_budget.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/model/model_config.h"

namespace fathom {
namespace {

// Water-filling: each want gets min(want, an equal share of what is left), smallest wants first,
// so what a small want leaves goes to the others; shares sum to at most `budget`.
std::vector<double> water_fill(const std::vector<double>& wants, double budget) {
  std::vector<size_t> order(wants.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return wants[a] < wants[b]; });
  std::vector<double> shares(wants.size(), 0.0);
  for (size_t k = 0; k < order.size(); ++k) {
    const double equal = budget / static_cast<double>(order.size() - k);
    shares[order[k]] = std::min(wants[order[k]], equal);
    budget -= shares[order[k]];
  }
  return shares;
}

}  // namespace

double attention_equivalent_positions(const ModelConfig& c) {
  const double per_layer_weights = 2.0 * c.dim * c.q_dim() + 2.0 * c.dim * c.kv_dim() + 3.0 * c.dim * c.ffn_dim;
  const double matmul = 2.0 * per_layer_weights;
  const double attention_per_position = 4.0 * c.q_dim();
  return attention_per_position > 0 ? matmul / attention_per_position : 0.0;
}

void StepCostModel::observe(double tokens, double attention_positions, double seconds) {
  const double x[3] = {1.0, tokens, attention_positions};
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) m_[i][j] = kForget * m_[i][j] + x[i] * x[j];
    v_[i] = kForget * v_[i] + x[i] * seconds;
  }
  ++n_;
}

std::optional<StepCostModel::Fit> StepCostModel::fit() const {
  if (n_ < 16) return std::nullopt;
  // Solve m·(o, a, b) = v by Gaussian elimination with partial pivoting, on columns scaled to
  // unit diagonal (T and A differ by orders of magnitude).
  double scale[3];
  for (int i = 0; i < 3; ++i) scale[i] = m_[i][i] > 0 ? 1.0 / std::sqrt(m_[i][i]) : 0.0;
  if (scale[2] == 0.0 || scale[1] == 0.0) return std::nullopt;
  double a[3][4];
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < 3; ++j) a[i][j] = m_[i][j] * scale[i] * scale[j];
    a[i][3] = v_[i] * scale[i];
  }
  for (int c = 0; c < 3; ++c) {
    int pivot = c;
    for (int r = c + 1; r < 3; ++r)
      if (std::fabs(a[r][c]) > std::fabs(a[pivot][c])) pivot = r;
    if (std::fabs(a[pivot][c]) < 1e-9) return std::nullopt;  // degenerate: all steps alike
    for (int k = 0; k < 4; ++k) std::swap(a[c][k], a[pivot][k]);
    for (int r = 0; r < 3; ++r) {
      if (r == c) continue;
      const double f = a[r][c] / a[c][c];
      for (int k = c; k < 4; ++k) a[r][k] -= f * a[c][k];
    }
  }
  return Fit{a[0][3] / a[0][0] * scale[0], a[1][3] / a[1][1] * scale[1], a[2][3] / a[2][2] * scale[2]};
}

double StepCostModel::equivalent_positions() const {
  const std::optional<Fit> f = fit();
  if (!f || !(f->token_s > 0) || !(f->position_s > 0)) return prior_;
  const double e = f->token_s / f->position_s;
  return e >= prior_ / 8 && e <= prior_ * 8 ? e : prior_;
}

std::vector<int64_t> prefill_shares(const std::vector<PrefillWant>& wants, int64_t budget, double equivalent_positions) {
  const size_t n = wants.size();
  std::vector<int64_t> tokens(n, 0);
  if (n == 0 || budget <= 0) return tokens;
  // Cost per token of each chunk, averaged over the largest chunk it could get.
  std::vector<double> per_token(n), cost_wants(n);
  for (size_t i = 0; i < n; ++i) {
    const double c = static_cast<double>(std::min(wants[i].tokens, budget));
    per_token[i] = equivalent_positions > 0
                       ? 1.0 + chunk_attention_positions(static_cast<double>(wants[i].position), c) / c / equivalent_positions
                       : 1.0;
    cost_wants[i] = static_cast<double>(wants[i].tokens) * per_token[i];
  }
  const std::vector<double> shares = water_fill(cost_wants, static_cast<double>(budget));
  bool first_token_step = false;
  for (size_t i = 0; i < n; ++i) {
    tokens[i] = std::min(wants[i].tokens, static_cast<int64_t>(std::floor(shares[i] / per_token[i] + 1e-9)));
    first_token_step = first_token_step || (wants[i].awaiting_first_token && tokens[i] == wants[i].tokens);
  }
  if (first_token_step) {
    const double cap = static_cast<double>(budget) / kFirstTokenStepShare;
    for (size_t i = 0; i < n; ++i)
      if (tokens[i] < wants[i].tokens)
        tokens[i] = std::min(tokens[i], std::max<int64_t>(1, static_cast<int64_t>(cap / per_token[i])));
  }
  if (std::accumulate(tokens.begin(), tokens.end(), int64_t{0}) == 0) tokens[0] = 1;  // always progress
  return tokens;
}

}  // namespace fathom
