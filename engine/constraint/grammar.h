#pragma once
// Grammar-constrained decoding over xgrammar's C++ core (the engine vLLM, SGLang and TensorRT-LLM
// use; built from its PyPI sdist by scripts/setup_xgrammar.sh). A ConstraintCompiler holds the
// model's vocabulary once and compiles OutputConstraints (JSON, JSON Schema, EBNF, tagged JSON),
// caching them by text within a byte bound (xgrammar's own cache, unbounded, is off); each sequence runs its own ConstraintMatcher: before a token is sampled,
// mask_logits() sets every token that cannot continue a match to -inf; accept() advances it.
// xgrammar stays behind this header (the rest of the engine sees only these classes).
//
// Compiling costs time a client controls (tens of milliseconds per anyOf alternative over a 49k
// vocabulary; "[a-z]{10000}" took 28 s here) and cannot be interrupted. So compilations run on
// the compiler's own thread, a bounded number at once, and a caller waits for one only until a
// deadline: the request then fails (400), and the compilation goes on and is cached, so the same
// constraint sent again is served. Requests without a constraint never wait for any of it.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <list>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/request.h"

namespace fathom {

class Tokenizer;
struct CompiledConstraint;  // xgrammar's compiled grammar, shared by every sequence using it

// compile() refused: as many compilations as allowed are queued or running (HTTP 429).
class ConstraintQueueFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class ConstraintCompiler {
 public:
  struct Limits {
    std::chrono::milliseconds deadline{10000};  // how long compile() waits for a compilation
    int32_t max_compiling = 4;                  // compilations queued or running at once
    // Compiled constraints kept for reuse, by their memory (xgrammar's MemorySizeBytes: mostly
    // per-state token masks over the vocabulary); the least recently used go first. A client
    // sending endless distinct schemas cannot grow it past this.
    int64_t max_cache_bytes = int64_t{256} << 20;
  };
  // `vocab_size`: the model's logit rows (may exceed the tokenizer's pieces).
  ConstraintCompiler(const Tokenizer& tokenizer, int32_t vocab_size, Limits limits);
  ConstraintCompiler(const Tokenizer& tokenizer, int32_t vocab_size) : ConstraintCompiler(tokenizer, vocab_size, Limits{}) {}
  ~ConstraintCompiler();  // waits for the compilation under way, drops the queued ones
  // Throws fathom::Error naming the problem for an invalid or unsupported schema / grammar, or one
  // that did not compile within the deadline; ConstraintQueueFull when max_compiling are under way.
  std::shared_ptr<const CompiledConstraint> compile(const OutputConstraint& constraint);
  // What the reuse cache holds now: its entries and their bytes.
  size_t cached_count();
  int64_t cached_bytes();

 private:
  using Result = std::shared_future<std::shared_ptr<const CompiledConstraint>>;
  struct Job {
    std::string key;
    OutputConstraint constraint;
    std::promise<std::shared_ptr<const CompiledConstraint>> done;
  };
  // A cached compilation, and where its key is in the use order (front: least recently used).
  struct Cached {
    std::shared_ptr<const CompiledConstraint> compiled;
    int64_t bytes = 0;
    std::list<std::string>::iterator use;
  };
  std::shared_ptr<const CompiledConstraint> compile_now(const OutputConstraint& constraint);  // on worker_
  void work();
  void cache_locked(const std::string& key, std::shared_ptr<const CompiledConstraint> compiled);  // mutex_ held

  struct Impl;
  std::unique_ptr<Impl> impl_;
  const Limits limits_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::unordered_map<std::string, Cached> cache_;
  std::list<std::string> use_order_;  // cache_'s keys, least recently used first
  int64_t cache_bytes_ = 0;
  std::unordered_map<std::string, Result> compiling_;  // queued or running, by key
  std::deque<Job> queue_;
  bool stop_ = false;
  std::thread worker_;  // last: starts after everything it reads
};

class ConstraintMatcher {
 public:
  // `thinking`: the reasoning span the grammar leaves free (engine/request.h ThinkingSpan).
  explicit ConstraintMatcher(std::shared_ptr<const CompiledConstraint> compiled, ThinkingSpan thinking = {});
  ~ConstraintMatcher();
  // Computes the next position's allowed-token mask from the tokens accepted so far; needs no
  // logits, so the scheduler runs it on another thread while the forward pass computes them.
  void prepare_mask(int32_t vocab_size);
  // logits: (vocab_size) of the next position; disallowed tokens become -inf. Uses the prepared
  // mask when prepare_mask() ran since the last accept(), else computes it now.
  void mask_logits(float* logits, int32_t vocab_size);
  // Advances past `token`; false when the grammar does not allow it (a sampler bug).
  bool accept(int32_t token);
  // The output is complete: the grammar matched and only a stop token could follow.
  bool complete() const;
  // Inside the thinking span: every token is allowed and the grammar waits.
  bool thinking() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fathom
