#pragma once
// The server's configuration: one plain struct filled from configs/*.json, then CLI flags.
// Unknown keys are errors (a typo must not silently fall back to a default).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/backend/backend_options.h"
#include "server/http_transport.h"

namespace fathom {

struct ServerConfig {
  std::string model;                // path to a GGUF file
  std::string model_name;           // id reported by /v1/models; default: file name without .gguf
  ModelOptions model_options;       // threads, kv dtype, block size, kv budget, precision, chat template
  // How /v1/embeddings pools the final hidden states: "" = as the model's file says
  // (<arch>.pooling_type; a generative model's says nothing: no embeddings), or "mean", "cls",
  // "last" (pool a generative model's hidden states), or "none" (no embeddings).
  std::string embedding_pooling;
  SchedulerConfig scheduler;
  // Default decode attention policy of requests: dense, the model's exact output. A sparse policy
  // (sparq, hip, alisa, auto) changes the output and is what a request or config asks for; the
  // ratio here, 1/4, is what one that names no ratio gets (`auto` at 1/4 keeps dense's pass-key
  // answers on Gemma 3 and 95% of them on SmolLM2 at 4k and 8k: docs/attention.md).
  AttentionPolicy attention = AttentionPolicy::named("dense", 0.25);
  // Default speculative decoding of requests (config "speculative": {"mode"}; docs/speculative.md):
  // off, or a drafter whose drafts a dense pass verifies (the output is then the dense model's).
  Speculation speculative = Speculation::kOff;
  // The draft model of Speculation::kModel (a GGUF file or Hugging Face directory with the
  // model's tokenizer; config "speculative": {"draft_model"}, --draft-model); empty: none.
  std::string draft_model;
  std::string host = "127.0.0.1";
  int32_t port = 8080;              // HTTP; 0 = pick a free port (printed at start)
  int32_t grpc_port = 0;            // 0 = gRPC off; -1 = pick a free port
  int32_t grpc_max_threads = 0;     // gRPC server threads; 0 = http_workers() + 1 (one waits for calls)
  // gRPC server reflection (for grpcurl and the like): unauthenticated, and each open reflection
  // stream holds a server thread, so off unless asked for.
  bool grpc_reflection = false;
  std::vector<std::string> api_keys;  // empty = no auth
  std::string api_keys_file;          // more keys, one per line (keeps them off the command line)
  std::string log_level = "info";
  std::string log_format = "text";  // "text" (human) or "json" (one JSON object per line)
  int64_t max_body_bytes = 1 << 20;
  // Connection limits and deadlines of the HTTP front end (max_body_bytes above wins over
  // http_limits.max_body_bytes; max_workers 0 = sized from the scheduler's seqs + queue).
  HttpLimits http_limits{.max_workers = 0};
  int32_t max_n = 16;
  int32_t max_tokens_limit = 4096;  // largest max_tokens a request may ask for
  int32_t drain_timeout_ms = 30000;
  int32_t default_max_tokens = 256;
  // Client priorities are clamped into [-max_priority, max_priority]: 0 (the default) turns them
  // off (every request is equal, FCFS), so no client can jump the queue unless the operator says so.
  int32_t max_priority = 0;
  // Generation and embedding requests in flight per API key, HTTP and gRPC together (server/key_limiter.h);
  // 0: no limit. Needs API keys.
  int32_t max_requests_per_key = 0;
  // A request field its endpoint does not define: 400 naming it (OpenAI's answer), or ignored
  // (http.unknown_fields "ignore"; server/known_fields.h).
  bool reject_unknown_fields = true;
  // Origins whose browser pages may call the server ("*": any; server/cors.h); empty: none.
  std::vector<std::string> cors_origins;
  // The web playground at `/` (server/playground.h); false: `/` is a 404 like any unknown route.
  bool playground = true;
};

// ServerConfig::embedding_pooling's values ("" included).
inline bool valid_embedding_pooling(const std::string& p) {
  return p.empty() || p == "mean" || p == "cls" || p == "last" || p == "none";
}

// HTTP's blocking request handlers at once (http.max_workers), which gRPC's calls at once follow
// when grpc.max_threads is 0. The config's 0 means every request the engine can hold (running +
// queued) plus room for tokenizer, health and listing calls. One more is refused at once rather
// than parked.
inline int32_t http_workers(const ServerConfig& config) {
  if (config.http_limits.max_workers > 0) return config.http_limits.max_workers;
  const int64_t n = int64_t{config.scheduler.max_num_seqs} + config.scheduler.max_queue + 16;
  return static_cast<int32_t>(n < 16 ? 16 : n > 4096 ? 4096 : n);
}

// The priority a client's request runs at (it asked for `asked`, already range-checked).
inline int32_t client_priority(int64_t asked, const ServerConfig& config) {
  return static_cast<int32_t>(asked < -config.max_priority ? -config.max_priority
                              : asked > config.max_priority ? config.max_priority
                                                            : asked);
}

// Environment overrides: FATHOM_<KEY PATH> sets a config key, the path upper-cased with levels
// joined by "__" (FATHOM_HTTP__PORT=9000 sets http.port, FATHOM_KV_CACHE__DTYPE=int8,
// FATHOM_THREADS=4). Values are JSON when they parse as a number, true/false or an array, else the
// text. They apply over the file and under command-line flags. Variables whose first level is not
// a config key (FATHOM_API_KEYS, FATHOM_FAILPOINTS, ...) are left to their own features; a wrong
// key inside a section is an error like any unknown key.
using EnvVars = std::vector<std::pair<std::string, std::string>>;
EnvVars fathom_environment();  // the process's FATHOM_* variables

// Throws fathom::Error naming the key for unknown keys, wrong types and out-of-range values.
ServerConfig load_server_config(const std::string& json_path, const EnvVars& env = {});
ServerConfig parse_server_config(const std::string& json_text, const std::string& origin, const EnvVars& env = {});

}  // namespace fathom
