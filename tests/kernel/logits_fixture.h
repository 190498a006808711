#pragma once
// What the tests against transformers' logits share (test_cuda_rope_scaling.cpp,
// test_cuda_arch_fixtures.cpp): a fixture of tests/fixtures/<set>/ (scripts/make_fixtures.py), every
// position's logits of its prompts on a backend, the error measure, and patched copies of a fixture
// for what must be refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include <unistd.h>

#include "base/error.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/kv/block_allocator.h"
#include "engine/model/model.h"

namespace fathom::logits_fixture {

struct Fixture {
  std::string dir;  // ends with '/'
  nlohmann::json meta;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<float> logits;  // [rows of every prompt][vocab]
  int32_t vocab = 0;
  std::string path(const std::string& key) const { return dir + meta[key].get<std::string>(); }
};

// The tolerances both fixture tests state: logits as max|d| / max|ref| over rows (the f32 CPU
// backend; the CUDA backend, emulated, whose GEMMs take f16 inputs), RoPE frequencies relative.
constexpr double kCpuTol = 1e-4;
constexpr double kCudaTol = 2e-2;
constexpr double kFreqTol = 1e-6;

inline Fixture load(const std::string& dir, const std::string& name) {
  Fixture f;
  f.dir = dir;
  std::ifstream j(dir + name + ".json");
  EXPECT_TRUE(j.good()) << "missing " << dir << name << ".json (make fixtures)";
  f.meta = nlohmann::json::parse(j);
  f.vocab = f.meta["vocab"].get<int32_t>();
  size_t rows = 0;
  for (const auto& p : f.meta["prompts"]) {
    f.prompts.push_back(p.get<std::vector<int32_t>>());
    rows += f.prompts.back().size();
  }
  const std::string logits_path = f.path("logits");
  f.logits.resize(rows * f.vocab);
  std::ifstream l(logits_path, std::ios::binary);
  l.read(reinterpret_cast<char*>(f.logits.data()), static_cast<std::streamsize>(f.logits.size() * sizeof(float)));
  EXPECT_TRUE(l.good() && std::filesystem::file_size(logits_path) == f.logits.size() * sizeof(float))
      << logits_path << " is not " << rows << " rows of " << f.vocab;
  return f;
}

// f32 activations and KV, small blocks: the fixtures' models are tiny.
// Every layer's RoPE frequencies and cos/sin factor against transformers' (the fixture's
// hf_inv_freq and hf_attention_scaling), within kFreqTol.
inline void expect_rope_matches(const ModelConfig& c, const Fixture& f) {
  const auto want = f.meta["hf_inv_freq"].get<std::vector<double>>();
  for (const LayerConfig& layer : c.layers) {
    ASSERT_EQ(layer.rope_inv_freq.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(layer.rope_inv_freq[i] / want[i], 1.0, kFreqTol) << "pair " << i;
    EXPECT_NEAR(layer.rope_attn_factor, f.meta["hf_attention_scaling"].get<double>(), kFreqTol);
  }
}

inline ModelOptions options() {
  ModelOptions o;
  o.threads = 2;
  o.precision = cpu::Precision::kF32;
  o.kv_dtype = KvDtype::kF32;
  o.block_size = 16;
  o.kv_cache_bytes = 4 << 20;
  return o;
}

// Block table of a sequence of `tokens` tokens.
inline std::vector<int32_t> blocks_for(BlockAllocator& pool, int64_t tokens, int32_t block_size) {
  std::vector<int32_t> table;
  while (static_cast<int64_t>(table.size()) * block_size < tokens) table.push_back(pool.allocate());
  return table;
}

// Every position's logits of every prompt: one prompt at a time, in prefill chunks of `chunk`.
inline std::vector<float> run_prompts(Backend& backend, const Fixture& f, int32_t block_size, size_t chunk) {
  std::vector<float> all, logits;
  for (const std::vector<int32_t>& p : f.prompts) {
    BlockAllocator pool(backend.kv_blocks(), block_size);
    std::vector<int32_t> table = blocks_for(pool, static_cast<int64_t>(p.size()), block_size);
    for (size_t pos0 = 0; pos0 < p.size(); pos0 += chunk) {
      const size_t n = std::min(chunk, p.size() - pos0);
      BatchPlan plan;
      plan.seqs.push_back(SeqStep{std::span<const int32_t>(p.data() + pos0, n), static_cast<int32_t>(pos0), &table,
                                  LogitsWanted::kAll});
      backend.forward(plan, logits);
      EXPECT_EQ(logits.size(), n * f.vocab);
      all.insert(all.end(), logits.begin(), logits.end());
    }
  }
  return all;
}

// max over rows of max|got − want| / max|want|; prints the worst row.
inline double worst_row_error(const std::vector<float>& got, const std::vector<float>& want, int32_t vocab,
                              const std::string& what) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  size_t worst_row = 0;
  for (size_t r = 0; r * vocab < std::min(got.size(), want.size()); ++r) {
    double d = 0, scale = 0;
    for (int32_t v = 0; v < vocab; ++v) {
      const double a = got[r * vocab + v], b = want[r * vocab + v];
      d = std::max(d, std::isfinite(a) ? std::abs(a - b) : INFINITY);
      scale = std::max(scale, std::abs(b));
    }
    if (d / scale > worst || std::isnan(d)) worst = d / scale, worst_row = r;
  }
  std::printf("%-28s worst row %3zu: max|d| / max|ref| = %.3e\n", what.c_str(), worst_row, worst);
  return worst;
}

// A copy of dir/name with bytes overwritten in place by `to`, from `skip` bytes after the first
// occurrence of `from`, written to a temporary file.
inline std::string patched_copy(const std::string& dir, const std::string& name, const std::string& from,
                                const std::string& to, size_t skip = 0) {
  std::ifstream in(dir + name, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = bytes.find(from);
  EXPECT_NE(at, std::string::npos) << from << " not in " << name;
  if (at != std::string::npos) bytes.replace(at + skip, to.size(), to);
  const std::string path =
      (std::filesystem::temp_directory_path() / ("fathom_fixture_" + std::to_string(::getpid()) + "_" + name)).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// Model::load's error on `path` (then removed), or "(loaded)".
inline std::string load_error(const std::string& path) {
  std::string what = "(loaded)";
  try {
    Model::load(path);
  } catch (const Error& e) {
    what = e.what();
  }
  std::filesystem::remove(path);
  return what;
}

}  // namespace fathom::logits_fixture
