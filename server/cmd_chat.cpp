// fathom chat: an interactive conversation on the terminal (what `make serve` runs until the
// HTTP server lands). Each turn re-renders the whole conversation with the chat template.
#include <cstdio>
#include <iostream>
#include <string>

#include "engine/backend/backend.h"
#include "engine/generate.h"
#include "engine/model/model.h"
#include "server/commands.h"
#include "server/model_options.h"

namespace fathom {

int run_chat(int argc, char** argv) {
  std::set<std::string> names = {"max-tokens", "temperature", "seed", "system"};
  names.insert(kModelOptionNames.begin(), kModelOptionNames.end());
  CliArgs args(names, kModelFlagNames);
  args.parse(argc, argv, 2);
  const ModelOptions options = model_options_from_args(args);
  auto model = Model::load(args.require("model"), options.chat_template);
  auto backend = make_backend(*model, options);
  const ChatTemplate& tmpl = model->chat_template();
  std::vector<ChatMessage> history;
  if (auto system = args.get("system")) history.push_back({"system", *system});
  std::fprintf(stderr, "fathom chat (%s, %s template). Empty line or Ctrl-D ends.\n", model->config().arch_name.c_str(),
               tmpl.family_name());
  std::string line;
  for (;;) {
    std::fputs("\n> ", stderr);
    if (!std::getline(std::cin, line) || line.empty()) break;
    history.push_back({"user", line});
    GenerateRequest req;
    req.prompt = model->encode_chat(history, true);
    req.sampling.temperature = static_cast<float>(args.get_double("temperature", 0.7));
    if (args.has("seed")) req.sampling.seed = static_cast<uint64_t>(args.get_int("seed", 0));
    req.max_tokens = static_cast<int32_t>(args.get_int("max-tokens", 512));
    IncrementalDetokenizer detok(model->tokenizer());
    std::string reply;
    GenerateStats stats;
    generate(*model, *backend, {req}, &stats, [&](size_t, int32_t id) {
      const std::string piece = detok.push(id);
      reply += piece;
      std::fputs(piece.c_str(), stdout);
      std::fflush(stdout);
    });
    reply += detok.flush();
    std::fprintf(stderr, "\n[%lld tokens, %.1f tok/s]", static_cast<long long>(stats.decode_tokens + 1),
                 stats.decode_seconds > 0 ? stats.decode_tokens / stats.decode_seconds : 0.0);
    history.push_back({"assistant", reply});
  }
  std::fputs("\n", stderr);
  return 0;
}

}  // namespace fathom
