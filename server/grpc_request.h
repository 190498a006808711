#pragma once
// A gRPC GenerateRequest (proto/fathom.proto) as the engine's Request, through the same rules as
// the HTTP API (server/request_rules.h; chat input and tools in the HTTP API's JSON shape, so the
// same code reads both). No gRPC here, only its messages: scripts/fuzz.sh drives it alone
// (fuzz_grpc_request). Errors are RpcError (INVALID_ARGUMENT with a message) or the rules' own.
#include <grpcpp/impl/codegen/status_code_enum.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/request.h"
#include "proto/fathom.pb.h"
#include "server/reasoning.h"
#include "server/tools.h"

namespace fathom {

class Model;
struct ServerConfig;

// A request error with its gRPC code, thrown while translating a request.
class RpcError : public std::runtime_error {
 public:
  RpcError(grpc::StatusCode code, const std::string& message) : std::runtime_error(message), code(code) {}
  grpc::StatusCode code;
};

// The ids of `in`, each inside the vocabulary (else INVALID_ARGUMENT).
std::vector<int32_t> checked_token_ids(const v1::TokenIds& in, int32_t vocab);

// The id the server reports; the same rule as /v1/models (file name without .gguf by default).
std::string model_id(const ServerConfig& config);

// The engine request of `in`; `tools` and `reasoning` get the chat input's tool plan and
// reasoning mode (what the answer is then read by).
Request to_engine_request(const v1::GenerateRequest& in, const Model& model, const ServerConfig& config, ToolPlan& tools,
                          ReasoningMode& reasoning);

}  // namespace fathom
