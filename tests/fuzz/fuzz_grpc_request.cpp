// libFuzzer target: a gRPC GenerateRequest's bytes as a client sends them -> the validated engine
// request (server/grpc_request.h), over the real SmolLM2 model. Protobuf's parser is upstream's;
// this fuzzes what fathom does with a message it accepted: text and token ids, chat messages through
// the template, tools and tool_choice, output constraints, sampling, stop strings, n, priority and
// the attention and speculation options. Every input must end in a Request or an RpcError /
// RuleError / ApiError / fathom::Error (INVALID_ARGUMENT or NOT_FOUND); any other exception (the
// server would answer INTERNAL), crash, leak or undefined behaviour is a finding.
// Bytes: [selector][message]: bit 0 of the selector picks Qwen 2.5's template, which renders tools
// itself. The model: $FATHOM_FUZZ_MODEL, default models/smollm2-135m-instruct-q4_1.gguf.
#include <cstdint>
#include <cstdlib>

#include "base/error.h"
#include "engine/model/model.h"
#include "proto/fathom.pb.h"
#include "server/config.h"
#include "server/grpc_request.h"
#include "server/openai_request.h"
#include "server/request_rules.h"

namespace {

const fathom::Model* g_model = nullptr;
const fathom::Model* g_tools_model = nullptr;
fathom::ServerConfig g_config;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* path = std::getenv("FATHOM_FUZZ_MODEL");
  const char* file = path ? path : "models/smollm2-135m-instruct-q4_1.gguf";
  g_model = fathom::Model::load(file).release();
  g_tools_model = fathom::Model::load(file, "tests/fixtures/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja").release();
  g_config.model_name = "smollm2-135m-instruct";
  g_config.model = "models/smollm2-135m-instruct-q4_1.gguf";
  g_config.max_priority = 10;  // exercise the clamp
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const fathom::Model& model = (data[0] & 1) != 0 ? *g_tools_model : *g_model;
  fathom::v1::GenerateRequest in;
  if (!in.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;  // gRPC refuses it before fathom
  fathom::ToolPlan tools;
  fathom::ReasoningMode reasoning;
  try {
    (void)fathom::to_engine_request(in, model, g_config, tools, reasoning);
  } catch (const fathom::RpcError&) {
  } catch (const fathom::RuleError&) {
  } catch (const fathom::ApiError&) {
  } catch (const fathom::Error&) {
  }
  return 0;
}
