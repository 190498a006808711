#pragma once
// The OpenAI-compatible HTTP routes over HttpTransport (server/http_transport.h): /v1/completions, /v1/chat/completions,
// /v1/models, /tokenize, /detokenize, /health, /metrics, and the web playground at / when
// http.playground is on (server/playground.h). It listens before the model is
// loaded so that /health can say "loading"; generation routes answer 503 until set_ready().
#include <chrono>
#include <memory>

namespace fathom {

class KeyLimiter;

class Engine;
class Model;
class MetricsRegistry;
struct ServerConfig;

class HttpServer {
 public:
  // `config` and `metrics` must outlive the server.
  // `keys`: the per-key request limit, shared with the gRPC server.
  HttpServer(const ServerConfig& config, MetricsRegistry& metrics, KeyLimiter& keys);
  ~HttpServer();  // stop()s

  // Binds config.host:config.port (0 = a free port) and starts serving on a background
  // thread. Returns the bound port. Throws fathom::Error when the address cannot be bound.
  int start();
  // The model is loaded and the engine running: generation routes open, /health says ready.
  // Both must outlive the server (or stop() must be called before they go).
  void set_ready(Engine& engine, const Model& model);
  // Admission stops: generation routes answer 503 with Retry-After, /health says draining.
  void set_draining();
  // Stops listening and waits for the handler threads to end, giving responses being written
  // `grace` (at least two seconds; HttpTransport::stop). Idempotent.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(0));

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fathom
