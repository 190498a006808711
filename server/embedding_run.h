#pragma once
// Embeddings through the engine: each input is prefilled as an embedding request
// (engine/request.h Request::embedding), batched with everything else the scheduler runs, and
// its pooled final hidden state (mean, CLS or last token) L2-normalised. HTTP's /v1/embeddings and
// gRPC's Embed both run here.
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "server/embeddings.h"

namespace fathom {

class Engine;

// An input's failure inside the engine (a failed step): HTTP 500, gRPC INTERNAL.
class EmbeddingFailed : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Runs every input through `engine`, at most `window` of them in the engine at once (a request may
// carry more inputs than the engine's queue holds). `client_alive` is polled while waiting: nullopt
// when it said no (the inputs in flight are cancelled). Throws EngineBusy when the engine refuses
// an input with none of this request's in flight, EngineDraining when a drain cut it, and
// EmbeddingFailed.
std::optional<EmbeddingResult> run_embeddings(Engine& engine, const EmbeddingRequest& request, const std::string& id,
                                              int32_t window, const std::function<bool()>& client_alive);

// Inputs of one request in the engine at once: a step's worth (the scheduler's max_num_seqs, at
// most 64), so a request of thousands runs in waves without filling the engine's queue.
int32_t embedding_window(const ServerConfig& config);

}  // namespace fathom
