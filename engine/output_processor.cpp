#include "engine/output_processor.h"

#include <algorithm>
#include <limits>

#include "base/error.h"
#include "engine/backend/backend.h"
#include "engine/kv_placement.h"
#include "engine/model/model.h"
#include "engine/engine_metrics.h"

namespace fathom {
namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::unique_ptr<TextSpanCounter> thinking_text(const ThinkingSpan& span) {
  if (span.open_text.empty()) return nullptr;
  return std::make_unique<TextSpanCounter>(span.open_text, span.close_text);
}

// Its first sample also samples the request's other choices.
bool forks_now(const Sequence& s) {
  const RequestState& r = *s.request;
  return s.choice == 0 && !r.forked && r.request.n > 1 && s.generated() == 0;
}

}  // namespace

OutputProcessor::OutputProcessor(const Model& model, Backend& backend, KvPlacement& kv, EngineMetrics& metrics)
    : model_(model), backend_(backend), kv_(kv), metrics_(metrics) {}

void OutputProcessor::start(RequestState& r) {
  auto seq = std::make_unique<Sequence>();
  seq->request = &r;
  seq->choice = 0;
  seq->tokens = r.request.prompt;
  seq->sampler = std::make_unique<Sampler>(r.request.sampling, seed_rng_());
  seq->text = std::make_unique<TextStream>(model_.tokenizer(), r.request.stop.strings, r.request.shown_tokens);
  if (r.constraint) seq->matcher = std::make_unique<ConstraintMatcher>(r.constraint, r.request.thinking);
  seq->thinking_text = thinking_text(r.request.thinking);
  if (r.request.prompt_logprobs >= 0)  // the first prompt token has nothing before it to score it
    r.prompt_logprobs.push_back(SampledToken{r.request.prompt[0], std::numeric_limits<float>::quiet_NaN(), {}});
  r.unfinished = r.request.n;
  r.usage.prompt_tokens = static_cast<int32_t>(r.request.prompt.size());
  r.seqs.push_back(std::move(seq));
}

OutputProcessor::MaskPrefetch OutputProcessor::prefetch_masks(const BatchPlan& plan,
                                                              const std::vector<Sequence*>& planned) {
  std::vector<ConstraintMatcher*> to_mask;
  for (size_t i = 0; i < planned.size(); ++i)
    if (planned[i]->matcher && plan.seqs[i].logits == LogitsWanted::kLast) to_mask.push_back(planned[i]->matcher.get());
  if (to_mask.empty() || backend_.forward_occupies_host()) return {};
  return MaskPrefetch(std::async(std::launch::async, [to_mask = std::move(to_mask), vocab = model_.vocab()] {
    for (ConstraintMatcher* m : to_mask) {
      try {
        m->prepare_mask(vocab);
      } catch (...) {  // left unprepared: draw() computes it again inside the request's guard
      }
    }
  }));
}

std::vector<OutputProcessor::Draw> OutputProcessor::draw(const std::vector<Sequence*>& seqs,
                                                         const std::vector<int64_t>& rows, std::vector<float>& logits) {
  const int32_t vocab = model_.vocab();
  std::vector<Draw> draws(seqs.size());
  backend_.host_parallel_for(static_cast<int64_t>(seqs.size()), [&](int64_t i) {
    if (rows[i] >= 0) draws[i] = draw_one(*seqs[i], logits.data() + rows[i] * vocab);
  });
  return draws;
}

OutputProcessor::Draw OutputProcessor::draw_one(Sequence& s, float* row) {
  Draw d;
  if (s.state == SeqState::kFinished || forks_now(s)) return d;
  try {
    const int32_t vocab = model_.vocab();
    if (s.matcher) s.matcher->mask_logits(row, vocab);
    const std::vector<int32_t>& prompt = s.request->request.prompt;
    const std::vector<int32_t> generated(s.tokens.begin() + static_cast<std::ptrdiff_t>(prompt.size()), s.tokens.end());
    d.token = s.sampler->sample(row, vocab, prompt, generated);
    if (s.matcher) d.constraint_done = s.matcher->accept(d.token.id) && s.matcher->complete();
    d.drawn = true;
  } catch (const std::exception& e) {
    d.error = e.what();
  }
  return d;
}

void OutputProcessor::hand_over(Sequence& s, const Draw& d, float* row) {
  if (!d.error.empty()) throw Error(d.error);
  if (d.drawn) return accept_token(s, d.token, d.constraint_done);
  // The first sample of n > 1 choices: they fork from the masked row (a fork's choices start from
  // the same constraint state).
  RequestState& r = *s.request;
  const int32_t vocab = model_.vocab();
  if (s.matcher) s.matcher->mask_logits(row, vocab);
  fork_choices(r, row);
  accept_token(s, s.sampler->sample(row, vocab, r.request.prompt, {}));
}

void OutputProcessor::score_prompt(Sequence& s, int64_t pos0, const float* logits, int64_t rows) {
  // Row j holds the logits at position pos0 + j, which predict prompt token pos0 + j + 1.
  RequestState& r = *s.request;
  const std::vector<int32_t>& prompt = r.request.prompt;
  const int64_t begin = static_cast<int64_t>(r.prompt_logprobs.size()) - 1;  // the next position to score
  const int64_t end = std::min<int64_t>(pos0 + rows, static_cast<int64_t>(prompt.size()) - 1);
  if (begin < pos0 || begin >= end) return;  // not in these rows (or scored already)
  const int32_t vocab = model_.vocab();
  std::vector<SampledToken> scored(static_cast<size_t>(end - begin));
  guarded(r, [&] {
    backend_.host_parallel_for(end - begin, [&](int64_t k) {
      thread_local std::vector<float> scratch;
      const int64_t p = begin + k;
      scored[k] = score_token(logits + (p - pos0) * vocab, vocab, prompt[p + 1], r.request.prompt_logprobs, scratch);
    });
    r.prompt_logprobs.insert(r.prompt_logprobs.end(), scored.begin(), scored.end());
  });
}

void OutputProcessor::pool(Sequence& s, int64_t pos0, const float* hidden, int64_t rows) {
  RequestState& r = *s.request;
  const int32_t dim = model_.config().dim;
  const int64_t last = static_cast<int64_t>(r.request.prompt.size()) - 1;
  r.pooled.resize(dim, 0.0);
  for (int64_t j = 0; j < rows; ++j) {
    const float* row = hidden + j * dim;
    const int64_t p = pos0 + j;
    const Pooling how = r.request.embedding;
    if (how == Pooling::kMean) {
      for (int32_t d = 0; d < dim; ++d) r.pooled[d] += row[d];
    } else if ((how == Pooling::kCls && p == 0) || (how == Pooling::kLast && p == last)) {
      std::copy_n(row, dim, r.pooled.begin());
    }
  }
}

void OutputProcessor::attach_prompt_logprobs(Sequence& s, StreamEvent& ev) {
  const RequestState& r = *s.request;
  if (r.request.prompt_logprobs < 0 || s.prompt_logprobs_sent || r.wants_prompt_logprobs()) return;
  ev.prompt_logprobs = r.prompt_logprobs;
  s.prompt_logprobs_sent = true;
}

void OutputProcessor::fork_choices(RequestState& r, const float* logits) {
  const Sequence& parent = *r.seqs[0];
  const SamplingParams& p = r.request.sampling;
  r.forked = true;
  for (int32_t c = 1; c < r.request.n; ++c) {
    auto child = std::make_unique<Sequence>();
    child->request = &r;
    child->choice = c;
    child->tokens = parent.tokens;
    child->policy_state = parent.policy_state;
    SamplingParams cp = p;
    if (p.seed) cp.seed = *p.seed + static_cast<uint64_t>(c);  // choices differ, yet reproducibly
    child->sampler = std::make_unique<Sampler>(cp, seed_rng_());
    child->text = std::make_unique<TextStream>(model_.tokenizer(), r.request.stop.strings, r.request.shown_tokens);
    if (r.constraint) child->matcher = std::make_unique<ConstraintMatcher>(r.constraint, r.request.thinking);
    child->thinking_text = thinking_text(r.request.thinking);
    kv_.fork(parent, *child);
    child->state = child->n_computed > 0 ? SeqState::kRunning : SeqState::kWaiting;
    Sequence& ref = *child;
    r.seqs.push_back(std::move(child));
    if (ref.state == SeqState::kRunning) accept_token(ref, ref.sampler->sample(logits, model_.vocab(), r.request.prompt, {}));
  }
}

void OutputProcessor::count_reasoning(Sequence& s, int32_t token, std::string_view text) {
  RequestState& r = *s.request;
  if (s.thinking_text) r.usage.reasoning_tokens += s.thinking_text->push(text);
  const ThinkingSpan& span = r.request.thinking;
  if (span.end < 0) return;
  if (s.generated() == 1 && (span.open || token == span.start)) s.thinking = true;  // its first token
  if (!s.thinking) return;
  ++r.usage.reasoning_tokens;
  if (token == span.end) s.thinking = false;
}

void OutputProcessor::accept_token(Sequence& s, const SampledToken& tok, std::optional<bool> constraint_done) {
  RequestState& r = *s.request;
  const auto now = Clock::now();
  if (!r.first_token_seen) {
    r.first_token_seen = true;
    r.first_token = now;
    metrics_.ttft.observe(seconds_between(r.arrival, now));
    metrics_.prefill_time.observe(seconds_between(r.admitted, now));
  } else if (s.generated() > 0) {
    metrics_.itl.observe(seconds_between(s.last_token_time, now));
  }
  s.last_token_time = now;
  const StopConditions& stop = r.request.stop;
  // A constrained output that its grammar has completed ends here, ignore_eos or not (the mask
  // allowed only a stop token).
  if (!constraint_done) constraint_done = s.matcher && s.matcher->accept(tok.id) && s.matcher->complete();
  const bool stop_token = *constraint_done || (!stop.ignore_eos && model_.tokenizer().is_end_of_generation(tok.id)) ||
                          std::find(stop.token_ids.begin(), stop.token_ids.end(), tok.id) != stop.token_ids.end();
  if (stop_token) {
    finish(s, FinishReason::kStop, s.text->finish());  // held-back text was not a stop string
    return;
  }
  s.tokens.push_back(tok.id);
  ++r.usage.completion_tokens;
  metrics_.generation_tokens.inc();
  StreamEvent ev;
  ev.choice = s.choice;
  ev.token_ids.push_back(tok.id);
  TextStream::Piece piece = s.text->push(tok.id);
  count_reasoning(s, tok.id, piece.added);
  ev.text = std::move(piece.text);
  if (r.request.sampling.logprobs >= 0) ev.logprobs.push_back(tok);
  attach_prompt_logprobs(s, ev);
  if (piece.stopped) {
    ev.finish = FinishReason::kStop;
  } else if (s.generated() >= r.request.max_tokens ||
             static_cast<int32_t>(s.tokens.size()) >= model_.config().context_length) {
    ev.text += s.text->finish();
    ev.finish = FinishReason::kLength;
  }
  if (ev.finish == FinishReason::kNone) {
    r.handle->push(std::move(ev));
    return;
  }
  const FinishReason reason = ev.finish;
  ev.finish = FinishReason::kNone;  // finish() sends the final event with the reason
  r.handle->push(std::move(ev));
  finish(s, reason);
}

void OutputProcessor::finish(Sequence& s, FinishReason reason, std::string tail, const std::string& error) {
  RequestState& r = *s.request;
  if (s.state == SeqState::kFinished) return;
  s.drop_drafts();  // a sparse drafting round's, not the output's
  if (reason != FinishReason::kError) kv_.register_full_blocks(s);  // a failed step's blocks are not trusted
  kv_.release_blocks(s);
  s.state = SeqState::kFinished;
  std::vector<StreamEvent> events(1);
  events[0].choice = s.choice;
  events[0].text = std::move(tail);
  events[0].finish = reason;
  events[0].error = error;
  attach_prompt_logprobs(s, events[0]);
  if (r.embeds() && reason == FinishReason::kStop) {
    const double scale = r.request.embedding == Pooling::kMean ? 1.0 / static_cast<double>(r.request.prompt.size()) : 1.0;
    for (double v : r.pooled) events[0].embedding.push_back(static_cast<float>(v * scale));
  }
  --r.unfinished;
  if (!r.forked && s.choice == 0) {
    // n > 1 and the request ended before its first sample: the other choices never started.
    for (int32_t c = 1; c < r.request.n; ++c) {
      StreamEvent other;
      other.choice = c;
      other.finish = reason;
      other.error = error;
      events.push_back(std::move(other));
    }
    r.unfinished = 0;
  }
  if (r.unfinished == 0) {  // usage is final before the stream's last event
    r.handle->set_usage(r.usage);
    metrics_.finished(reason).inc();
    const auto now = Clock::now();
    metrics_.e2e.observe(seconds_between(r.arrival, now));
    if (r.first_token_seen) metrics_.decode_time.observe(seconds_between(r.first_token, now));
  }
  for (StreamEvent& ev : events) r.handle->push(std::move(ev));
}

void OutputProcessor::fail_request(RequestState& r, const std::string& message) {
  for (size_t i = 0; i < r.seqs.size(); ++i)  // finish() adds no sequences: the index is stable
    if (r.seqs[i]->state != SeqState::kFinished && r.unfinished > 0) finish(*r.seqs[i], FinishReason::kError, {}, message);
}

}  // namespace fathom
