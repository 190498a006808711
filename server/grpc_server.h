#pragma once
// The gRPC front end (proto/fathom.proto) over the Engine, plus grpc.health.v1.
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
  virtual void shutdown() = 0;           // waits for in-flight calls up to a short deadline
};

// Starts listening on config.host:config.grpc_port (0 = any free port). Throws fathom::Error
// when the port cannot be bound.
std::unique_ptr<GrpcServer> start_grpc_server(Engine& engine, const ServerConfig& config, int port);

}  // namespace fathom
