#include "server/grpc_write_watch.h"

#include <grpcpp/server_context.h>

#include <algorithm>

namespace fathom {

GrpcWriteWatch::GrpcWriteWatch(std::chrono::milliseconds timeout) : timeout_(timeout), thread_([this] { run(); }) {}

GrpcWriteWatch::~GrpcWriteWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

int64_t GrpcWriteWatch::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

GrpcWriteWatch::Call::Call(GrpcWriteWatch& watch, grpc::ServerContext* ctx) : watch_(watch), ctx_(ctx) {
  std::lock_guard<std::mutex> lock(watch_.mutex_);
  watch_.calls_.insert(this);
}

GrpcWriteWatch::Call::~Call() {
  std::lock_guard<std::mutex> lock(watch_.mutex_);
  watch_.calls_.erase(this);
}

void GrpcWriteWatch::run() {
  const auto period = std::min<std::chrono::milliseconds>(std::chrono::milliseconds(250), std::max<std::chrono::milliseconds>(timeout_ / 4, std::chrono::milliseconds(1)));
  const int64_t timeout_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout_).count();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, period, [&] { return stop_; });
    const int64_t now = now_ns();
    for (Call* c : calls_) {
      const int64_t since = c->writing_since_ns_.load(std::memory_order_acquire);
      if (since == 0 || c->cancelled_ || now - since <= timeout_ns) continue;
      c->cancelled_ = true;
      c->ctx_->TryCancel();  // the blocked Write returns false; the call then ends as the client's leaving
      cancelled_.fetch_add(1);
    }
  }
}

}  // namespace fathom
