#include "engine/generate.h"

#include <chrono>
#include <memory>

#include "engine/backend/backend.h"
#include "engine/error.h"
#include "engine/kv/block_table.h"
#include "engine/model.h"

namespace fathom {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void check_prompt(const Model& model, const std::vector<int32_t>& prompt) {
  const int32_t ctx = model.config().context_length;
  if (prompt.empty()) throw Error("the prompt is empty");
  if (static_cast<int64_t>(prompt.size()) >= ctx)
    throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens; the context holds " +
                std::to_string(ctx) + " (at least one must remain for generation)");
  for (int32_t id : prompt)
    if (id < 0 || id >= model.vocab()) throw Error("token id " + std::to_string(id) + " is outside the vocabulary");
}

struct Running {
  size_t index;
  std::unique_ptr<BlockTable> blocks;
  std::vector<int32_t> tokens;  // prompt + generated
  Sampler sampler;
  int32_t limit;                // total tokens allowed (prompt + generated)
  bool done = false;
  SeqPolicyState policy_state;
};

}  // namespace

std::vector<GenerateResult> generate(Model& model, const std::vector<GenerateRequest>& requests, GenerateStats* stats,
                                     const TokenCallback& on_token) {
  GenerateStats local_stats;
  GenerateStats& st = stats ? *stats : local_stats;
  std::vector<GenerateResult> results(requests.size());
  std::vector<Running> running;
  const int32_t ctx = model.config().context_length;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerateRequest& r = requests[i];
    check_prompt(model, r.prompt);
    validate(r.sampling, model.vocab());
    r.attention.validate();
    const int64_t limit = std::min<int64_t>(ctx, static_cast<int64_t>(r.prompt.size()) + std::max(0, r.max_tokens));
    running.push_back(Running{i, std::make_unique<BlockTable>(model.kv_pool()), r.prompt,
                              Sampler(r.sampling, 0x5eed0000ull + i), static_cast<int32_t>(limit), false, {}});
  }
  // Blocks are taken as the sequences grow, so max_tokens is not reserved up front.
  auto reserve = [&](Running& r, size_t tokens) {
    if (!r.blocks->reserve(static_cast<int32_t>(tokens)))
      throw Error("the KV cache is too small for this batch (" + std::to_string(model.kv_pool().num_blocks()) +
                  " blocks of " + std::to_string(model.kv_pool().layout().block_size) + " tokens)");
  };

  std::vector<float> logits;
  bool prefill = true;
  for (;;) {
    BatchPlan plan;
    std::vector<Running*> in_plan;
    for (Running& r : running) {
      if (r.done) continue;
      if (static_cast<int32_t>(r.tokens.size()) >= r.limit) {
        r.done = true;
        results[r.index].finish_reason = "length";
        continue;
      }
      const size_t n_prompt = requests[r.index].prompt.size();
      const size_t first = prefill ? 0 : r.tokens.size() - 1;
      const std::span<const int32_t> toks(r.tokens.data() + first, prefill ? n_prompt : 1);
      reserve(r, first + toks.size());
      plan.seqs.push_back(SeqStep{toks, static_cast<int32_t>(first), &r.blocks->blocks(), LogitsWanted::kLast});
      if (!prefill) {
        plan.seqs.back().policy = &requests[r.index].attention;
        plan.seqs.back().policy_state = &r.policy_state;
      }
      in_plan.push_back(&r);
    }
    if (plan.seqs.empty()) break;
    const auto t0 = Clock::now();
    model.backend().forward(plan, logits);
    int64_t n_tokens = 0;
    for (const SeqStep& s : plan.seqs) n_tokens += static_cast<int64_t>(s.tokens.size());
    for (size_t k = 0; k < in_plan.size(); ++k) {
      Running& r = *in_plan[k];
      const GenerateRequest& req = requests[r.index];
      const std::vector<int32_t> generated(r.tokens.begin() + static_cast<std::ptrdiff_t>(req.prompt.size()),
                                           r.tokens.end());
      SampledToken tok = r.sampler.sample(&logits[k * static_cast<size_t>(model.vocab())], model.vocab(), req.prompt,
                                          generated);
      if (req.stop_at_end_of_generation && model.tokenizer().is_end_of_generation(tok.id)) {
        r.done = true;
        results[r.index].finish_reason = "stop";
        continue;
      }
      r.tokens.push_back(tok.id);
      results[r.index].tokens.push_back(tok.id);
      results[r.index].sampled.push_back(std::move(tok));
      if (on_token) on_token(r.index, results[r.index].tokens.back());
    }
    (prefill ? st.prefill_seconds : st.decode_seconds) += seconds_since(t0);
    (prefill ? st.prefill_tokens : st.decode_tokens) += n_tokens;
    prefill = false;
  }
  return results;
}

std::vector<float> prompt_logits(Model& model, const std::vector<int32_t>& prompt) {
  check_prompt(model, prompt);
  BlockTable blocks(model.kv_pool());
  if (!blocks.reserve(static_cast<int32_t>(prompt.size()))) throw Error("the KV cache is too small for this prompt");
  BatchPlan plan;
  plan.seqs.push_back(SeqStep{prompt, 0, &blocks.blocks(), LogitsWanted::kAll});
  std::vector<float> logits;
  model.backend().forward(plan, logits);
  return logits;
}

}  // namespace fathom
