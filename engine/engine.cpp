#include "engine/engine.h"

#include <algorithm>

#include "base/error.h"
#include "engine/backend/backend.h"
#include "engine/constraint/grammar.h"
#include "engine/model/model.h"
#include "engine/scheduler.h"

namespace fathom {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
  }
  return "none";
}

bool RequestHandle::next(StreamEvent& event, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty() || unfinished_ == 0; })) return false;
  if (events_.empty()) return false;
  event = std::move(events_.front());
  events_.pop_front();
  return true;
}

bool RequestHandle::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return ready_.wait_for(lock, timeout, [&] { return !events_.empty() || unfinished_ == 0; });
}

bool RequestHandle::done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return unfinished_ == 0 && events_.empty();
}

RequestUsage RequestHandle::usage() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return usage_;
}

void RequestHandle::push(StreamEvent event) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (event.finish != FinishReason::kNone) --unfinished_;
    events_.push_back(std::move(event));
  }
  ready_.notify_all();
}

void RequestHandle::set_usage(const RequestUsage& usage) {
  std::lock_guard<std::mutex> lock(mutex_);
  usage_ = usage;
}

Engine::Engine(const Model& model, Backend& backend, const SchedulerConfig& config, MetricsRegistry& metrics,
               DraftModel* draft)
    : model_(model), backend_(backend), config_(config), metrics_(metrics),
      has_draft_model_(draft != nullptr),
      scheduler_(std::make_unique<Scheduler>(model, backend, config, metrics, draft)) {
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true);
  }
  wake_.notify_all();
  thread_.join();
}

ConstraintCompiler& Engine::constraints() {
  std::lock_guard<std::mutex> lock(constraints_mutex_);
  if (!constraints_)
    constraints_ = std::make_unique<ConstraintCompiler>(
        model_.tokenizer(), model_.vocab(),
        ConstraintCompiler::Limits{std::chrono::milliseconds(config_.constraint_compile_ms), config_.max_compiling_constraints,
                                  int64_t{config_.constraint_cache_mib} << 20});
  return *constraints_;
}

std::shared_ptr<RequestHandle> Engine::submit(Request request) {
  if (draining_.load()) throw EngineDraining("the server is shutting down");
  const ModelConfig& c = model_.config();
  const int64_t prompt = static_cast<int64_t>(request.prompt.size());
  if (prompt == 0) throw Error("the prompt is empty");
  for (int32_t id : request.prompt)
    if (id < 0 || id >= model_.vocab())
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary (size " + std::to_string(model_.vocab()) + ")");
  const bool embeds = request.embedding != Pooling::kNone;
  if (embeds) {
    if (request.n != 1 || request.prompt_logprobs >= 0 || request.constraint.kind != OutputConstraint::Kind::kNone)
      throw Error("an embedding request has one choice, no prompt logprobs and no output constraint");
    request.max_tokens = 0;  // nothing is generated
  } else if (request.max_tokens < 1) {
    throw Error("max_tokens must be at least 1");
  }
  if (embeds && prompt > c.context_length)
    throw Error("this model's maximum context length is " + std::to_string(c.context_length) + " tokens; the input has " +
                std::to_string(prompt));
  if (prompt + request.max_tokens > c.context_length)
    throw Error("this model's maximum context length is " + std::to_string(c.context_length) + " tokens; the request has " +
                std::to_string(prompt) + " prompt tokens and asks for " + std::to_string(request.max_tokens) +
                " more");
  if (request.n < 1 || request.n > 128) throw Error("n must be between 1 and 128");
  if (request.prompt_logprobs < -1 || request.prompt_logprobs > 20)
    throw Error("prompt_logprobs must be in [0, 20] (or -1 for off), got " + std::to_string(request.prompt_logprobs));
  if (request.shown_tokens.size() > 8) throw Error("at most 8 shown control tokens");
  for (int32_t id : request.shown_tokens)
    if (id < 0 || id >= model_.tokenizer().vocab_size()) throw Error("a shown token id is outside the vocabulary");
  for (int32_t id : {request.thinking.start, request.thinking.end})
    if (id >= model_.vocab()) throw Error("a thinking-span token id is outside the vocabulary");
  const ThinkingSpan& span = request.thinking;
  if (span.open_text.empty() != span.close_text.empty() || span.open_text.size() > 64 || span.close_text.size() > 64)
    throw Error("a thinking span's text markers are both set, at most 64 bytes each");
  request.attention.validate();
  backend_.check_policy(request.attention);
  if (request.speculative == Speculation::kModel && !has_draft_model_)
    throw Error("speculative \"model\" needs a server started with a draft model (--draft-model)");
  validate(request.sampling, model_.vocab());
  // A request must fit the KV cache when it runs alone, or it could never finish (it would be
  // preempted by itself forever): the prompt and one choice's max_tokens, plus every other
  // choice's own blocks (its copy of the prompt's partial last block and its generated tokens).
  const int64_t bs = backend_.kv_layout().block_size;
  const int64_t need = (prompt + request.max_tokens + bs - 1) / bs +
                       static_cast<int64_t>(request.n - 1) * ((request.max_tokens + bs - 1) / bs + 1);
  // Blocks past both tiers can be dropped and recomputed (cache-or-recompute), but the prompt is
  // admitted whole.
  const int32_t cache_blocks = scheduler_->allocator().num_blocks();  // both tiers; fixed after construction
  // (Not for n > 1: the choices share the prompt's blocks, which are never dropped.)
  const int64_t servable = cache_blocks + (request.n == 1 ? scheduler_->recompute_model().capacity_tokens / bs : 0);
  if (need > servable || (prompt + bs) / bs > cache_blocks)
    throw Error("this request needs up to " + std::to_string(need) + " KV cache blocks of " + std::to_string(bs) +
                " tokens (prompt " + std::to_string(prompt) + " + max_tokens " + std::to_string(request.max_tokens) +
                (request.n > 1 ? ", n " + std::to_string(request.n) : std::string()) + "); the cache holds " +
                std::to_string(cache_blocks) +
                (servable > cache_blocks ? " (and recomputes up to " + std::to_string(servable - cache_blocks) + ")"
                                         : std::string()) +
                ": lower max_tokens" + (request.n > 1 ? " or n" : ""));

  auto state = std::make_unique<RequestState>();
  if (request.constraint.kind != OutputConstraint::Kind::kNone) {
    try {
      state->constraint = constraints().compile(request.constraint);
    } catch (const ConstraintQueueFull& e) {
      throw EngineBusy(e.what());
    }
  }
  if (request.id.empty()) request.id = "req-" + std::to_string(next_id_.fetch_add(1));
  state->handle = std::make_shared<RequestHandle>(request.id, request.n);
  state->arrival = Clock::now();
  state->request = std::move(request);
  std::shared_ptr<RequestHandle> handle = state->handle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // A request waits only when every slot is taken, so the bound is on what the engine holds
    // beyond max_num_seqs. Counted from the handles, which are exact here: the step's counts lag
    // the loop, and a request submitted just after another would count as waiting until the loop
    // picked the first one up (and be refused with slots free).
    const auto unfinished = std::count_if(handles_.begin(), handles_.end(), [](const auto& weak) {
      auto h = weak.lock();
      return h && !h->done();
    });
    if (unfinished >= static_cast<int64_t>(config_.max_num_seqs) + config_.max_queue)
      throw EngineBusy("too many requests are waiting (" + std::to_string(config_.max_queue) + ")");
    state->order = next_order_++;
    incoming_.push_back(std::move(state));
    handles_.push_back(handle);
  }
  wake_.notify_all();
  return handle;
}

void Engine::loop() {
  for (;;) {
    std::vector<std::unique_ptr<RequestState>> batch;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      // Idle: sleep until a request arrives. Busy: a short wait would only add latency.
      if (!scheduler_->has_work())
        wake_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop_.load() || !incoming_.empty(); });
      if (stop_.load()) break;
      batch.swap(incoming_);
      std::erase_if(handles_, [](const std::weak_ptr<RequestHandle>& h) {
        auto p = h.lock();
        return !p || p->done();
      });
    }
    for (auto& r : batch) scheduler_->add(std::move(r));
    // The scheduler keeps its own error boundary; this one catches what escaped it (a broken
    // invariant in its bookkeeping): every request then fails, and the engine keeps serving.
    try {
      if (scheduler_->has_work()) scheduler_->step();
    } catch (const std::exception& e) {
      scheduler_->fail_all(std::string("internal error: ") + e.what());
    }
    running_count_.store(scheduler_->running_requests());
    waiting_count_.store(scheduler_->waiting_requests());
    idle_.notify_all();
  }
  scheduler_->cancel_all();
}

bool Engine::drain(std::chrono::milliseconds timeout) {
  draining_.store(true);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mutex_);
  const bool finished = idle_.wait_until(lock, deadline, [&] {
    return incoming_.empty() && running_count_.load() == 0 && waiting_count_.load() == 0;
  });
  if (!finished)
    for (auto& weak : handles_)
      if (auto h = weak.lock()) h->cancel();
  return finished;
}

Engine::KvCapacity Engine::kv_capacity() const {
  const BlockAllocator& a = scheduler_->allocator();
  const SchedulerConfig& c = scheduler_->config();
  return {a.device_blocks(), a.host_blocks(), a.block_size(), c.max_batched_tokens, c.max_num_seqs,
          scheduler_->recompute_model()};
}

int32_t Engine::running() const { return running_count_.load(); }
int32_t Engine::waiting() const { return waiting_count_.load(); }

}  // namespace fathom
