#pragma once
// The gRPC front end (proto/fathom.proto) over the Engine, plus grpc.health.v1.
#include <chrono>
#include <memory>
#include <string>

namespace fathom {

class KeyLimiter;
class MetricsRegistry;

class Engine;
struct ServerConfig;

class GrpcServer {
 public:
  virtual ~GrpcServer() = default;
  virtual int port() const = 0;          // the bound port
  virtual void set_serving(bool) = 0;    // health: SERVING / NOT_SERVING (draining)
  // Stops the server: Generate calls in flight (the drain has ended their generations, but a slow
  // client may still be reading) get up to `grace`, then every call left a few seconds more before
  // it is cancelled. Idempotent.
  virtual void shutdown(std::chrono::milliseconds grace) = 0;
};

// Starts listening on config.host:config.grpc_port (0 = any free port). Throws fathom::Error
// when the port cannot be bound.
// `keys`: the per-key request limit, shared with the HTTP server; `metrics`: where its calls are
// counted (server/grpc_metrics.h). Both outlive the server.
std::unique_ptr<GrpcServer> start_grpc_server(Engine& engine, const ServerConfig& config, int port, KeyLimiter& keys,
                                              MetricsRegistry& metrics);

}  // namespace fathom
