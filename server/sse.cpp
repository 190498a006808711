#include "server/sse.h"

#include <spdlog/spdlog.h>

#include "engine/engine.h"
#include "engine/model/tokenizer.h"
#include "server/harmony.h"
#include "server/reasoning.h"
#include "server/responses_api.h"
#include "server/tool_stream.h"

namespace fathom {

namespace {

// How long to wait for an event before checking on the client again.
constexpr std::chrono::milliseconds kPollInterval(100);
// With several prompts, how long to wait on one handle before looking at the others again.
constexpr std::chrono::milliseconds kMultiPromptWait(5);
// A queued or slow stream sends an SSE comment after this much silence: a socket whose peer
// has gone still polls writable, so only a write notices the client left (and cancels).
constexpr std::chrono::seconds kKeepAliveInterval(2);
// What a client whose request a drain cut short reads (HTTP 503 "draining", or an SSE error event).
constexpr const char* kCutByDrain = "the server is shutting down: the request was cancelled before it finished";
constexpr const char* kSseKeepAlive = ": keep-alive\n\n";

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

Generation::Generation(Engine& engine, const Tokenizer& tokenizer, ApiRequest req, ResponseMeta meta)
    : tokenizer_(tokenizer), req_(std::move(req)), meta_(std::move(meta)), start_(std::chrono::steady_clock::now()),
      finish_(static_cast<size_t>(req_.choices()), FinishReason::kNone) {
  req_.engine.id = meta_.id;
  if (req_.prompts.size() <= 1) {
    handles_.push_back(engine.submit(req_.engine));
    return;
  }
  // One engine request per prompt; if one is refused (queue full), the ones already in go too.
  try {
    for (size_t p = 0; p < req_.prompts.size(); ++p) {
      Request r = req_.engine;
      r.prompt = req_.prompts[p];
      r.id = meta_.id + "-" + std::to_string(p);
      handles_.push_back(engine.submit(r));
    }
  } catch (...) {
    for (auto& h : handles_) h->cancel();
    throw;
  }
}

Generation::~Generation() {
  if (!all_done()) {
    cancel_all();
    log_finished("cancelled");
  }
}

bool Generation::all_done() const {
  for (const auto& h : handles_)
    if (!h->done()) return false;
  return true;
}

void Generation::cancel_all() {
  for (auto& h : handles_) h->cancel();
}

RequestUsage Generation::usage() const {
  RequestUsage total;
  for (const auto& h : handles_) {
    const RequestUsage u = h->usage();
    total.prompt_tokens += u.prompt_tokens;
    total.cached_prompt_tokens += u.cached_prompt_tokens;
    total.completion_tokens += u.completion_tokens;
    total.reasoning_tokens += u.reasoning_tokens;
  }
  return total;
}

bool Generation::poll(StreamEvent& event) {
  if (handles_.size() == 1) return handles_[0]->next(event, kPollInterval);
  // Several prompts: take what any handle has (round robin), else wait a little on one that is
  // still running; prompt p's choice c becomes response choice p·n + c.
  const auto deadline = std::chrono::steady_clock::now() + kPollInterval;
  for (;;) {
    for (size_t k = 0; k < handles_.size(); ++k) {
      const size_t p = (next_handle_ + k) % handles_.size();
      if (handles_[p]->next(event, std::chrono::milliseconds(0))) {
        next_handle_ = p + 1;
        event.choice += static_cast<int32_t>(p) * req_.engine.n;
        return true;
      }
    }
    if (all_done() || std::chrono::steady_clock::now() >= deadline) return false;
    // Sleep until the first unfinished handle has an event, or a little while (the others are
    // looked at again then).
    for (auto& h : handles_)
      if (!h->done()) {
        h->wait(kMultiPromptWait);
        break;
      }
  }
}

bool Generation::next(StreamEvent& event, const std::function<bool()>& client_alive, bool& client_gone,
                      const std::function<bool()>& on_idle) {
  // The client is looked at every kPollInterval whether or not events keep coming: a request
  // generating steadily (or a stream holding its text back) must still notice its client left.
  auto check_client = [&] {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_client_check_ < kPollInterval) return true;
    last_client_check_ = now;
    if (client_alive()) return true;
    client_gone = true;
    return false;
  };
  while (!poll(event)) {
    if (all_done()) return false;
    if (!check_client()) return false;
    if (on_idle && !on_idle()) {
      client_gone = true;
      return false;
    }
  }
  if (!check_client()) return false;
  note_event(event);
  return true;
}

void Generation::note_event(const StreamEvent& event) {
  if (ttft_ms_ < 0 && !event.token_ids.empty()) ttft_ms_ = ms_since(start_);
  if (event.finish != FinishReason::kNone && event.choice >= 0 && event.choice < static_cast<int32_t>(finish_.size()))
    finish_[event.choice] = event.finish;
}

void Generation::log_finished(const char* outcome) {
  if (logged_) return;
  logged_ = true;
  const RequestUsage usage = this->usage();
  std::string reasons;
  for (FinishReason r : finish_) {
    if (!reasons.empty()) reasons += ',';
    reasons += r == FinishReason::kNone ? "none" : finish_reason_name(r);
  }
  spdlog::info("{} {}{} prompt_tokens={} cached_tokens={} completion_tokens={} ttft_ms={:.1f} total_ms={:.1f} finish={} "
               "attention={} {}",
               meta_.id, meta_.request_id.empty() ? "" : "request_id=" + meta_.request_id + " ",
               req_.stream ? "stream" : "whole", usage.prompt_tokens, usage.cached_prompt_tokens,
               usage.completion_tokens, ttft_ms_, ms_since(start_), reasons, req_.engine.attention.name(), outcome);
}

std::optional<nlohmann::json> Generation::collect(const std::function<bool()>& client_alive) {
  std::vector<ChoiceOutput> choices(static_cast<size_t>(req_.choices()));
  StreamEvent event;
  bool client_gone = false;
  while (next(event, client_alive, client_gone)) {
    if (event.choice < 0 || event.choice >= static_cast<int32_t>(choices.size())) continue;
    ChoiceOutput& c = choices[event.choice];
    c.text += event.text;
    c.token_ids.insert(c.token_ids.end(), event.token_ids.begin(), event.token_ids.end());
    c.logprobs.insert(c.logprobs.end(), event.logprobs.begin(), event.logprobs.end());
    if (!event.prompt_logprobs.empty()) c.prompt_logprobs = std::move(event.prompt_logprobs);
    if (event.finish != FinishReason::kNone) c.finish = event.finish;
    if (event.finish == FinishReason::kError) c.error = event.error;
  }
  if (client_gone) {
    cancel_all();
    log_finished("client disconnected");
    return std::nullopt;
  }
  log_finished("ok");
  for (const ChoiceOutput& c : choices) {
    if (c.finish == FinishReason::kError) throw ApiError(500, "generation failed: " + c.error, "", "engine_error");
    if (c.finish == FinishReason::kCancelled) throw ApiError(503, kCutByDrain, "", "draining");
  }
  if (!req_.echo.empty())
    for (size_t i = 0; i < choices.size(); ++i) choices[i].text = req_.echo[i / req_.engine.n] + choices[i].text;
  const RequestUsage usage = this->usage();
  if (!req_.responses.is_null())
    return response_object(req_, meta_, choices[0].text, choices[0].finish, usage,
                           req_.logprobs ? chat_logprobs_json(choices[0].logprobs, tokenizer_)["content"] : nlohmann::json::array());
  return req_.kind == ApiKind::kChat ? chat_response(req_, meta_, choices, usage, tokenizer_)
                                     : completion_response(req_, meta_, choices, usage, tokenizer_);
}

std::vector<std::string> Generation::harmony_frames(HarmonySplit& split, size_t& calls_sent, const StreamEvent& event,
                                                   bool first) {
  HarmonyPiece piece = split.push(event.text);
  if (event.finish != FinishReason::kNone) {
    HarmonyPiece tail = split.finish(event.finish);
    piece.reasoning += tail.reasoning;
    piece.content += tail.content;
    piece.calls.insert(piece.calls.end(), tail.calls.begin(), tail.calls.end());
  }
  std::vector<nlohmann::json> deltas;
  if (!piece.reasoning.empty()) deltas.push_back({{"reasoning_content", std::move(piece.reasoning)}});
  if (!piece.content.empty()) deltas.push_back({{"content", std::move(piece.content)}});
  if (!piece.calls.empty()) {  // each call whole, numbered across the choice
    nlohmann::json calls = tool_calls_json(piece.calls, true);
    for (nlohmann::json& call : calls) call["index"] = calls_sent++;
    deltas.push_back({{"tool_calls", std::move(calls)}});
  }
  nlohmann::json reason;
  if (event.finish != FinishReason::kNone) {
    reason = calls_sent > 0 && event.finish == FinishReason::kStop ? "tool_calls" : api_finish_reason(event.finish);
    deltas.push_back(nlohmann::json::object());  // the finish_reason rides on an empty delta
  }
  const bool has_logprobs = req_.logprobs && !event.logprobs.empty();
  if (has_logprobs && deltas.empty()) deltas.push_back(nlohmann::json::object());
  std::vector<std::string> frames;
  for (size_t i = 0; i < deltas.size(); ++i) {
    const bool last = i + 1 == deltas.size();
    frames.push_back(sse_frame(chat_delta_chunk(req_, meta_, event.choice, std::move(deltas[i]), first && i == 0,
                                                last ? reason : nlohmann::json(),
                                                last && has_logprobs ? chat_logprobs_json(event.logprobs, tokenizer_)
                                                                     : nlohmann::json())));
  }
  return frames;
}

bool Generation::stream(const std::function<bool(const std::string&)>& write,
                        const std::function<bool()>& client_alive) {
  std::vector<bool> first(static_cast<size_t>(req_.choices()), true);
  std::vector<Utf8Offset> text_offset(static_cast<size_t>(req_.choices()));
  std::vector<ToolCallStream> tool_streams;  // chat with tools: per choice
  if (req_.tools.offered() && !req_.reasoning.harmony && req_.responses.is_null())
    for (int32_t c = 0; c < req_.choices(); ++c) tool_streams.emplace_back(req_.tools, tool_call_id_prefix(meta_, c));
  std::vector<ReasoningSplit> reasoning;  // chat with a reasoning model: per choice (server/reasoning.h)
  if (req_.reasoning.on && !req_.reasoning.harmony && req_.responses.is_null())
    for (int32_t c = 0; c < req_.choices(); ++c) reasoning.emplace_back(req_.reasoning.open);
  std::vector<HarmonySplit> harmony;  // chat with a harmony model: per choice (server/harmony.h)
  std::vector<size_t> harmony_calls(static_cast<size_t>(req_.choices()), 0);  // calls sent, per choice
  if (req_.reasoning.harmony && req_.responses.is_null()) {
    harmony.reserve(static_cast<size_t>(req_.choices()));
    for (int32_t c = 0; c < req_.choices(); ++c) harmony.emplace_back(req_.tools, tool_call_id_prefix(meta_, c));
  }
  // /v1/responses frames its own event sequence (one choice); the other APIs send chunks.
  std::optional<ResponsesStream> responses;
  if (!req_.responses.is_null()) responses.emplace(req_, meta_);
  FinishReason finish = FinishReason::kNone;
  std::string error;
  auto gone = [&] {
    cancel_all();
    log_finished("client disconnected");
    return false;
  };
  auto write_all = [&](const std::vector<std::string>& frames) {
    for (const std::string& f : frames)
      if (!write(f)) return false;
    return true;
  };
  if (responses && !write_all(responses->begin())) return gone();
  StreamEvent event;
  auto last_write = std::chrono::steady_clock::now();
  auto keep_alive = [&] {
    if (std::chrono::steady_clock::now() - last_write < kKeepAliveInterval) return true;
    last_write = std::chrono::steady_clock::now();
    return write(kSseKeepAlive);
  };
  bool client_gone = false;
  while (next(event, client_alive, client_gone, keep_alive)) {
    const size_t c = static_cast<size_t>(event.choice);
    if (c >= first.size()) continue;
    // A drain cut it short: no OpenAI finish_reason says so, so it ends as an error (503 "draining").
    const bool drained = event.finish == FinishReason::kCancelled;
    if (drained) {
      event.finish = FinishReason::kError;
      event.error = kCutByDrain;
    }
    if (responses) {
      if (event.finish != FinishReason::kNone) finish = event.finish;
      if (event.finish == FinishReason::kError) error = event.error;
      const nlohmann::json logprobs =
          req_.logprobs ? chat_logprobs_json(event.logprobs, tokenizer_)["content"] : nlohmann::json::array();
      if (!write_all(responses->delta(event.text, logprobs))) return gone();
      last_write = std::chrono::steady_clock::now();
      continue;
    }
    if (event.finish == FinishReason::kError) {
      if (!write(sse_frame(drained ? error_body(503, kCutByDrain, "", "draining")
                                   : error_body(500, "generation failed: " + event.error, "", "engine_error"))))
        return gone();
      continue;
    }
    if (!harmony.empty()) {  // thinking, text and calls as harmony's channels say
      const std::vector<std::string> frames = harmony_frames(harmony[c], harmony_calls[c], event, first[c]);
      if (frames.empty()) continue;
      if (!write_all(frames)) return gone();
      first[c] = false;
      last_write = std::chrono::steady_clock::now();
      continue;
    }
    if (!reasoning.empty()) {  // thinking goes out as reasoning_content deltas, the answer goes on
      ReasoningPiece piece = reasoning[c].push(event.text);
      if (event.finish != FinishReason::kNone) {
        ReasoningPiece tail = reasoning[c].finish();
        piece.reasoning += tail.reasoning;
        piece.content += tail.content;
      }
      if (!piece.reasoning.empty()) {
        if (!write(sse_frame(chat_delta_chunk(req_, meta_, event.choice, {{"reasoning_content", piece.reasoning}},
                                              first[c], nlohmann::json()))))
          return gone();
        first[c] = false;
        last_write = std::chrono::steady_clock::now();
      }
      event.text = std::move(piece.content);
    }
    if (!tool_streams.empty()) {  // text as it comes unless it may be a tool call (server/tool_stream.h)
      std::vector<nlohmann::json> deltas = tool_streams[c].push(event.text);
      nlohmann::json reason;
      if (event.finish != FinishReason::kNone) {
        std::vector<nlohmann::json> tail = tool_streams[c].finish(event.finish, reason);
        deltas.insert(deltas.end(), tail.begin(), tail.end());
        deltas.push_back(nlohmann::json::object());  // the finish_reason rides on an empty delta
      }
      for (size_t i = 0; i < deltas.size(); ++i) {
        const bool last = event.finish != FinishReason::kNone && i + 1 == deltas.size();
        if (!write(sse_frame(chat_delta_chunk(req_, meta_, event.choice, std::move(deltas[i]), first[c],
                                              last ? reason : nlohmann::json()))))
          return gone();
        first[c] = false;
        last_write = std::chrono::steady_clock::now();
      }
      continue;
    }
    const bool has_logprobs = req_.logprobs && (!event.logprobs.empty() || !event.prompt_logprobs.empty());
    // Nothing to say yet (a stop string may be forming): wait for the next event.
    if (event.text.empty() && event.finish == FinishReason::kNone && !has_logprobs && !first[c]) continue;
    if (first[c] && !req_.echo.empty()) event.text = req_.echo[c / static_cast<size_t>(req_.engine.n)] + event.text;
    if (!write(sse_frame(stream_chunk(req_, meta_, event, first[c], text_offset[c], tokenizer_)))) return gone();
    last_write = std::chrono::steady_clock::now();
    first[c] = false;
  }
  if (client_gone) return gone();
  if (responses) {
    if (!write_all(responses->end(finish, usage(), error))) return gone();
  } else {
    if (req_.include_usage && !write(sse_frame(usage_chunk(req_, meta_, usage())))) return gone();
    if (!write(kSseDone)) return gone();
  }
  log_finished("ok");
  return true;
}

}  // namespace fathom
