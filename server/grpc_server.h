#pragma once
// The gRPC front end (proto/fathom.proto) over the Engine, plus grpc.health.v1.
#include <chrono>
#include <memory>
#include <string>

namespace fathom {

class Engine;
struct ServerConfig;

class GrpcServer {
 public:
  virtual ~GrpcServer() = default;
  virtual int port() const = 0;          // the bound port
  virtual void set_serving(bool) = 0;    // health: SERVING / NOT_SERVING (draining)
  // Stops accepting calls; calls in flight (the drain has ended their generations, but a slow
  // client may still be reading) get `grace`, at least a few seconds, then are cancelled.
  virtual void shutdown(std::chrono::milliseconds grace = std::chrono::milliseconds(0)) = 0;
};

// Starts listening on config.host:config.grpc_port (0 = any free port). Throws fathom::Error
// when the port cannot be bound.
std::unique_ptr<GrpcServer> start_grpc_server(Engine& engine, const ServerConfig& config, int port);

}  // namespace fathom
