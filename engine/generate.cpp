#include "engine/generate.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "base/error.h"
#include "engine/backend/backend.h"
#include "engine/engine.h"
#include "engine/kv/block_allocator.h"
#include "engine/kv/block_table.h"
#include "engine/model/model.h"

namespace fathom {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

void check_prompt(const Model& model, const std::vector<int32_t>& prompt) {
  const int32_t ctx = model.config().context_length;
  if (prompt.empty()) throw Error("the prompt is empty");
  if (static_cast<int64_t>(prompt.size()) >= ctx)
    throw Error("the prompt has " + std::to_string(prompt.size()) + " tokens; the context holds " +
                std::to_string(ctx) + " (at least one must remain for generation)");
}

}  // namespace

std::vector<GenerateResult> generate(const Model& model, Backend& backend, const std::vector<GenerateRequest>& requests,
                                     GenerateStats* stats, const TokenCallback& on_token, const SchedulerConfig& base,
                                     DraftModel* draft) {
  GenerateStats local_stats;
  GenerateStats& st = stats ? *stats : local_stats;
  std::vector<GenerateResult> results(requests.size());
  // Every prompt in one prefill step, as a batch (the scheduler's token budget allows it).
  SchedulerConfig config = base;
  int64_t prompt_tokens = 0;
  for (const GenerateRequest& r : requests) {
    check_prompt(model, r.prompt);
    prompt_tokens += static_cast<int64_t>(r.prompt.size());
  }
  config.max_num_seqs = std::max<int32_t>(config.max_num_seqs, static_cast<int32_t>(requests.size()));
  config.max_batched_tokens = static_cast<int32_t>(std::max<int64_t>(config.max_batched_tokens, prompt_tokens));
  config.max_queue = static_cast<int32_t>(requests.size()) + 1;
  MetricsRegistry metrics;
  Engine engine(model, backend, config, metrics, draft);

  const auto t0 = Clock::now();
  std::vector<std::shared_ptr<RequestHandle>> handles(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerateRequest& g = requests[i];
    const int32_t room = model.config().context_length - static_cast<int32_t>(g.prompt.size());
    if (g.max_tokens <= 0) {
      results[i].finish_reason = "length";
      continue;
    }
    Request r;
    r.prompt = g.prompt;
    r.sampling = g.sampling;
    r.max_tokens = std::min(g.max_tokens, room);
    r.stop.ignore_eos = !g.stop_at_end_of_generation;
    r.attention = g.attention;
    r.speculative = g.speculative;
    handles[i] = engine.submit(std::move(r));
  }

  // Events in arrival order per request; several requests are polled in turn.
  Clock::time_point last_first_token = t0;
  std::string error;
  for (bool pending = true; pending;) {
    pending = false;
    for (size_t i = 0; i < handles.size(); ++i) {
      if (!handles[i] || handles[i]->done()) continue;
      pending = true;
      StreamEvent ev;
      const auto wait = std::chrono::milliseconds(handles.size() == 1 ? 1000 : 1);
      while (handles[i]->next(ev, wait)) {
        GenerateResult& res = results[i];
        for (size_t k = 0; k < ev.token_ids.size(); ++k) {
          if (res.tokens.empty()) last_first_token = std::max(last_first_token, Clock::now());
          res.tokens.push_back(ev.token_ids[k]);
          res.sampled.push_back(k < ev.logprobs.size() ? ev.logprobs[k] : SampledToken{ev.token_ids[k], 0.0f, {}});
          if (on_token) on_token(i, ev.token_ids[k]);
        }
        if (ev.finish == FinishReason::kError && error.empty()) error = ev.error;
        if (ev.finish != FinishReason::kNone) res.finish_reason = finish_reason_name(ev.finish);
        if (handles.size() > 1) break;  // the next request's turn
      }
    }
  }
  if (!error.empty()) throw Error("generation failed: " + error);
  const auto t1 = Clock::now();
  st.prefill_tokens += prompt_tokens;
  st.prefill_seconds += seconds_between(t0, last_first_token);
  int64_t decoded = 0;
  for (const GenerateResult& r : results) decoded += std::max<int64_t>(0, static_cast<int64_t>(r.tokens.size()) - 1);
  st.decode_tokens += decoded;
  st.decode_seconds += seconds_between(last_first_token, t1);
  return results;
}

std::vector<float> prompt_logits(const Model& model, Backend& backend, const std::vector<int32_t>& prompt) {
  check_prompt(model, prompt);
  for (int32_t id : prompt)
    if (id < 0 || id >= model.vocab()) throw Error("token id " + std::to_string(id) + " is outside the vocabulary");
  BlockAllocator allocator(backend.kv_blocks(), backend.kv_layout().block_size);
  BlockTable blocks(allocator);
  if (!blocks.reserve(static_cast<int32_t>(prompt.size()))) throw Error("the KV cache is too small for this prompt");
  BatchPlan plan;
  plan.seqs.push_back(SeqStep{prompt, 0, &blocks.blocks(), LogitsWanted::kAll});
  std::vector<float> logits;
  backend.forward(plan, logits);
  return logits;
}

}  // namespace fathom
