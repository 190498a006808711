#pragma once
// One generation request as the HTTP layer serves it: submitted to the engine, then either
// collected into one OpenAI response body or streamed as SSE frames. Protocol framing only;
// the engine has already detokenized and applied stop strings. Logs one info line per
// finished request (id, tokens in/out, TTFT, finish reasons).
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai_request.h"
#include "server/openai_response.h"

namespace fathom {

class Engine;
class HarmonySplit;
class RequestHandle;
class Tokenizer;

class Generation {
 public:
  // Submits req.engine; throws what Engine::submit throws (Error, EngineBusy, EngineDraining).
  Generation(Engine& engine, const Tokenizer& tokenizer, ApiRequest req, ResponseMeta meta);
  ~Generation();  // cancels the request if it has not finished (client gone, handler threw)

  // Blocks until every choice has finished; the whole response body. Checks `client_alive`
  // whenever no event arrived for a while: nullopt when the client went away (the request is
  // then cancelled, its KV freed). Throws ApiError 500 when the engine reports an error.
  std::optional<nlohmann::json> collect(const std::function<bool()>& client_alive);

  // Streams SSE frames through `write` (false: the client is gone) and checks `client_alive`
  // whenever no event arrived for a while. Ends with the usage chunk (if asked) and
  // "data: [DONE]". Returns false when the client went away; the request is then cancelled.
  bool stream(const std::function<bool(const std::string&)>& write, const std::function<bool()>& client_alive);

  const ApiRequest& request() const { return req_; }

 private:
  // false once every choice has finished, or (client_gone set) when `client_alive` said no or
  // `on_idle` (called whenever no event came for kPollInterval, e.g. to send a keep-alive) failed.
  bool next(StreamEvent& event, const std::function<bool()>& client_alive, bool& client_gone,
            const std::function<bool()>& on_idle = {});
  // An event from any prompt's request within kPollInterval (choice renumbered p·n + c).
  bool poll(StreamEvent& event);
  bool all_done() const;
  void cancel_all();
  RequestUsage usage() const;  // summed over the prompts
  void note_event(const StreamEvent& event);
  // A harmony choice's chunks for `event` (server/harmony.h): its thinking, its text and whole
  // calls (`calls_sent` numbers them across the choice); the last carries the finish_reason.
  std::vector<std::string> harmony_frames(HarmonySplit& split, size_t& calls_sent, const StreamEvent& event, bool first);
  void log_finished(const char* outcome);

  const Tokenizer& tokenizer_;
  ApiRequest req_;
  ResponseMeta meta_;
  std::vector<std::shared_ptr<RequestHandle>> handles_;  // one per prompt
  size_t next_handle_ = 0;                               // round robin over handles_ in poll()
  std::chrono::steady_clock::time_point start_;
  double ttft_ms_ = -1.0;
  std::vector<FinishReason> finish_;  // per choice
  bool logged_ = false;
  std::chrono::steady_clock::time_point last_client_check_{};
};

}  // namespace fathom
