#include "server/embedding_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>

#include "engine/engine.h"
#include "server/config.h"

namespace fathom {
namespace {

// How long to wait on the oldest input in flight before looking at the client again.
constexpr std::chrono::milliseconds kPollInterval(100);

void normalize(std::vector<float>& v) {
  double sum = 0;
  for (float x : v) sum += static_cast<double>(x) * x;
  const double scale = 1.0 / std::max(std::sqrt(sum), 1e-12);  // torch.nn.functional.normalize's eps
  for (float& x : v) x = static_cast<float>(x * scale);
}

}  // namespace

int32_t embedding_window(const ServerConfig& config) { return std::clamp(config.scheduler.max_num_seqs, 1, 64); }

std::optional<EmbeddingResult> run_embeddings(Engine& engine, const EmbeddingRequest& request, const std::string& id,
                                              int32_t window, const std::function<bool()>& client_alive) {
  const size_t n = request.inputs.size();
  EmbeddingResult result;
  result.vectors.resize(n);
  struct InFlight {
    size_t input;
    std::shared_ptr<RequestHandle> handle;
  };
  std::deque<InFlight> flight;
  // Whatever is still in the engine when this returns or throws is cancelled (its blocks freed).
  struct CancelRest {
    std::deque<InFlight>& f;
    ~CancelRest() {
      for (InFlight& x : f) x.handle->cancel();
    }
  } cancel_rest{flight};
  size_t next = 0;
  auto last_check = std::chrono::steady_clock::now();
  while (next < n || !flight.empty()) {
    // Fill the window; a full engine queue with none of ours in it is the client's 429.
    while (next < n && static_cast<int32_t>(flight.size()) < std::max(1, window)) {
      Request r;
      r.id = id + "-" + std::to_string(next);
      r.prompt = request.inputs[next];
      r.embedding = request.pooling;
      r.priority = request.priority;
      try {
        flight.push_back({next, engine.submit(std::move(r))});
      } catch (const EngineBusy&) {
        if (flight.empty()) throw;
        break;  // retry once one of ours has finished
      }
      ++next;
    }
    InFlight& oldest = flight.front();
    StreamEvent ev;
    bool finished = false;
    if (oldest.handle->next(ev, kPollInterval)) {
      if (ev.finish == FinishReason::kError) throw EmbeddingFailed("embedding failed: " + ev.error);
      if (ev.finish == FinishReason::kCancelled)
        throw EngineDraining("the server is shutting down: the request was cancelled before it finished");
      if (ev.finish == FinishReason::kStop) {
        std::vector<float>& v = result.vectors[oldest.input];
        v = std::move(ev.embedding);
        normalize(v);
        result.prompt_tokens += static_cast<int64_t>(request.inputs[oldest.input].size());
        finished = true;
      }
    }
    if (finished) flight.pop_front();
    const auto now = std::chrono::steady_clock::now();
    if (now - last_check >= kPollInterval) {
      last_check = now;
      if (!client_alive()) return std::nullopt;
    }
  }
  return result;
}

}  // namespace fathom
