// libFuzzer target: an HTTP request body as a client sends it -> the validated engine request.
// Bytes: [route selector][body...]. The body goes through exactly what the HTTP routes run:
// parse_json_body, check_model_name, then one of parse_completion_request /
// parse_chat_request / parse_tokenize_request / parse_detokenize_request /
// parse_responses_request / parse_embeddings_request over the real SmolLM2
// model (tokenizer + chat template), and for chat, encoding the rendered prompt. Every input must
// end in a value or an ApiError / fathom::Error (a 4xx); any other exception (the server would
// answer 500), crash, leak or undefined behaviour is a finding.
// The model: $FATHOM_FUZZ_MODEL, default models/smollm2-135m-instruct-q4_1.gguf (run from the repo root);
// chat and tokenize also run half the time with Qwen 2.5's template, which renders tools itself
// (the ordered parse of the body's tools, Hermes calls passed as they are).
// The selector byte: route = low bits % 6; bit 7 picks the template.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "base/error.h"
#include "engine/model/model.h"
#include "server/config.h"
#include "server/embeddings.h"
#include "server/openai_request.h"
#include "server/responses_api.h"

namespace {

const fathom::Model* g_model = nullptr;
const fathom::Model* g_tools_model = nullptr;  // the same file with Qwen 2.5's chat template
fathom::ServerConfig g_config;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* path = std::getenv("FATHOM_FUZZ_MODEL");
  g_model = fathom::Model::load(path ? path : "models/smollm2-135m-instruct-q4_1.gguf").release();
  g_tools_model = fathom::Model::load(path ? path : "models/smollm2-135m-instruct-q4_1.gguf",
                                      "tests/fixtures/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja")
                      .release();
  g_config.model_name = "smollm2-135m-instruct";
  g_config.model = "models/smollm2-135m-instruct-q4_1.gguf";
  g_config.max_priority = 10;  // exercise the clamp
  g_config.embedding_pooling = "mean";  // embeddings served: their inputs are parsed
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const unsigned route = (data[0] & 0x7f) % 6;
  const fathom::Model& chat_model = (data[0] & 0x80) != 0 ? *g_tools_model : *g_model;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const nlohmann::json json = fathom::parse_json_body(body);
    fathom::check_model_name(json, g_config);
    switch (route) {
      case 0: (void)fathom::parse_completion_request(json, *g_model, g_config); break;
      case 1: (void)fathom::parse_chat_request(json, chat_model, g_config, body); break;
      case 2: (void)fathom::parse_tokenize_request(json, chat_model, body); break;
      case 4: (void)fathom::parse_responses_request(json, chat_model, g_config, body); break;
      case 5: (void)fathom::parse_embeddings_request(json, *g_model, g_config); break;
      default: (void)g_model->tokenizer().decode(fathom::parse_detokenize_request(json, *g_model)); break;
    }
  } catch (const fathom::ApiError& e) {
    if (e.status < 400 || e.status > 499) std::abort();  // client input may only earn a 4xx
  } catch (const fathom::Error&) {
  }
  return 0;
}
