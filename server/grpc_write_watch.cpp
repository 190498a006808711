#include "server/grpc_write_watch.h"

#include <grpcpp/server_context.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <functional>
#include <utility>

namespace fathom {

class GrpcWriteWatch::Watcher final : public grpc::experimental::Interceptor {
 public:
  Watcher(GrpcWriteWatch& watch, grpc::experimental::ServerRpcInfo* info) : watch_(watch), info_(info) {}

  ~Watcher() override {
    if (!call_) return;
    {
      std::lock_guard<std::mutex> lock(watch_.mutex_);
      watch_.calls_.erase(this);
    }
    grpc_call_unref(call_);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      if (!call_) enter();
      sending_since_ns_.store(now_ns(), std::memory_order_release);
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_SEND_MESSAGE))
      sending_since_ns_.store(0, std::memory_order_release);
    methods->Proceed();  // PRE_SEND_CANCEL included: it comes from the watch's own cancel, locks nothing
  }

 private:
  friend class GrpcWriteWatch;
  // The first send: the call is watched from now on, on a reference of its own.
  void enter() {
    grpc_call* c = info_->server_context()->c_call();
    if (!c) return;
    grpc_call_ref(c);
    std::lock_guard<std::mutex> lock(watch_.mutex_);
    call_ = c;
    watch_.calls_.insert(this);
  }

  GrpcWriteWatch& watch_;
  grpc::experimental::ServerRpcInfo* info_;
  grpc_call* call_ = nullptr;                  // referenced while watched
  std::atomic<int64_t> sending_since_ns_{0};  // steady clock; 0: no send waiting
  bool cancelled_ = false;                     // under watch_.mutex_
};

namespace {

class WatcherFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit WatcherFactory(std::function<grpc::experimental::Interceptor*(grpc::experimental::ServerRpcInfo*)> make)
      : make_(std::move(make)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return make_(info);
  }

 private:
  std::function<grpc::experimental::Interceptor*(grpc::experimental::ServerRpcInfo*)> make_;
};

}  // namespace

GrpcWriteWatch::GrpcWriteWatch(std::chrono::milliseconds timeout) : timeout_(timeout), thread_([this] { run(); }) {}

GrpcWriteWatch::~GrpcWriteWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> GrpcWriteWatch::interceptor_factory() {
  return std::make_unique<WatcherFactory>([this](grpc::experimental::ServerRpcInfo* info) { return new Watcher(*this, info); });
}

int64_t GrpcWriteWatch::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void GrpcWriteWatch::run() {
  const auto period = std::min<std::chrono::milliseconds>(std::chrono::milliseconds(250),
                                                          std::max<std::chrono::milliseconds>(timeout_ / 4, std::chrono::milliseconds(1)));
  const int64_t timeout_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout_).count();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, period, [&] { return stop_; });
    const int64_t now = now_ns();
    for (Watcher* w : calls_) {
      const int64_t since = w->sending_since_ns_.load(std::memory_order_acquire);
      if (since == 0 || w->cancelled_ || now - since <= timeout_ns) continue;
      w->cancelled_ = true;
      grpc_call_cancel_with_status(w->call_, GRPC_STATUS_CANCELLED, "the client read nothing for write_timeout_ms",
                                   nullptr);
      spdlog::info("grpc call {} cancelled: its client read nothing for {} ms", w->info_->method(), timeout_.count());
    }
  }
}

}  // namespace fathom
