#include "server/grpc_metrics.h"

#include <grpcpp/support/status.h>

#include <string>

#include "engine/metrics.h"

namespace fathom {
namespace {

const char* code_name(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "ok";
    case grpc::StatusCode::CANCELLED: return "cancelled";
    case grpc::StatusCode::UNKNOWN: return "unknown";
    case grpc::StatusCode::INVALID_ARGUMENT: return "invalid_argument";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "deadline_exceeded";
    case grpc::StatusCode::NOT_FOUND: return "not_found";
    case grpc::StatusCode::ALREADY_EXISTS: return "already_exists";
    case grpc::StatusCode::PERMISSION_DENIED: return "permission_denied";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "resource_exhausted";
    case grpc::StatusCode::FAILED_PRECONDITION: return "failed_precondition";
    case grpc::StatusCode::ABORTED: return "aborted";
    case grpc::StatusCode::OUT_OF_RANGE: return "out_of_range";
    case grpc::StatusCode::UNIMPLEMENTED: return "unimplemented";
    case grpc::StatusCode::INTERNAL: return "internal";
    case grpc::StatusCode::UNAVAILABLE: return "unavailable";
    case grpc::StatusCode::DATA_LOSS: return "data_loss";
    case grpc::StatusCode::UNAUTHENTICATED: return "unauthenticated";
    default: return "other";
  }
}

// The method as a label: only the services this server registers keep their names.
std::string method_label(const char* method) {
  const std::string m = method ? method : "";
  for (const char* service : {"/fathom.v1.Fathom/", "/grpc.health.v1.Health/"})
    if (m.rfind(service, 0) == 0 && m.size() <= 64) return m;
  return "other";
}

class CallMetrics final : public grpc::experimental::Interceptor {
 public:
  CallMetrics(MetricsRegistry& metrics, grpc::experimental::ServerRpcInfo* info)
      : metrics_(metrics), method_(method_label(info->method())) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const char* code = code_name(methods->GetSendStatus().error_code());
      metrics_.counter("fathom_grpc_requests_total", "gRPC calls by method and status", {{"method", method_}, {"code", code}})
          .inc();
      if (methods->GetSendStatus().error_code() != grpc::StatusCode::OK)
        metrics_.counter("fathom_errors_total", "Error responses by protocol and error code",
                         {{"protocol", "grpc"}, {"code", code}})
            .inc();
    }
    methods->Proceed();
  }

 private:
  MetricsRegistry& metrics_;
  const std::string method_;
};

class CallMetricsFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CallMetricsFactory(MetricsRegistry& metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new CallMetrics(metrics_, info);
  }

 private:
  MetricsRegistry& metrics_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> grpc_metrics_interceptors(MetricsRegistry& metrics) {
  return std::make_unique<CallMetricsFactory>(metrics);
}

}  // namespace fathom
