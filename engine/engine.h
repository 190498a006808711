#pragma once
// The serving engine: thread-safe submit() from any thread; one scheduler thread drives the
// model with iteration-level continuous batching (see scheduler.h). Each request gets a
// RequestHandle whose stream yields StreamEvents until every choice has finished.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/metrics.h"
#include "engine/request.h"

namespace fathom {

class Backend;
class ConstraintCompiler;
class DraftModel;
class Model;
class Scheduler;
struct RequestState;

struct SchedulerConfig {
  int32_t max_num_seqs = 64;          // sequences in one step
  int32_t max_batched_tokens = 512;   // tokens (decode + prefill chunks) in one step
  int32_t max_queue = 256;            // requests beyond max_num_seqs before submit() refuses (HTTP 429)
  int64_t host_kv_bytes = 0;          // host tier of the KV cache (docs/tiered_kv.md); 0: none
  // ALISA's cache-or-recompute over the two tiers (docs/tiered_kv.md): kAuto drops a running
  // sequence's oldest blocks when both tiers are full (each step then computes them again) where
  // that recomputes fewer tokens than a preemption, and drops old blocks from the host tier when
  // the start-up measurement finds recomputing a token cheaper than moving its K/V; kAlways drops
  // them from the host tier unconditionally; kOff only preempts.
  enum class Recompute { kAuto, kOff, kAlways };
  Recompute recompute = Recompute::kAuto;
  bool prefix_caching = true;
  // Bifurcated attention for decode steps that share leading KV blocks (n > 1 choices, prefix
  // cache hits): used when a group has at least `bifurcated_min_seqs` sequences sharing at least
  // `bifurcated_min_prefix` tokens (the break-even measured by bench/bench_bifurcated).
  bool bifurcated = true;
  int32_t bifurcated_min_seqs = 4;
  int32_t bifurcated_min_prefix = 256;
  // Speculative decoding (Request::speculative): the most draft tokens one sequence's step
  // verifies (its step computes 1 + that many positions). 0: no request speculates.
  int32_t max_draft_tokens = 4;
  // The sparse drafter (Speculation::kSparse) reads this fraction of the KV cache per draft step,
  // through the request's sparse policy (auto when the request decodes densely).
  double draft_kv_read_ratio = 1.0 / 16;
  // Drafts per step chosen by the cost rule (engine/speculative/speculator.h) from each sequence's
  // kept-draft record; false: always max_draft_tokens (what fixed-k servers do; for measurements).
  bool adaptive_drafts = true;
  // Output constraints (engine/constraint/grammar.h): how long a request waits for its
  // constraint to compile, and how many compile at once before further ones are refused (429).
  int32_t constraint_compile_ms = 10000;
  int32_t max_compiling_constraints = 4;
  int32_t constraint_cache_mib = 256;  // compiled constraints kept for reuse (ConstraintCompiler::Limits)
};

// The cache-or-recompute cost model, measured at start-up (docs/tiered_kv.md): how many tokens
// running sequences may have dropped at once (0: none), one token's recompute and one token's
// host-to-device move (seconds; 0: not measured), and whether old blocks are dropped before they
// would go to the host tier.
struct RecomputeModel {
  int32_t capacity_tokens = 0;
  double recompute_s_per_token = 0, transfer_s_per_token = 0;
  bool before_host = false;
};

// Shared between the engine thread and one client: a queue of events plus cancellation.
class RequestHandle {
 public:
  // Blocks until an event is available or `timeout` passes; false on timeout.
  // After the final event of every choice, done() is true and next() returns false at once.
  bool next(StreamEvent& event, std::chrono::milliseconds timeout = std::chrono::milliseconds(1000));
  // Waits up to `timeout` until an event is there or every choice has finished, without taking
  // anything; true when next() would return at once.
  bool wait(std::chrono::milliseconds timeout);
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }
  bool done() const;
  const std::string& id() const { return id_; }
  RequestUsage usage() const;

  // Engine side.
  RequestHandle(std::string id, int32_t n) : id_(std::move(id)), unfinished_(n) {}
  void push(StreamEvent event);
  void set_usage(const RequestUsage& usage);

 private:
  std::string id_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<StreamEvent> events_;
  int32_t unfinished_;
  RequestUsage usage_;
  std::atomic<bool> cancelled_{false};
};

class Engine {
 public:
  // The model and backend must outlive the engine; the engine is the backend's only driver.
  // `draft`: the draft model requests with Speculation::kModel use (not owned; outlives the
  // engine), null when the server has none (such requests are refused).
  Engine(const Model& model, Backend& backend, const SchedulerConfig& config, MetricsRegistry& metrics,
         DraftModel* draft = nullptr);
  ~Engine();  // stops the scheduler thread; unfinished requests finish as cancelled

  // Validates and queues the request. Throws fathom::Error for invalid input, including an
  // attention policy the backend does not implement and a request whose KV (prompt + max_tokens,
  // n choices) exceeds the whole cache, which could never finish (HTTP 400 / INVALID_ARGUMENT), and
  // EngineBusy when max_queue requests wait beyond the max_num_seqs running (HTTP 429).
  std::shared_ptr<RequestHandle> submit(Request request);

  // Stops admission (submit throws EngineDraining) and waits up to `timeout` for running
  // and queued requests to finish; whatever remains is cancelled. Returns true if all finished.
  bool drain(std::chrono::milliseconds timeout);
  bool draining() const { return draining_.load(); }

  const Model& model() const { return model_; }
  Backend& backend() { return backend_; }
  const SchedulerConfig& config() const { return config_; }
  // What the KV cache holds and the step limits the scheduler runs with (fixed after construction).
  struct KvCapacity {
    int32_t device_blocks, host_blocks, block_size, max_batched_tokens, max_num_seqs;
    RecomputeModel recompute;
  };
  KvCapacity kv_capacity() const;
  int32_t running() const;  // sequences being processed
  int32_t waiting() const;  // requests queued

 private:
  void loop();
  // The vocabulary's grammar compiler, made on the first constrained request (it indexes the
  // whole vocabulary once).
  ConstraintCompiler& constraints();

  const Model& model_;
  Backend& backend_;
  SchedulerConfig config_;
  MetricsRegistry& metrics_;
  const bool has_draft_model_;
  std::unique_ptr<Scheduler> scheduler_;
  std::thread thread_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable idle_;  // signalled after every scheduler iteration
  std::vector<std::unique_ptr<RequestState>> incoming_;
  std::vector<std::weak_ptr<RequestHandle>> handles_;  // to cancel what a drain leaves behind
  uint64_t next_order_ = 0;
  std::atomic<int32_t> running_count_{0}, waiting_count_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{1};
  std::mutex constraints_mutex_;
  std::unique_ptr<ConstraintCompiler> constraints_;
};

class EngineBusy : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class EngineDraining : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace fathom
