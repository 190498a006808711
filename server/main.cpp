// fathom: one executable with subcommands.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "base/error.h"
#include "base/failpoints.h"
#include "engine/backend/backend.h"
#include "server/commands.h"
#if FATHOM_HAS_CUDA_BACKEND
#include "engine/backend/cuda/cuda_backend.h"
#endif

namespace {

void usage() {
  std::fputs(
      "usage: fathom <command> [options]        (PATH: a GGUF file or a Hugging Face model directory)\n"
      "  generate --model PATH (--prompt TEXT | --chat JSON | --prompt-ids 1,2,3)... [--max-tokens N]\n"
      "           [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--logprobs N]\n"
      "           [--threads N] [--kv-dtype f16|f32|int8] [--precision q8|f32] [--no-pack-weights] [--backend cpu|cuda]\n"
      "           [--attention dense|sparq|hip|alisa|auto] [--kv-read-ratio X] [--attention-min-keys N|measured]\n"
      "           [--ignore-eos] [--json]                                         (attention default: dense)\n"
      "           [--speculative off|ngram|sparse|model|auto] [--max-draft-tokens N] [--draft-kv-read-ratio X]\n"
      "           [--fixed-drafts]\n"
      "           [--draft-model PATH]\n"
      "  logits   --model PATH (--prompt TEXT | --prompt-ids 1,2,3) --out FILE   (f32 logits of every position)\n"
      "  chat     --model PATH [--max-tokens N] [--temperature T]                 (interactive)\n"
      "  serve    [--config FILE] [--model PATH] [--host H] [--port P] [--grpc-port P] [--threads N]\n"
      "           [--api-key K]... [--api-key-file F] [--kv-cache-mib N] [--host-kv-mib N] [--hot-rows-percent N]\n"
      "           [--max-num-seqs N] [--max-batched-tokens N] [--log-level L]   (OpenAI HTTP + gRPC; configs/README.md)\n"
      "           [--attention dense|sparq|hip|alisa|auto] [--kv-read-ratio X]      (default: dense; ratio 0.25)\n"
      "           [--embedding-pooling mean|cls|last|none]                       (/v1/embeddings; default: the model's)\n"
      "           [--speculative off|ngram|sparse|model|auto] [--max-draft-tokens N] (docs/speculative.md; off, 4)\n"
      "           [--draft-model PATH]                                           (the draft of --speculative model)\n"
      "           [--no-playground]                                              (the web page at /)\n",
      stderr);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
#if FATHOM_HAS_CUDA_BACKEND
  fathom::register_cuda_backend(fathom::make_cuda_backend);
#endif
  try {
    fathom::failpoints::configure_from_environment();
    if (command == "generate") return fathom::run_generate(argc, argv);
    if (command == "logits") return fathom::run_logits(argc, argv);
    if (command == "chat") return fathom::run_chat(argc, argv);
    if (command == "serve") return fathom::run_serve(argc, argv);
    std::fprintf(stderr, "fathom: unknown command '%s'\n", command.c_str());
    usage();
    return 2;
  } catch (const fathom::Error& e) {
    std::fprintf(stderr, "fathom: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fathom: internal error: %s\n", e.what());
    return 3;
  }
}
