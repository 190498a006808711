// n samples of one prompt through the serving engine: decode speed with bifurcated attention
// (the scheduler reads the shared prompt once per step for all choices) and without it (each
// choice reads the prompt's KV blocks, physically shared, on its own).
//
// For each prompt length D: engine sessions alternating between bifurcated on and off (--reps
// each). A session prefills the prompt once (later requests hit the prefix cache, whose blocks
// are shared exactly as an n > 1 request's are), then for each n runs one request {D-token
// prompt, n choices, --decode-tokens each, temperature 1 with a fixed seed, EOS ignored}, timed
// from the first streamed token (the choices fork off at the first sample) to the last.
// Step time = that time / (tokens − 1); decode tokens/s = n / step. Medians over the sessions.
//
//   bench_samples --model PATH [--threads 2] [--depths 1024,4096] [--samples 1,4,16]
//                 [--decode-tokens 32] [--reps 3] [--out FILE]
// FILE defaults to bench/results/samples-<model>.md, <model> the GGUF name's family
// (smollm2-135m-... -> smollm2, gemma-3-270m-... -> gemma3): one file per model, re-runs overwrite it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "bench/cli.h"
#include "engine/backend/backend.h"
#include "engine/engine.h"
#include "engine/metrics.h"
#include "engine/model/model.h"
#include "engine/model/gguf.h"
#include "engine/model/hf_dir.h"
#include "kernels/cpu/attention_partial.h"
#include "kernels/cpu/matmul.h"

namespace fathom {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string model, out;
  int threads = 2, decode_tokens = 32, reps = 3;
  std::vector<int> depths = {1024, 4096}, samples = {1, 4, 16};
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") a.model = v;
    else if (k == "--threads") a.threads = std::atoi(v.c_str());
    else if (k == "--depths") a.depths = bench::parse_int_list<int>(v, "--depths", 0, 1 << 24);
    else if (k == "--samples") a.samples = bench::parse_int_list<int>(v, "--samples", 1, 4096);
    else if (k == "--decode-tokens") a.decode_tokens = std::atoi(v.c_str());
    else if (k == "--reps") a.reps = std::atoi(v.c_str());
    else if (k == "--out") a.out = v;
    else throw Error("unknown flag " + k);
  }
  if (a.model.empty()) throw Error("--model is required");
  if (a.out.empty()) {  // the family: the name's first part, and the next if it is a version number
    std::string stem = a.model.substr(a.model.find_last_of('/') + 1);
    std::string family = stem.substr(0, stem.find('-'));
    if (family.size() < stem.size()) {
      const std::string next = stem.substr(family.size() + 1, stem.find('-', family.size() + 1) - family.size() - 1);
      if (!next.empty() && next.find_first_not_of("0123456789") == std::string::npos) family += next;
    }
    a.out = "bench/results/samples-" + family + ".md";
  }
  if (a.decode_tokens < 2) throw Error("--decode-tokens must be at least 2");
  return a;
}

// Seconds from the first streamed token to the end of the request.
double decode_seconds(Engine& engine, const std::vector<int32_t>& prompt, int n, int tokens) {
  Request r;
  r.prompt = prompt;
  r.n = n;
  r.max_tokens = tokens;
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 7;
  r.stop.ignore_eos = true;
  auto h = engine.submit(r);
  StreamEvent ev;
  Clock::time_point first{};
  bool started = false;
  int64_t received = 0;
  while (!h->done()) {
    if (!h->next(ev, std::chrono::milliseconds(1000))) continue;
    if (ev.finish == FinishReason::kError) throw Error("request failed: " + ev.error);
    if (!started && !ev.token_ids.empty()) {
      first = Clock::now();
      started = true;
    }
    received += static_cast<int64_t>(ev.token_ids.size());
  }
  const double s = std::chrono::duration<double>(Clock::now() - first).count();
  if (received != static_cast<int64_t>(n) * tokens)
    throw Error("expected " + std::to_string(n * tokens) + " tokens, got " + std::to_string(received));
  return s;
}

// One engine session: the prompt prefilled once (a 2-token request; later requests hit the
// prefix cache), then every n once. Returns the step seconds per n.
std::vector<double> session(const Model& model, Backend& backend, bool bifurcated, const std::vector<int32_t>& prompt, const Args& a) {
  MetricsRegistry metrics;
  SchedulerConfig cfg;
  cfg.bifurcated = bifurcated;
  cfg.max_num_seqs = std::max(cfg.max_num_seqs, *std::max_element(a.samples.begin(), a.samples.end()));
  Engine engine(model, backend, cfg, metrics);
  decode_seconds(engine, prompt, 1, 2);
  std::vector<double> steps;
  for (int n : a.samples) steps.push_back(decode_seconds(engine, prompt, n, a.decode_tokens) / (a.decode_tokens - 1));
  return steps;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int run(const Args& a) {
  const int max_depth = *std::max_element(a.depths.begin(), a.depths.end());
  const int max_n = *std::max_element(a.samples.begin(), a.samples.end());
  ModelOptions opts;
  opts.threads = a.threads;
  {
    const ModelConfig c = ModelConfig::from_gguf(*open_model_file(a.model));
    const KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, opts.block_size, opts.kv_dtype, opts.kv_transposed_k};
    // The prompt once, every choice's own blocks (its copy of the prompt's last partial block
    // and its decoded tokens), and slack.
    const int64_t blocks = (max_depth + opts.block_size - 1) / opts.block_size +
                           static_cast<int64_t>(max_n) * ((a.decode_tokens + 2 * opts.block_size) / opts.block_size + 1) + 8;
    opts.kv_cache_bytes = static_cast<int64_t>(layout.block_bytes()) * blocks;
  }
  std::unique_ptr<Model> model = Model::load(a.model);
  std::unique_ptr<Backend> backend = make_backend(*model, opts);
  const Tokenizer& tok = model->tokenizer();
  std::vector<int32_t> base = tok.encode(
      "The lighthouse keeper climbed the narrow stairs every evening before the sun went down, carried a can of oil "
      "and a notebook, and wrote down the weather, the ships and the birds on the rocks. ",
      EncodeOptions{false, false});
  std::vector<int32_t> text;
  if (tok.add_bos() && tok.bos_id() >= 0) text.push_back(tok.bos_id());
  while (static_cast<int>(text.size()) < max_depth) text.insert(text.end(), base.begin(), base.end());

  const char* kernel = std::string(cpu::simd_level()) != "avx512" ? "per-row kernels"
                       : cpu::partial_attention_rows_amx()          ? "AMX bf16x3 from 32 rows, Kᵀ kernel below"
                                                                    : "AVX-512 Kᵀ kernel";
  std::ostringstream md;
  md << "# n samples of one prompt: decode with and without bifurcated attention\n\n"
     << "bench/bench_samples.cpp, model " << a.model << ", " << a.threads << " threads, f16 KV, "
     << a.decode_tokens << " tokens per choice (temperature 1, seed 7, EOS ignored), the prompt from the prefix "
        "cache, median of "
     << a.reps << " alternating sessions per mode; shared-prefix kernel: " << kernel
     << ". Step = one decode step of all n choices; tokens/s = n ÷ step.\n\n"
     << "| prompt | n | bifurcated step ms | per-choice step ms | bifurcated tok/s | per-choice tok/s | speed-up | "
        "bifurcated step ÷ n = 1 step |\n|---|---|---|---|---|---|---|---|\n";
  for (int depth : a.depths) {
    const std::vector<int32_t> prompt(text.begin(), text.begin() + depth);
    // Sessions alternate between the two modes (the machine's speed drifts over minutes).
    std::vector<std::vector<double>> on(a.samples.size()), off(a.samples.size());
    for (int rep = 0; rep < a.reps; ++rep)
      for (bool bif : {true, false}) {
        const std::vector<double> steps = session(*model, *backend, bif, prompt, a);
        for (size_t i = 0; i < steps.size(); ++i) (bif ? on : off)[i].push_back(steps[i]);
      }
    double step_n1 = 0;
    for (size_t i = 0; i < a.samples.size(); ++i) {
      const int n = a.samples[i];
      const double s_on = median(on[i]), s_off = median(off[i]);
      if (n == 1) step_n1 = s_on;
      char line[256];
      std::snprintf(line, sizeof line, "| %d | %d | %.2f | %.2f | %.1f | %.1f | %.2fx | %s |\n", depth, n, s_on * 1e3,
                    s_off * 1e3, n / s_on, n / s_off, s_off / s_on,
                    step_n1 > 0 ? (std::to_string(s_on / step_n1).substr(0, 4) + "x").c_str() : "-");
      std::fputs(line, stdout);
      std::fflush(stdout);
      md << line;
    }
  }
  std::ofstream(a.out) << md.str();
  std::printf("wrote %s\n", a.out.c_str());
  return 0;
}

}  // namespace
}  // namespace fathom

int main(int argc, char** argv) {
  try {
    return fathom::run(fathom::parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_samples: %s\n", e.what());
    return 1;
  }
}
