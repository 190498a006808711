#pragma once
// How one step's token budget (scheduler.max_batched_tokens) is split between prefill chunks.
//
// 1. Cost, not tokens: a chunk of c prompt tokens starting at position p costs about
//    c × (1 + (p + c/2) / E) token-equivalents, where E (attention_equivalent_positions) is the
//    context length at which one token's attention work equals its matmul work. So a step deep
//    into a long prompt takes about as long as a step at its start, and the budget means "the
//    time of max_batched_tokens tokens at position 0": one prefill chunk.
// 2. Fair: the cost budget is water-filled (smallest wants first), so a short prompt behind a long
//    one gets its whole prompt into the next step.
// 3. First tokens first: in a step where some sequence completes its prompt (its first token
//    comes out of this step), the chunks that do not complete are held to 1/kFirstTokenStepShare
//    of the budget, so that step, and with it the short request's time to first token, stays
//    short while a long prompt is prefilling. The long prompt loses a little throughput per
//    arriving request, never all of it.
#include <cstdint>
#include <optional>
#include <vector>

namespace fathom {

struct ModelConfig;

inline constexpr int64_t kFirstTokenStepShare = 8;

struct PrefillWant {
  int64_t position = 0;     // first prompt position of the chunk (tokens already computed)
  int64_t tokens = 0;       // prompt tokens still to compute (>= 1)
  bool awaiting_first_token = false;  // nothing generated yet: completing the prompt emits a token
};

// Attention work of a chunk of `tokens` starting at `position`, in earlier positions read:
// Σ over its tokens of (position + i) ≈ tokens · (position + tokens/2). What E converts to tokens.
inline double chunk_attention_positions(double position, double tokens) { return tokens * (position + tokens / 2); }

// Learns E from the steps the engine actually runs: step seconds ≈ o + a·T + b·A, with T the
// step's tokens and A = Σ chunk·(position + chunk/2) its attention positions, fitted by least
// squares with exponential forgetting (recent steps count most); E = a / b. Until the fit is
// well determined (enough steps with and without deep chunks), and whenever it leaves
// [prior/8, prior·8], E is the prior from the model's shapes.
class StepCostModel {
 public:
  explicit StepCostModel(double prior_positions) : prior_(prior_positions) {}
  void observe(double tokens, double attention_positions, double seconds);
  double equivalent_positions() const;
  // The fitted costs (seconds: o a step, a a token, b an attention position), once at least 16
  // steps determine them; nullopt before, or when the steps did not vary enough.
  struct Fit {
    double step_s, token_s, position_s;
  };
  std::optional<Fit> fit() const;

 private:
  static constexpr double kForget = 0.995;  // weight of a step 140 steps ago: 1/2
  double prior_;
  double m_[3][3] = {};  // Σ w·x·xᵀ over x = (1, T, A)
  double v_[3] = {};     // Σ w·x·seconds
  int64_t n_ = 0;
};

// E for a model from its shapes: per token, matmuls cost 2 × (weights of one layer) × layers
// FLOPs (the output projection runs for the last token only), attention 4 × q_dim × layers per
// earlier position (QKᵀ and PV). 0 when unknown (then cost = tokens).
double attention_equivalent_positions(const ModelConfig& config);

// Tokens each want gets this step: sum of costs <= budget (at least one token in all when
// `wants` is non-empty and budget >= 1, so prefill always progresses); each <= its want.
std::vector<int64_t> prefill_shares(const std::vector<PrefillWant>& wants, int64_t budget, double equivalent_positions);

}  // namespace fathom
