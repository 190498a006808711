// Prefill and decode speed of one model through the engine API, judged against the memory
// bandwidth roofline.
//
// For each context depth D and thread count t:
//   prefill  D tokens of natural-language text in forward passes of at most --chunk tokens on one
//            block table (timed as a whole); tokens/s and achieved GFLOP/s.
//   decode   --warmup-tokens untimed, then --decode-tokens timed single-token forward passes,
//            each feeding back the greedy argmax; median and mean time per token.
// Decode is bandwidth bound: every token reads all weight matrices (output included), one
// embedding row, and the K and V of every cached position each layer attends to:
//   bytes/token = weights.matrix_bytes + embedding row
//               + Σ_layers min(ctx, window or ∞) × n_kv_heads × head_dim × 2 × bytes(kv dtype)
//   bound tok/s = bandwidth(t) / bytes/token, fraction = measured tok/s / bound,
// with ctx = the positions the step attends to (depth + tokens decoded before it + itself),
// averaged over the timed steps, and bandwidth(t) the best read bandwidth bench_bandwidth
// measured at t threads (--bandwidth-json).
// Prefill FLOPs (only the work a causal model must do; no roofline, compute bound):
//   2 × (parameters of the layer matrices) per token
//   + Σ_layers Σ_tokens 4 × n_heads × head_dim × min(pos + 1, window)   (QKᵀ and PV)
//   + 2 × vocab × dim once (logits of the last token).
//
//   bench_decode --model PATH [--threads 1,2] [--depths 0,1024,4096] [--decode-tokens 32]
//                [--bandwidth-json FILE] [--json OUT] [--kv-dtype f16] [--precision q8|f32] [--no-pack]
//                [--chunk 512] [--block-size 16] [--warmup-tokens 2] [--text FILE] [--share-prefill-from D]
//                [--attention dense,sparq,hip,swa] [--kv-read-ratio 0.125] [--hip-refresh R] [--hip-per-kv-head 0|1]
//                [--min-keys N|measured] [--batch B]
// --batch B: every decode step runs B sequences of the same depth in one forward pass (the
// server's continuous batching): the prefill is copied into B distinct block tables, so the
// weights are read once a step and B caches' KV. The ms figures are per step, tok/s is B / step
// time, and bytes per token are (weights + B embedding rows + the KV all B sequences read) / B.
// --min-keys: sparse steps shorter than N keys run densely; default "measured", the engine's
// measured break-even (engine/backend/cpu/break_even.h); 0 times the sparse kernels at every depth.
// --attention: decode policies timed one after the other from the same prefilled cache; KV bytes
// per token are what the kernels report reading (fathom_kv_read_bytes_total's source).
// --share-prefill-from D: for depths >= D, prefill once on the largest thread count and copy its
// KV cache to the other thread counts' models (they report no prefill figure). Saves the
// slow single-thread prefill of long contexts; decode is unaffected.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "bench/cli.h"
#include "engine/attention/policies/hip.h"
#include "engine/batch_plan.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/kv/block_allocator.h"
#include "engine/kv/block_table.h"
#include "engine/model/model.h"
#include "engine/model/gguf.h"
#include "engine/model/hf_dir.h"

namespace fathom {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Prefill text when no --text is given: plain English prose, repeated to reach the depth.
constexpr const char* kPassage =
    "The lighthouse keeper climbed the narrow stairs every evening before the sun went down. "
    "He carried a small can of oil, a clean cloth, and a notebook in which he wrote the state of "
    "the weather, the ships he had seen during the day, and anything else that seemed worth "
    "remembering. Most entries were short: wind from the west, two fishing boats, a grey heron on "
    "the rocks. Some were longer. On the night of the great storm he filled four pages, describing "
    "how the waves broke over the lower gallery and how the light kept turning while the whole tower "
    "trembled. In the spring the village school sent its children to visit him. They asked how far "
    "the beam could reach, why the glass was shaped like a beehive, and whether he ever felt lonely. "
    "He told them that the beam could be seen from twenty miles away on a clear night, that the rings "
    "of glass bent the light into a single bright band, and that a person who watches the sea is "
    "never entirely alone, because the sea is always busy with something. When the children had gone "
    "he sat by the window, opened the notebook, and wrote that the day had been calm and the visitors "
    "curious, and that tomorrow he would paint the railing before the autumn rains arrived. ";

struct Args {
  std::string model;
  std::vector<int> threads = {1, 2};
  std::vector<int32_t> depths = {0, 1024, 4096};
  int decode_tokens = 32;
  int warmup_tokens = 2;
  int32_t chunk = 512;
  int32_t block_size = 16;  // KV block tokens
  int32_t share_prefill_from = -1;  // -1: never
  std::string bandwidth_json, json_out, text_file;
  KvDtype kv_dtype = KvDtype::kF16;
  cpu::Precision precision = cpu::Precision::kQ8;
  bool pack = true;  // ModelOptions::pack_weights (--no-pack: the kernels read the stored layout)
  std::vector<std::string> attention = {"dense"};  // decode policies, each timed from the same prefill
  double kv_read_ratio = 0.125;
  int hip_refresh = 0;  // 0: the policy's default
  int hip_per_kv_head = -1;  // -1: the policy's default
  int min_keys = AttentionPolicy::kMeasuredBreakEven;  // --min-keys N|measured: as the server's default
  int batch = 1;  // sequences decoded together, each with its own copy of the prefill's KV
};

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(k + " needs a value");
      return argv[++i];
    };
    if (k == "--model") a.model = value();
    else if (k == "--threads") {
      a.threads = bench::parse_int_list<int>(value(), "--threads", 1, 1024);
    } else if (k == "--depths") {
      a.depths = bench::parse_int_list<int32_t>(value(), "--depths", 0, 1 << 24);
    } else if (k == "--decode-tokens") a.decode_tokens = bench::parse_int<int>(value(), "--decode-tokens", 1, 100000);
    else if (k == "--warmup-tokens") a.warmup_tokens = bench::parse_int<int>(value(), "--warmup-tokens", 0, 1000);
    else if (k == "--block-size") a.block_size = bench::parse_int<int32_t>(value(), "--block-size", 1, 1024);
    else if (k == "--batch") a.batch = bench::parse_int<int>(value(), "--batch", 1, 256);
    else if (k == "--chunk") a.chunk = bench::parse_int<int32_t>(value(), "--chunk", 1, 1 << 16);
    else if (k == "--share-prefill-from")
      a.share_prefill_from = bench::parse_int<int32_t>(value(), "--share-prefill-from", 0, 1 << 24);
    else if (k == "--bandwidth-json") a.bandwidth_json = value();
    else if (k == "--json") a.json_out = value();
    else if (k == "--text") a.text_file = value();
    else if (k == "--attention") {
      a.attention.clear();
      for (const std::string& item : bench::split_list(value())) {
        policy_kind(item);  // throws on an unknown name
        a.attention.push_back(item);
      }
    } else if (k == "--kv-read-ratio") {
      a.kv_read_ratio = std::strtod(value().c_str(), nullptr);
    } else if (k == "--hip-per-kv-head") {
      a.hip_per_kv_head = std::atoi(value().c_str()) != 0;
    } else if (k == "--hip-refresh") {
      a.hip_refresh = std::atoi(value().c_str());
    } else if (k == "--min-keys") {
      const std::string v = value();
      a.min_keys = v == "measured" ? AttentionPolicy::kMeasuredBreakEven : std::atoi(v.c_str());
    }
    else if (k == "--kv-dtype") a.kv_dtype = parse_kv_dtype(value());
    else if (k == "--no-pack") a.pack = false;
    else if (k == "--precision") {
      const std::string v = value();
      if (v == "q8") a.precision = cpu::Precision::kQ8;
      else if (v == "f32") a.precision = cpu::Precision::kF32;
      else throw Error("--precision must be q8 or f32, got '" + v + "'");
    } else throw Error("unknown argument '" + k + "'");
  }
  if (a.model.empty()) throw Error("--model PATH is required");
  return a;
}

// Best read bandwidth per thread count, GB/s, from bench_bandwidth --json.
std::map<int, double> load_bandwidth(const std::string& path) {
  std::map<int, double> bw;
  if (path.empty()) return bw;
  std::ifstream in(path);
  if (!in) throw Error("cannot read " + path);
  const json j = json::parse(in);
  for (const json& r : j.at("results")) bw[r.at("threads").get<int>()] = r.at("best_gbps").get<double>();
  return bw;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `count` token ids of natural text: BOS (when the vocabulary wants one), then the text's tokens
// repeated as often as needed.
std::vector<int32_t> prompt_tokens(const Tokenizer& tok, const std::string& text, size_t count) {
  std::vector<int32_t> out;
  if (tok.add_bos() && tok.bos_id() >= 0) out.push_back(tok.bos_id());
  const std::vector<int32_t> piece = tok.encode(text, EncodeOptions{false, false});
  if (piece.empty()) throw Error("the prefill text encodes to no tokens");
  while (out.size() < count) out.insert(out.end(), piece.begin(), piece.end());
  out.resize(count);
  return out;
}

int32_t argmax(const float* v, int32_t n) { return static_cast<int32_t>(std::max_element(v, v + n) - v); }

int64_t layer_matrix_params(const ModelWeights& w) {
  int64_t p = 0;
  for (const LayerWeights& L : w.layers)
    for (const WeightMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) p += m->rows * m->cols;
  return p;
}

double prefill_flops(const ModelConfig& c, const ModelWeights& w, int64_t tokens) {
  double attn = 0;
  for (const LayerConfig& l : c.layers) {
    // Σ_{pos < tokens} min(pos + 1, window), in closed form.
    const int64_t full = l.window > 0 ? std::min<int64_t>(tokens, l.window) : tokens;
    const double ramp = static_cast<double>(full) * (full + 1) / 2;
    attn += ramp + static_cast<double>(tokens - full) * (l.window > 0 ? l.window : 0);
  }
  return 2.0 * static_cast<double>(layer_matrix_params(w)) * tokens + 4.0 * c.n_heads * c.head_dim * attn +
         2.0 * static_cast<double>(w.output.rows) * w.output.cols;
}

// Runs `tokens` as prefill at positions [0, tokens.size()) in chunks; returns the last logits row.
std::vector<float> prefill(Backend& m, const BlockTable& table, const std::vector<int32_t>& tokens, int32_t chunk) {
  std::vector<float> logits;
  const size_t n = tokens.size();
  for (size_t p = 0; p < n; p += chunk) {
    const size_t len = std::min<size_t>(chunk, n - p);
    BatchPlan plan;
    plan.seqs.push_back(SeqStep{std::span<const int32_t>(tokens.data() + p, len), static_cast<int32_t>(p),
                                &table.blocks(), p + len == n ? LogitsWanted::kLast : LogitsWanted::kNone});
    m.forward(plan, logits);
  }
  return logits;
}

// Copies the KV of positions [0, tokens) from one model's blocks to another's (same layout):
// whole blocks across every layer and plane, as a swap to the host tier and back would.
void copy_kv(Backend& src, const BlockTable& from, Backend& dst, const BlockTable& to, int32_t tokens) {
  const KvLayout& l = src.kv_layout();
  FATHOM_CHECK(src.block_bytes() == dst.block_bytes() && l.block_size == dst.kv_layout().block_size);
  std::vector<std::byte> block(src.block_bytes());
  const int32_t blocks = (tokens + l.block_size - 1) / l.block_size;
  for (int32_t b = 0; b < blocks; ++b) {
    src.read_block(from.blocks()[b], block.data());
    dst.write_block(to.blocks()[b], block.data());
  }
}

struct Decode {
  std::vector<double> seconds;  // per timed token
  std::vector<int32_t> generated;
  double kv_bytes = 0;          // mean over the timed steps
};

// Greedy decode from `depth` with `policy`, one step for every table at once (each its own
// sequence and policy state); the KV bytes are what the attention kernels report reading
// (StepStats::kv_read, from Backend::forward), summed over the tables, so sparse policies are measured, not
// modelled. `generated` is the first sequence's.
Decode decode(Backend& m, const std::vector<std::unique_ptr<BlockTable>>& tables, int32_t depth, int32_t first,
              const Args& a, const AttentionPolicy& policy) {
  Decode d;
  std::vector<float> logits;
  const size_t batch = tables.size();
  std::vector<SeqPolicyState> states(batch);
  std::vector<int32_t> tokens(batch, first);
  const int32_t vocab = m.model().vocab();
  for (int i = 0; i < a.warmup_tokens + a.decode_tokens; ++i) {
    const int32_t pos = depth + i;
    BatchPlan plan;
    for (size_t b = 0; b < batch; ++b)
      plan.seqs.push_back(SeqStep{std::span<const int32_t>(&tokens[b], 1), pos, &tables[b]->blocks(),
                                  LogitsWanted::kLast, &policy, &states[b]});
    const auto t0 = Clock::now();
    const KvReadBytes read = m.forward(plan, logits).kv_read;
    const double s = seconds_since(t0);
    for (size_t b = 0; b < batch; ++b) tokens[b] = argmax(logits.data() + b * vocab, vocab);
    d.generated.push_back(tokens[0]);
    if (i >= a.warmup_tokens) {
      d.seconds.push_back(s);
      d.kv_bytes += static_cast<double>(std::accumulate(read.begin(), read.end(), int64_t{0})) / a.decode_tokens;
    }
  }
  return d;
}

// The blocks a decode from `depth` writes, saved so every policy starts from the same cache
// (appending again over a written slot would double-count the running V sums).
struct DecodeSnapshot {
  std::vector<std::vector<std::byte>> blocks;
  void save(Backend& m, const BlockTable& t, int32_t depth) {
    const KvLayout& l = m.kv_layout();
    blocks.clear();
    for (size_t b = depth / l.block_size; b < t.blocks().size(); ++b) {
      blocks.emplace_back(m.block_bytes());
      m.read_block(t.blocks()[b], blocks.back().data());
    }
  }
  void restore(Backend& m, const BlockTable& t, int32_t depth) const {
    const size_t first = depth / m.kv_layout().block_size;
    for (size_t i = 0; i < blocks.size(); ++i) m.write_block(t.blocks()[first + i], blocks[i].data());
  }
};

// The q-quantile of v (the element at rank ⌊q·(n − 1)⌋ of the sorted values).
double quantile(std::vector<double> v, double q) {
  const size_t k = static_cast<size_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), v.begin() + k, v.end());
  return v[k];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct Runner {
  int threads;
  std::unique_ptr<Model> model;
  std::unique_ptr<CpuBackend> backend;
  std::unique_ptr<BlockAllocator> allocator;
};

std::string model_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.size() > 5 && base.ends_with(".gguf")) base.resize(base.size() - 5);
  return base;
}

json optional_number(std::optional<double> v) { return v ? json(*v) : json(nullptr); }

int run(const Args& a) {
  const std::map<int, double> bandwidth = load_bandwidth(a.bandwidth_json);
  const int32_t max_depth = *std::max_element(a.depths.begin(), a.depths.end());
  const int32_t steps = a.warmup_tokens + a.decode_tokens;

  // KV pool sized for the deepest cell (not the model's whole context): one pool per thread count.
  const ModelConfig config = ModelConfig::from_gguf(*open_model_file(a.model));
  if (static_cast<int64_t>(max_depth) + steps > config.context_length)
    throw Error("depth " + std::to_string(max_depth) + " + " + std::to_string(steps) + " decode steps exceeds the " +
                std::to_string(config.context_length) + "-token context of " + a.model);
  ModelOptions opts;
  opts.kv_dtype = a.kv_dtype;
  opts.block_size = a.block_size;
  opts.precision = a.precision;
  opts.pack_weights = a.pack;
  const KvLayout layout{config.n_layers, config.n_kv_heads, config.head_dim, opts.block_size, opts.kv_dtype,
                        opts.kv_transposed_k};
  opts.kv_cache_bytes =
      static_cast<int64_t>(layout.block_bytes()) * a.batch * ((max_depth + steps) / opts.block_size + 2);

  std::vector<Runner> runners;
  for (int t : a.threads) {
    opts.threads = t;
    Runner r{t, Model::load(a.model), nullptr, nullptr};
    r.backend = std::make_unique<CpuBackend>(*r.model, opts);
    r.allocator = std::make_unique<BlockAllocator>(r.backend->kv_blocks(), r.backend->kv_layout().block_size);
    runners.push_back(std::move(r));
    // Warm-up pass: faults the mapped weights in and sizes the activation buffers.
    const Model& m = *runners.back().model;
    BlockTable table(*runners.back().allocator);
    std::vector<int32_t> warm(16, m.tokenizer().bos_id() >= 0 ? m.tokenizer().bos_id() : 0);
    FATHOM_CHECK(table.reserve(static_cast<int32_t>(warm.size())));
    prefill(*runners.back().backend, table, warm, a.chunk);
  }
  const Model& m0 = *runners.front().model;
  const ModelConfig& c = m0.config();
  const ModelWeights& w = m0.weights();
  const double embed_row = static_cast<double>(ggml_row_size(w.token_embd.type, c.dim));
  const std::string text = a.text_file.empty() ? std::string(kPassage) : read_file(a.text_file);
  const std::vector<int32_t> tokens = prompt_tokens(m0.tokenizer(), text, std::max<int32_t>(max_depth, 1));
  const std::string name = model_name(a.model);
  const char* prec = a.precision == cpu::Precision::kQ8 ? "q8" : "f32";

  json cells = json::array();
  for (int32_t depth : a.depths) {
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + depth);
    const bool share = a.share_prefill_from >= 0 && depth >= a.share_prefill_from && depth > 0 && runners.size() > 1;
    const size_t src = static_cast<size_t>(
        std::max_element(runners.begin(), runners.end(), [](const Runner& x, const Runner& y) { return x.threads < y.threads; }) -
        runners.begin());
    // Prefill every runner (or only `src` when shared), then decode each; tables live until the depth is done.
    std::vector<std::vector<std::unique_ptr<BlockTable>>> tables(runners.size());  // [runner][sequence]
    std::vector<std::optional<double>> prefill_s(runners.size());
    std::vector<int32_t> first(runners.size(), tokens.front());  // first decode input
    for (size_t r = 0; r < runners.size(); ++r) {
      for (int b = 0; b < a.batch; ++b) {
        tables[r].push_back(std::make_unique<BlockTable>(*runners[r].allocator));
        if (!tables[r].back()->reserve(depth + steps)) throw Error("KV pool too small (internal sizing error)");
      }
    }
    if (depth > 0) {
      for (size_t r = 0; r < runners.size(); ++r) {
        if (share && r != src) continue;
        const auto t0 = Clock::now();
        const std::vector<float> logits = prefill(*runners[r].backend, *tables[r][0], prompt, a.chunk);
        prefill_s[r] = seconds_since(t0);
        first[r] = argmax(logits.data(), runners[r].model->vocab());
      }
      if (share)
        for (size_t r = 0; r < runners.size(); ++r)
          if (r != src) {
            copy_kv(*runners[src].backend, *tables[src][0], *runners[r].backend, *tables[r][0], depth);
            first[r] = first[src];
          }
      for (size_t r = 0; r < runners.size(); ++r)  // --batch: every further sequence a copy of the first
        for (size_t b = 1; b < tables[r].size(); ++b)
          copy_kv(*runners[r].backend, *tables[r][0], *runners[r].backend, *tables[r][b], depth);
    }
    std::vector<std::vector<DecodeSnapshot>> saved(runners.size(), std::vector<DecodeSnapshot>(a.batch));
    for (size_t cell = 0; cell < runners.size() * a.attention.size(); ++cell) {
      const size_t r = cell / a.attention.size(), pi = cell % a.attention.size();
      const int t = runners[r].threads;
      Backend& m = *runners[r].backend;
      AttentionPolicy policy;
      policy.kind = policy_kind(a.attention[pi]);
      policy.kv_read_ratio = policy.kind == kDensePolicy ? 1.0 : a.kv_read_ratio;
      if (a.hip_refresh > 0) policy.set(hip::kRefresh, a.hip_refresh);
      if (a.hip_per_kv_head >= 0) policy.set(hip::kPerKvHead, a.hip_per_kv_head != 0);
      policy.min_keys = a.min_keys;
      for (int b = 0; b < a.batch; ++b) {
        if (pi == 0) saved[r][b].save(m, *tables[r][b], depth);
        else saved[r][b].restore(m, *tables[r][b], depth);
      }
      const Decode d = decode(m, tables[r], depth, first[r], a, policy);
      const char* pname = policy_name(policy.kind);
      const double med = median(d.seconds);
      const double mean = std::accumulate(d.seconds.begin(), d.seconds.end(), 0.0) / d.seconds.size();
      const double p90 = quantile(d.seconds, 0.9), slowest = *std::max_element(d.seconds.begin(), d.seconds.end());
      // A step reads the weights once, and an embedding row and its KV per sequence; per token is
      // that over the batch.
      const double bytes = (static_cast<double>(w.matrix_bytes) + a.batch * embed_row + d.kv_bytes) / a.batch;
      const auto bw = bandwidth.find(t);
      const std::optional<double> bound =
          bw == bandwidth.end() ? std::nullopt : std::optional<double>(bw->second * 1e9 / bytes);
      const double tok_s = a.batch / med;
      std::optional<double> pf_tok_s, pf_gflops;
      if (prefill_s[r]) {
        pf_tok_s = depth / *prefill_s[r];
        pf_gflops = prefill_flops(c, w, depth) / *prefill_s[r] / 1e9;
      }

      char pf[160] = "prefill -";
      if (pf_tok_s) std::snprintf(pf, sizeof pf, "prefill %7.1f tok/s (%5.1f GFLOP/s, %.2f s)", *pf_tok_s, *pf_gflops, *prefill_s[r]);
      else if (depth > 0) std::snprintf(pf, sizeof pf, "prefill shared from %d threads", runners[src].threads);
      char bd[96] = "bound -";
      if (bound) std::snprintf(bd, sizeof bd, "bound %6.1f tok/s @ %.1f GB/s = %4.1f%%", *bound, bw->second, 100 * tok_s / *bound);
      std::printf("%s %s t=%d depth=%-6d %s | %s decode %6.1f tok/s (median %.2f ms, mean %.2f ms, p90 %.2f ms, max %.2f ms) | %.1f MB/token | %s\n",
                  name.c_str(), prec, t, depth, pf, pname, tok_s, med * 1e3, mean * 1e3, p90 * 1e3, slowest * 1e3,
                  bytes / 1e6, bd);
      if (r == 0 && depth == a.depths.front())
        std::printf("  greedy continuation: %s\n", json(m.model().tokenizer().decode(d.generated)).dump().c_str());
      std::fflush(stdout);

      cells.push_back({{"threads", t},
                       {"attention", pname},
                       {"depth", depth},
                       {"prefill_tokens", depth},
                       {"prefill_seconds", optional_number(prefill_s[r])},
                       {"prefill_tok_s", optional_number(pf_tok_s)},
                       {"prefill_gflops", optional_number(pf_gflops)},
                       {"prefill_shared_from_threads", prefill_s[r] || depth == 0 ? json(nullptr) : json(runners[src].threads)},
                       {"decode_tokens", a.decode_tokens},
                       {"batch", a.batch},
                       {"decode_ms_median", med * 1e3},
                       {"decode_ms_mean", mean * 1e3},
                       {"decode_ms_min", *std::min_element(d.seconds.begin(), d.seconds.end()) * 1e3},
                       {"decode_ms_max", slowest * 1e3},
                       {"decode_ms_p90", p90 * 1e3},
                       {"decode_tok_s", tok_s},
                       {"decode_tok_s_mean", 1.0 / mean},
                       {"bytes_per_token", bytes},
                       {"bytes_weights", w.matrix_bytes},
                       {"bytes_embedding_row", embed_row},
                       {"bytes_kv", d.kv_bytes / a.batch},
                       {"bandwidth_gbps", bw == bandwidth.end() ? json(nullptr) : json(bw->second)},
                       {"bound_tok_s", optional_number(bound)},
                       {"fraction_of_bound", bound ? json(tok_s / *bound) : json(nullptr)},
                       {"greedy_text", m.model().tokenizer().decode(d.generated)}});
    }
  }

  if (!a.json_out.empty()) {
    json layers = json::array();
    for (const LayerConfig& l : c.layers) layers.push_back(l.window);
    json bw = json::object();
    for (const auto& [t, g] : bandwidth) bw[std::to_string(t)] = g;
    const json j = {
        {"benchmark", "decode"},
        {"model", name},
        {"model_path", a.model},
        {"arch", c.arch_name},
        {"config",
         {{"n_layers", c.n_layers}, {"dim", c.dim}, {"n_heads", c.n_heads}, {"n_kv_heads", c.n_kv_heads},
          {"head_dim", c.head_dim}, {"ffn_dim", c.ffn_dim}, {"vocab", m0.vocab()}, {"context_length", c.context_length},
          {"layer_windows", layers}}},
        {"weights",
         {{"matrix_bytes", w.matrix_bytes}, {"layer_matrix_params", layer_matrix_params(w)},
          {"embedding_type", ggml_type_name(w.token_embd.type)}, {"output_type", ggml_type_name(w.output.type)}}},
        {"options",
         {{"kv_dtype", kv_dtype_name(a.kv_dtype)}, {"precision", prec}, {"block_size", opts.block_size},
          {"chunk", a.chunk}, {"decode_tokens", a.decode_tokens}, {"warmup_tokens", a.warmup_tokens},
          {"share_prefill_from", a.share_prefill_from < 0 ? json(nullptr) : json(a.share_prefill_from)},
          {"text", a.text_file.empty() ? "built-in passage" : a.text_file}}},
        {"bandwidth_gbps", bw},
        {"bandwidth_json", a.bandwidth_json},
        {"formulas",
         {{"bytes_per_token", "matrix_bytes + embedding row + sum_layers min(ctx, window) * n_kv_heads * head_dim * 2 * "
                              "kv_bytes, ctx averaged over timed steps"},
          {"bound_tok_s", "bandwidth_gbps(threads) * 1e9 / bytes_per_token"},
          {"prefill_flops", "2 * layer_matrix_params * D + sum_layers sum_pos 4 * n_heads * head_dim * min(pos+1, "
                            "window) + 2 * vocab * dim"}}},
        {"cells", cells}};
    std::ofstream out(a.json_out);
    if (!out) throw Error("cannot write " + a.json_out);
    out << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace fathom

int main(int argc, char** argv) {
  try {
    return fathom::run(fathom::parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode: %s\n", e.what());
    return 1;
  }
}
