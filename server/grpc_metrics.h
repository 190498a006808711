#pragma once
// gRPC calls in the same metrics as HTTP requests: fathom_grpc_requests_total{method, code} for
// every call, and fathom_errors_total{protocol="grpc", code} for every one that did not end OK
// (code: the status name in lower case, e.g. invalid_argument, resource_exhausted). A server
// interceptor reads each call's status as it is sent. The method label is the called method for
// fathom's and the health service's, "other" for anything else, so a client naming methods cannot
// create unbounded series.
#include <grpcpp/support/server_interceptor.h>

#include <memory>

namespace fathom {

class MetricsRegistry;

// For ServerBuilder::experimental().SetInterceptorCreators; `metrics` outlives the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> grpc_metrics_interceptors(MetricsRegistry& metrics);

}  // namespace fathom
