// Passkey retrieval on the CUDA backend, run on the CPU through kernels/cuda/emu, next to the
// CPU backend: does each policy find the same keys on both (issue 20's "same quality on the CUDA
// backend under emulation for a shortened passkey set")?
//
// Prompts: the JSON lines `eval/passkey_diagnose.py --spec-only` writes ({"name", "model", "ids",
// "key"}: passkey_eval.py's prompts and seeds, token ids from the server's tokenizer). Per prompt,
// one CPU prefill; its blocks are copied into the CUDA backend's storage (the same bytes), then
// dense, SparQ, HiP and SWA (kv_read_ratio --ratio, 1/8 by default, min_keys 0: sparse at every length, since the
// CUDA backend does not measure break-evens) each decode greedily --decode tokens on each
// backend in one batched plan per step, every sequence feeding back its own backend's token. A
// reply is correct when its first 5-digit number is the key (passkey_eval.py's rule).
// f32 activations on the CPU, f16 KV on both.
//
//   cuda_passkey --spec build/passkey_diagnose.jsonl [--decode 12] [--ratio 0.125] [--out FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/kv/block_allocator.h"
#include "engine/model/model.h"
#include "tests/kernel/cuda_backend_headers.h"
#include "tests/kernel/shared_prefill.h"

namespace fathom {
namespace {

constexpr int kPolicies = 4;
const PolicyKind kKinds[kPolicies] = {kDensePolicy, policy_kind("sparq"), policy_kind("hip"), policy_kind("alisa")};

struct Prompt {
  std::string name, model, key;
  std::vector<int32_t> ids;
};

int32_t argmax(const float* row, int32_t n) { return static_cast<int32_t>(std::max_element(row, row + n) - row); }

bool finds(const std::string& reply, const std::string& key) {
  std::smatch m;
  return std::regex_search(reply, m, std::regex("\\d{5}")) && m.str() == key;
}

struct Outcome {
  std::string reply[2][kPolicies];  // [cpu, cuda][policy]
  bool same_tokens[kPolicies] = {};
};

Outcome run_prompt(const Model& model, const Prompt& pr, int32_t n_decode, double ratio) {
  ModelOptions o;
  o.threads = 2;
  o.precision = cpu::Precision::kF32;
  o.kv_dtype = KvDtype::kF16;
  o.block_size = 16;
  const ModelConfig& c = model.config();
  const KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, o.block_size, o.kv_dtype, o.kv_transposed_k};
  const int32_t P = static_cast<int32_t>(pr.ids.size()), bs = o.block_size, full = P / bs;
  const int32_t per_seq = (P + n_decode + bs) / bs + 1;
  o.kv_cache_bytes = static_cast<int64_t>(layout.block_bytes()) * (per_seq * kPolicies + full + 2);
  CpuBackend cpu(model, o);
  std::unique_ptr<Backend> cuda = make_cuda_backend(model, o);
  BlockAllocator blocks(cpu.kv_blocks(), bs);
  const int32_t vocab = model.vocab();

  std::vector<float> logits;
  const std::vector<int32_t> prompt_table = testing::prefill_and_copy(cpu, *cuda, blocks, pr.ids, logits);
  const int32_t first = argmax(logits.data(), vocab);

  AttentionPolicy policy[kPolicies];
  std::vector<std::vector<int32_t>> tables(kPolicies);
  for (int i = 0; i < kPolicies; ++i) {
    policy[i].kind = kKinds[i];
    policy[i].min_keys = 0;
    policy[i].kv_read_ratio = ratio;
    tables[i].assign(prompt_table.begin(), prompt_table.begin() + full);
    tables[i].push_back(blocks.allocate());  // the partial block, copied (a fork's copy-on-write)
    cpu.copy_block(prompt_table[full], tables[i].back());
    cuda->copy_block(prompt_table[full], tables[i].back());
    while (static_cast<int32_t>(tables[i].size()) * bs < P + n_decode + 1) tables[i].push_back(blocks.allocate());
  }
  Backend* backend[2] = {&cpu, cuda.get()};
  std::vector<SeqPolicyState> state[2] = {std::vector<SeqPolicyState>(kPolicies), std::vector<SeqPolicyState>(kPolicies)};
  std::vector<int32_t> token[2] = {std::vector<int32_t>(kPolicies, first), std::vector<int32_t>(kPolicies, first)};
  std::vector<int32_t> generated[2][kPolicies];
  for (int32_t step = 0; step < n_decode; ++step) {
    for (int b = 0; b < 2; ++b) {
      BatchPlan plan;
      for (int i = 0; i < kPolicies; ++i) {
        generated[b][i].push_back(token[b][i]);
        plan.seqs.push_back(SeqStep{std::span<const int32_t>(&token[b][i], 1), P + step, &tables[i],
                                    LogitsWanted::kLast, &policy[i], &state[b][i]});
      }
      backend[b]->forward(plan, logits);
      for (int i = 0; i < kPolicies; ++i) token[b][i] = argmax(&logits[static_cast<size_t>(i) * vocab], vocab);
    }
  }
  Outcome out;
  for (int i = 0; i < kPolicies; ++i) {
    for (int b = 0; b < 2; ++b) out.reply[b][i] = model.tokenizer().decode(generated[b][i]);
    out.same_tokens[i] = generated[0][i] == generated[1][i];
  }
  return out;
}

}  // namespace
}  // namespace fathom

int main(int argc, char** argv) {
  using namespace fathom;
  std::string spec, out_path;
  int32_t n_decode = 12;
  double ratio = 0.125;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--spec" && i + 1 < argc) spec = argv[++i];
    else if (a == "--decode" && i + 1 < argc) n_decode = std::atoi(argv[++i]);
    else if (a == "--out" && i + 1 < argc) out_path = argv[++i];
    else if (a == "--ratio" && i + 1 < argc) ratio = std::atof(argv[++i]);
  }
  if (!(ratio > 0 && ratio <= 1)) {
    std::fprintf(stderr, "cuda_passkey: --ratio must be in (0, 1]\n");
    return 2;
  }
  if (spec.empty()) {
    std::fprintf(stderr, "usage: cuda_passkey --spec FILE.jsonl [--decode N] [--ratio X] [--out FILE]\n");
    return 2;
  }
  try {
    std::vector<Prompt> prompts;
    std::ifstream in(spec);
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      const nlohmann::json j = nlohmann::json::parse(line);
      prompts.push_back(Prompt{j.at("name"), j.at("model"), j.at("key"), j.at("ids").get<std::vector<int32_t>>()});
    }
    std::map<std::string, std::unique_ptr<Model>> models;
    std::ostringstream md;
    md << "# Passkey retrieval on the CUDA backend under emulation, next to the CPU backend\n\n"
       << "Generated by `build/cuda_passkey` (eval/cuda_passkey.cpp) from `eval/passkey_diagnose.py --spec-only` "
          "prompts: kv_read_ratio " << ratio << ", min_keys 0, greedy, " << n_decode << " tokens. Cells: key found on CPU / CUDA; "
          "`=` when the two backends generated the same tokens.\n\n"
       << "| prompt | prompt tokens | dense | sparq | hip | swa | seconds |\n|---|---|---|---|---|---|---|\n";
    int found[2][kPolicies] = {}, same[kPolicies] = {};
    for (const Prompt& pr : prompts) {
      auto& m = models[pr.model];
      if (!m) m = Model::load(pr.model);
      const auto t0 = std::chrono::steady_clock::now();
      const Outcome o = run_prompt(*m, pr, n_decode, ratio);
      const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      md << "| " << pr.name << " | " << pr.ids.size();
      for (int i = 0; i < kPolicies; ++i) {
        const bool a = finds(o.reply[0][i], pr.key), b = finds(o.reply[1][i], pr.key);
        found[0][i] += a;
        found[1][i] += b;
        same[i] += o.same_tokens[i];
        md << " | " << (a ? "yes" : "no") << " / " << (b ? "yes" : "no") << (o.same_tokens[i] ? " =" : "");
      }
      char tail[32];
      std::snprintf(tail, sizeof tail, " | %.0f |\n", secs);
      md << tail;
      std::fprintf(stderr, "%s: %.0f s\n", pr.name.c_str(), secs);
    }
    md << "| **found (CPU / CUDA), same tokens** | |";
    for (int i = 0; i < kPolicies; ++i)
      md << " " << found[0][i] << " / " << found[1][i] << ", " << same[i] << " of " << prompts.size() << " |";
    md << " |\n";
    std::fputs(md.str().c_str(), stdout);
    if (!out_path.empty()) std::ofstream(out_path) << md.str();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_passkey: %s\n", e.what());
    return 1;
  }
  return 0;
}
