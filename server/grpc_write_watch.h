#pragma once
// Cancels gRPC calls whose sending makes no progress for a time: HTTP's write_timeout_ms for the
// gRPC port. gRPC's synchronous server has no send deadline: a Generate stream's Write, and a
// unary call's response (sent after the handler returns, on the handler's thread), wait while
// the client's HTTP/2 flow-control window is shut. So a client that grants a 1-byte window and
// never opens it held the call's server thread (one of grpc.max_threads) for as long as it liked.
//
// A server interceptor sees every call's sends: each message from when it is handed to gRPC
// (PRE_SEND_MESSAGE) until its send completes (POST_SEND_MESSAGE). One thread checks every quarter
// of the timeout (at most 250 ms) and cancels a call whose send has waited longer, through gRPC's
// C API on the call's own reference, so cancelling never touches a ServerContext that may be
// ending. The blocked send then fails and the thread is free (a Generate also cancels its engine
// request, as when its client leaves).
#include <grpc/grpc.h>
#include <grpcpp/support/server_interceptor.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_set>

namespace fathom {

class GrpcWriteWatch {
 public:
  explicit GrpcWriteWatch(std::chrono::milliseconds timeout);
  ~GrpcWriteWatch();  // after the server that uses its interceptors
  GrpcWriteWatch(const GrpcWriteWatch&) = delete;
  GrpcWriteWatch& operator=(const GrpcWriteWatch&) = delete;

  // For ServerBuilder::experimental().SetInterceptorCreators: one watcher per call.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> interceptor_factory();

 private:
  class Watcher;  // the interceptor of one call
  static int64_t now_ns();
  void run();

  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::unordered_set<Watcher*> calls_;  // calls that have sent (or are sending) a message
  bool stop_ = false;
  std::thread thread_;  // last: starts after everything it reads
};

}  // namespace fathom
