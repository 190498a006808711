// fathom generate / fathom logits.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "engine/speculative/draft_model.h"
#include "engine/generate.h"
#include "engine/backend/backend.h"
#include "engine/model/model.h"
#include "server/commands.h"
#include "server/model_options.h"
#include "server/prompt_input.h"

namespace fathom {
namespace {

// names ∪ shared (a command's own option or flag names plus the model ones).
std::set<std::string> with(std::set<std::string> names, const std::set<std::string>& shared) {
  names.insert(shared.begin(), shared.end());
  return names;
}

SamplingParams sampling_from_args(const CliArgs& args) {
  SamplingParams p;
  p.temperature = static_cast<float>(args.get_double("temperature", 0.8));
  p.top_k = static_cast<int32_t>(args.get_int("top-k", 0));
  p.top_p = static_cast<float>(args.get_double("top-p", 1.0));
  p.min_p = static_cast<float>(args.get_double("min-p", 0.0));
  p.repetition_penalty = static_cast<float>(args.get_double("repetition-penalty", 1.0));
  p.presence_penalty = static_cast<float>(args.get_double("presence-penalty", 0.0));
  p.frequency_penalty = static_cast<float>(args.get_double("frequency-penalty", 0.0));
  p.logprobs = static_cast<int32_t>(args.get_int("logprobs", -1));
  if (args.has("seed")) p.seed = static_cast<uint64_t>(args.get_int("seed", 0));
  return p;
}

nlohmann::json result_json(const Model& model, const std::vector<int32_t>& prompt, const GenerateResult& r,
                           bool with_logprobs) {
  nlohmann::json j;
  j["text"] = model.tokenizer().decode(r.tokens);
  j["token_ids"] = r.tokens;
  j["prompt_tokens"] = prompt.size();
  j["completion_tokens"] = r.tokens.size();
  j["finish_reason"] = r.finish_reason;
  if (with_logprobs) {
    nlohmann::json lp = nlohmann::json::array();
    for (const SampledToken& t : r.sampled) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& [id, logprob] : t.top) top.push_back({{"id", id}, {"logprob", logprob}});
      lp.push_back({{"id", t.id}, {"logprob", t.logprob}, {"top", top}});
    }
    j["logprobs"] = lp;
  }
  return j;
}

}  // namespace

int run_generate(int argc, char** argv) {
  CliArgs args(with({"prompt", "chat", "prompt-ids", "max-tokens", "temperature", "top-k", "top-p", "min-p", "seed",
                     "logprobs", "repetition-penalty", "presence-penalty", "frequency-penalty", "speculative",
                     "max-draft-tokens", "draft-kv-read-ratio", "draft-model"},
                    kModelOptionNames),
               with({"json", "ignore-eos", "fixed-drafts"}, kModelFlagNames));
  args.parse(argc, argv, 2);
  const ModelOptions options = model_options_from_args(args);
  auto model = Model::load(args.require("model"), options.chat_template);
  auto backend = make_backend(*model, options);
  const auto prompts = prompts_from_args(*model, args);
  std::vector<GenerateRequest> requests;
  for (const auto& p : prompts) {
    GenerateRequest r;
    r.prompt = p;
    r.sampling = sampling_from_args(args);
    r.max_tokens = static_cast<int32_t>(args.get_int("max-tokens", 128));
    if (r.max_tokens < 0) throw Error("--max-tokens must not be negative");
    r.stop_at_end_of_generation = !args.flag("ignore-eos");
    r.attention = attention_from_args(args);
    if (auto v = args.get("speculative")) {
      const std::optional<Speculation> m = parse_speculation(*v);
      if (!m) throw Error("--speculative must be one of " + std::string(kSpeculationNames) + ", got '" + *v + "'");
      r.speculative = *m;
    }
    requests.push_back(std::move(r));
  }
  const bool json = args.flag("json");
  // Plain output streams the text of a single prompt as it is generated.
  IncrementalDetokenizer detok(model->tokenizer());
  TokenCallback stream;
  if (!json && requests.size() == 1)
    stream = [&](size_t, int32_t id) {
      std::fputs(detok.push(id).c_str(), stdout);
      std::fflush(stdout);
    };
  SchedulerConfig engine_config;
  engine_config.max_draft_tokens = static_cast<int32_t>(args.get_int("max-draft-tokens", engine_config.max_draft_tokens));
  if (engine_config.max_draft_tokens < 0 || engine_config.max_draft_tokens > 16)
    throw Error("--max-draft-tokens must be between 0 and 16");
  engine_config.draft_kv_read_ratio = args.get_double("draft-kv-read-ratio", engine_config.draft_kv_read_ratio);
  if (!(engine_config.draft_kv_read_ratio > 0 && engine_config.draft_kv_read_ratio <= 1))
    throw Error("--draft-kv-read-ratio must be in (0, 1]");
  engine_config.adaptive_drafts = !args.flag("fixed-drafts");
  LoadedDraftModel draft;
  if (auto path = args.get("draft-model")) draft = load_draft_model(*path, *model, options);
  GenerateStats stats;
  const auto results = generate(*model, *backend, requests, &stats, stream, engine_config, draft.draft.get());
  const double prefill_tps = stats.prefill_seconds > 0 ? stats.prefill_tokens / stats.prefill_seconds : 0;
  const double decode_tps = stats.decode_seconds > 0 ? stats.decode_tokens / stats.decode_seconds : 0;
  if (json) {
    nlohmann::json out;
    const bool lp = requests[0].sampling.logprobs >= 0;
    if (results.size() == 1) {
      out = result_json(*model, prompts[0], results[0], lp);
    } else {
      out["results"] = nlohmann::json::array();
      for (size_t i = 0; i < results.size(); ++i) out["results"].push_back(result_json(*model, prompts[i], results[i], lp));
    }
    out["prefill_tokens_per_second"] = prefill_tps;
    out["decode_tokens_per_second"] = decode_tps;
    std::cout << out.dump() << "\n";
  } else if (requests.size() == 1) {
    std::fputs(detok.flush().c_str(), stdout);
    std::fprintf(stderr, "\n[prefill %lld tokens at %.1f tok/s, decode %lld tokens at %.1f tok/s]\n",
                 static_cast<long long>(stats.prefill_tokens), prefill_tps, static_cast<long long>(stats.decode_tokens),
                 decode_tps);
  } else {
    for (size_t i = 0; i < results.size(); ++i)
      std::printf("[%zu] %s\n", i, model->tokenizer().decode(results[i].tokens).c_str());
  }
  return 0;
}

int run_logits(int argc, char** argv) {
  CliArgs args(with({"prompt", "prompt-ids", "out"}, kModelOptionNames), kModelFlagNames);
  args.parse(argc, argv, 2);
  // Logits for comparison with a reference: f32 compute and f32 KV unless overridden.
  ModelOptions defaults;
  defaults.precision = cpu::Precision::kF32;
  defaults.kv_dtype = KvDtype::kF32;
  const ModelOptions options = model_options_from_args(args, defaults);
  auto model = Model::load(args.require("model"), options.chat_template);
  auto backend = make_backend(*model, options);
  const auto prompts = prompts_from_args(*model, args);
  if (prompts.size() != 1) throw Error("logits takes exactly one prompt");
  const std::vector<float> logits = prompt_logits(*model, *backend, prompts[0]);
  const std::string out_path = args.require("out");
  std::ofstream out(out_path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * sizeof(float)));
  if (!out) throw Error("cannot write " + out_path);
  nlohmann::json j{{"ids", prompts[0]}, {"vocab", model->vocab()}};
  std::cout << j.dump() << "\n";
  return 0;
}

}  // namespace fathom
