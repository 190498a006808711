#pragma once
// Cancels gRPC calls whose write makes no progress for a time: HTTP's write_timeout_ms for the
// gRPC port. A synchronous ServerWriter::Write blocks while the client's HTTP/2 flow-control
// window is shut and has no deadline of its own, so a client that stops reading (and sets no
// deadline) would hold its server thread, one of grpc.max_threads, for as long as it liked.
// One thread checks the calls' writes every quarter of the timeout (at most 250 ms) and cancels
// (ServerContext::TryCancel) a call whose write has waited longer: the Write then returns false.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <unordered_set>

namespace grpc {
class ServerContext;
}

namespace fathom {

class GrpcWriteWatch {
 public:
  explicit GrpcWriteWatch(std::chrono::milliseconds timeout);
  ~GrpcWriteWatch();
  GrpcWriteWatch(const GrpcWriteWatch&) = delete;
  GrpcWriteWatch& operator=(const GrpcWriteWatch&) = delete;

  // One call, watched for as long as it lives.
  class Call {
   public:
    Call(GrpcWriteWatch& watch, grpc::ServerContext* ctx);
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    // Runs write() (a blocking write of this call), watched; returns what it returns.
    template <typename Write>
    bool write(Write&& write) {
      writing_since_ns_.store(now_ns(), std::memory_order_release);
      const bool ok = write();
      writing_since_ns_.store(0, std::memory_order_release);
      return ok;
    }

   private:
    friend class GrpcWriteWatch;
    GrpcWriteWatch& watch_;
    grpc::ServerContext* ctx_;
    std::atomic<int64_t> writing_since_ns_{0};  // steady clock; 0: not writing
    bool cancelled_ = false;                     // under watch_.mutex_
  };

  // Calls cancelled because a write stalled, since start.
  int64_t cancelled() const { return cancelled_.load(); }

 private:
  static int64_t now_ns();
  void run();

  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::unordered_set<Call*> calls_;
  bool stop_ = false;
  std::atomic<int64_t> cancelled_{0};
  std::thread thread_;  // last: starts after everything it reads
};

}  // namespace fathom
