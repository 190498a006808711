// The gRPC front end: fathom.v1.Fathom (proto/fathom.proto) on the synchronous gRPC API, plus
// grpc.health.v1 and server reflection. Like the HTTP layer it only translates: a
// GenerateRequest becomes an engine Request, StreamEvents become GenerateResponses.
//
// Validation mirrors the HTTP layer's ranges (server/openai_request.cpp) so that the same
// request means the same thing on both protocols; errors map to status codes in
// status_from_exception() and nowhere else.
#include "server/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "base/error.h"
#include "engine/model/model.h"
#include "proto/fathom.grpc.pb.h"
#include "proto/fathom.pb.h"
#include "server/auth.h"
#include "server/request_rules.h"
#include "server/config.h"
#include "server/embedding_run.h"
#include "server/grpc_metrics.h"
#include "server/grpc_request.h"
#include "server/grpc_write_watch.h"
#include "server/key_limiter.h"
#include "server/openai_request.h"
#include "server/answer.h"
#include "server/reasoning.h"
#include "server/tools.h"

namespace fathom {
namespace {

namespace pb = ::fathom::v1;
using Clock = std::chrono::steady_clock;

// How often a waiting Generate call looks at client cancellation.
constexpr std::chrono::milliseconds kPollInterval{50};
constexpr std::chrono::seconds kShutdownGrace{3};  // the least time calls in flight get at shutdown
constexpr int kMaxStreamsPerConnection = 100;  // calls at once on one HTTP/2 connection (RFC 9113 5.1.2: no smaller than 100)

const char* const kServiceName = "fathom.v1.Fathom";


// The one place exceptions become gRPC statuses; call inside a catch block.
grpc::Status status_from_exception() {
  try {
    throw;
  } catch (const RpcError& e) {
    return grpc::Status(e.code, e.what());
  } catch (const RuleError& e) {
    return grpc::Status(e.kind == RuleError::Kind::kNotFound ? grpc::StatusCode::NOT_FOUND
                                                            : grpc::StatusCode::INVALID_ARGUMENT,
                        e.what());
  } catch (const EngineBusy& e) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, e.what());
  } catch (const EngineDraining& e) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, e.what());
  } catch (const Error& e) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, e.what());
  } catch (const std::exception& e) {
    spdlog::error("grpc: internal error: {}", e.what());
    return grpc::Status(grpc::StatusCode::INTERNAL, e.what());
  }
}

void fill_event(const StreamEvent& ev, pb::GenerateResponse& out) {
  out.set_choice(ev.choice);
  for (int32_t id : ev.token_ids) out.add_token_ids(id);
  out.set_text(ev.text);
  for (const SampledToken& t : ev.logprobs) {
    pb::TokenLogprob* lp = out.add_logprobs();
    lp->set_id(t.id);
    lp->set_logprob(t.logprob);
    for (const auto& [id, logprob] : t.top) {
      pb::TopLogprob* top = lp->add_top();
      top->set_id(id);
      top->set_logprob(logprob);
    }
  }
  if (ev.finish != FinishReason::kNone) out.set_finish_reason(finish_reason_name(ev.finish));
}

// Chat with tools offered or a reasoning model: the choice's text so far; at its end, the thinking
// in it (reasoning_content, as the HTTP API splits it) and the calls in the rest (answer_tool_calls,
// ids "call_<request id>_<choice>_<i>"), finish_reason "tool_calls" when it stopped.
void add_chat_outputs(const ToolPlan& tools, const ReasoningMode& reasoning, const StreamEvent& ev,
                      std::vector<std::string>& texts, const std::string& request_id, pb::GenerateResponse& out) {
  if (static_cast<size_t>(ev.choice) >= texts.size()) texts.resize(static_cast<size_t>(ev.choice) + 1);
  std::string& text = texts[static_cast<size_t>(ev.choice)];
  text += ev.text;
  if (ev.finish == FinishReason::kNone || ev.finish == FinishReason::kError) return;
  const AnswerParts answer =
      answer_parts(reasoning, tools, text, ev.finish, "call_" + request_id + "_" + std::to_string(ev.choice) + "_");
  if (!answer.reasoning.empty()) out.set_reasoning_content(answer.reasoning);
  const std::vector<ToolCall>& calls = answer.calls;
  for (const ToolCall& c : calls) {
    pb::ToolCall* t = out.add_tool_calls();
    t->set_id(c.id);
    t->set_name(c.name);
    t->set_arguments(c.arguments);
  }
  if (!calls.empty() && ev.finish == FinishReason::kStop) out.set_finish_reason("tool_calls");
}

void fill_usage(const RequestUsage& u, pb::GenerateResponse& out) {
  pb::Usage* usage = out.mutable_usage();
  usage->set_prompt_tokens(u.prompt_tokens);
  usage->set_completion_tokens(u.completion_tokens);
  usage->set_cached_prompt_tokens(u.cached_prompt_tokens);
  usage->set_reasoning_tokens(u.reasoning_tokens);
}

// The HTTP API's keys hold for gRPC too: metadata "authorization: Bearer <key>" (grpc.health.v1
// stays open, as /health does). UNAUTHENTICATED otherwise.
std::string authorization_of(const grpc::ServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  const auto it = md.find("authorization");
  return it == md.end() ? std::string() : std::string(it->second.data(), it->second.size());
}

grpc::Status authorize(const grpc::ServerContext* ctx, const ServerConfig& config) {
  if (config.api_keys.empty()) return grpc::Status::OK;
  if (api_key_accepted(authorization_of(ctx), config.api_keys)) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "missing or incorrect API key (send metadata 'authorization: Bearer <key>')");
}

class FathomService final : public pb::Fathom::Service {
 public:
  FathomService(Engine& engine, const ServerConfig& config, KeyLimiter& keys)
      : engine_(engine), config_(config), key_limiter_(keys) {}

  // Generate calls running now (shutdown waits for them to deliver what the drain finished).
  int running_generates() const { return running_generates_.load(); }

  grpc::Status Generate(grpc::ServerContext* ctx, const pb::GenerateRequest* in,
                        grpc::ServerWriter<pb::GenerateResponse>* writer) override {
    running_generates_.fetch_add(1);
    struct Leave {
      std::atomic<int>& running;
      ~Leave() { running.fetch_sub(1); }
    } leave{running_generates_};
    if (grpc::Status auth = authorize(ctx, config_); !auth.ok()) return auth;
    const std::optional<KeyLimiter::Slot> slot = key_slot(ctx);  // held until the call ends
    if (!slot) return key_limit_status();
    std::shared_ptr<RequestHandle> handle;
    ToolPlan tools;
    ReasoningMode reasoning;
    std::vector<std::string> texts;  // per choice, with tools or reasoning: split and parsed at its end
    int32_t n = 1;
    RequestUsage counted;  // what this call saw, for the log line when the engine's usage is not final
    const Clock::time_point start = Clock::now();
    try {
      Request request = to_engine_request(*in, engine_.model(), config_, tools, reasoning);
      n = request.n;
      counted.prompt_tokens = static_cast<int32_t>(request.prompt.size());
      handle = engine_.submit(std::move(request));
    } catch (...) {
      return status_from_exception();
    }

    int32_t unfinished = n;
    std::optional<double> ttft_ms;
    std::string finish = "cancelled";
    StreamEvent ev;
    while (unfinished > 0) {
      if (ctx->IsCancelled()) {
        handle->cancel();
        log_request(*handle, counted, "client-cancelled", ttft_ms);
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the call");
      }
      if (!handle->next(ev, kPollInterval)) {
        if (handle->done()) break;  // the engine ended the request without a final event per choice
        continue;
      }
      if (ev.finish == FinishReason::kError) {
        handle->cancel();
        log_request(*handle, counted, "error", ttft_ms);
        return grpc::Status(grpc::StatusCode::INTERNAL, ev.error.empty() ? "generation failed" : ev.error);
      }
      counted.completion_tokens += static_cast<int32_t>(ev.token_ids.size());
      if (!ttft_ms && !ev.token_ids.empty())
        ttft_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      pb::GenerateResponse out;
      fill_event(ev, out);
      if (tools.offered() || reasoning.on) add_chat_outputs(tools, reasoning, ev, texts, handle->id(), out);
      if (ev.finish != FinishReason::kNone) {
        finish = finish_reason_name(ev.finish);
        --unfinished;
      }
      // The event that finishes the last choice also carries the request's usage.
      if (unfinished == 0) fill_usage(handle->usage(), out);
      if (!writer->Write(out)) {  // the client went away, or read nothing for write_timeout_ms (GrpcWriteWatch)
        handle->cancel();
        log_request(*handle, counted, "write-failed", ttft_ms);
        return grpc::Status(grpc::StatusCode::CANCELLED, "the stream was closed");
      }
    }
    if (unfinished > 0) {  // defensive: still end the stream with the usage
      pb::GenerateResponse out;
      fill_usage(handle->usage(), out);
      writer->Write(out);
    }
    log_request(*handle, handle->usage(), finish, ttft_ms);
    return grpc::Status::OK;
  }

  grpc::Status Tokenize(grpc::ServerContext* ctx, const pb::TokenizeRequest* in, pb::TokenizeResponse* out) override {
    if (grpc::Status auth = authorize(ctx, config_); !auth.ok()) return auth;
    try {
      check_served_model(in->model(), config_, "model");
      EncodeOptions opts;
      opts.add_bos = in->add_special();
      for (int32_t id : engine_.model().tokenizer().encode(in->text(), opts)) out->add_token_ids(id);
      return grpc::Status::OK;
    } catch (...) {
      return status_from_exception();
    }
  }

  grpc::Status Embed(grpc::ServerContext* ctx, const pb::EmbedRequest* in, pb::EmbedResponse* out) override {
    if (grpc::Status auth = authorize(ctx, config_); !auth.ok()) return auth;
    const std::optional<KeyLimiter::Slot> slot = key_slot(ctx);
    if (!slot) return key_limit_status();
    try {
      check_served_model(in->model(), config_, "model");
      const Model& model = engine_.model();
      EmbeddingRequest r;
      r.pooling = served_pooling(model, config_);
      if (in->inputs_size() > static_cast<int>(kMaxEmbeddingInputs))
        throw RuleError(RuleError::Kind::kInvalid, "inputs", "at most " + std::to_string(kMaxEmbeddingInputs) + " inputs");
      for (const pb::EmbedInput& one : in->inputs()) {
        if (one.has_token_ids()) r.inputs.push_back(checked_token_ids(one.token_ids(), model.vocab()));
        else r.inputs.push_back(embedding_tokens(model.tokenizer(), one.text()));
      }
      r.priority = resolve_priority(in->priority(), config_, "priority");
      check_embedding_request(r, in->has_dimensions() ? std::optional<int64_t>(in->dimensions()) : std::nullopt, model,
                              "inputs");
      const std::optional<EmbeddingResult> result =
          run_embeddings(engine_, r, "grpc-embed", embedding_window(config_), [ctx] { return !ctx->IsCancelled(); });
      if (!result) return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the call");
      for (const std::vector<float>& v : result->vectors) out->add_embeddings()->mutable_values()->Add(v.begin(), v.end());
      out->mutable_usage()->set_prompt_tokens(static_cast<int32_t>(result->prompt_tokens));
      return grpc::Status::OK;
    } catch (...) {
      return status_from_exception();
    }
  }

  grpc::Status ListModels(grpc::ServerContext* ctx, const pb::ListModelsRequest*, pb::ListModelsResponse* out) override {
    if (grpc::Status auth = authorize(ctx, config_); !auth.ok()) return auth;
    pb::ModelInfo* m = out->add_models();
    m->set_id(model_id(config_));
    m->set_context_length(engine_.model().config().context_length);
    m->set_architecture(engine_.model().config().arch_name);
    return grpc::Status::OK;
  }

 private:
  // The call's share of its API key's limit (limits.max_requests_per_key, shared with HTTP).
  std::optional<KeyLimiter::Slot> key_slot(const grpc::ServerContext* ctx) {
    return key_limiter_.acquire(api_key_index(authorization_of(ctx), config_.api_keys));
  }
  grpc::Status key_limit_status() const {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, key_limiter_.refusal());
  }

  void log_request(const RequestHandle& handle, const RequestUsage& u, const std::string& finish,
                   std::optional<double> ttft_ms) {
    spdlog::info("grpc request {}: prompt {} (cached {}) completion {} ttft {} finish {}", handle.id(),
                 u.prompt_tokens, u.cached_prompt_tokens, u.completion_tokens,
                 ttft_ms ? fmt::format("{:.1f} ms", *ttft_ms) : std::string("-"), finish);
  }

  Engine& engine_;
  const ServerConfig& config_;
  KeyLimiter& key_limiter_;
  std::atomic<int> running_generates_{0};
};

class GrpcServerImpl final : public GrpcServer {
 public:
  GrpcServerImpl(Engine& engine, const ServerConfig& config, int port, KeyLimiter& keys, MetricsRegistry& metrics)
      : write_watch_(std::chrono::milliseconds(config.http_limits.write_timeout_ms)), service_(engine, config, keys) {
    grpc::EnableDefaultHealthCheckService(true);
    if (config.grpc_reflection) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    // IPv6 literals need brackets in a gRPC address.
    const std::string host = config.host.find(':') != std::string::npos && config.host.front() != '['
                                 ? "[" + config.host + "]"
                                 : config.host;
    const std::string address = host + ":" + std::to_string(std::max(0, port));
    grpc::ServerBuilder builder;
    // gRPC sets SO_REUSEPORT by default: a second server on a port in use would share it (the
    // kernel splitting connections between the two) instead of failing, and two servers asking
    // for any free port could be given the same one (grpc/grpc#10755). A port is this server's.
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    // HTTP's limits (configs/README.md), so that neither port is the easier way in: a request of
    // at most max_body_bytes (RESOURCE_EXHAUSTED past it), metadata of at most max_header_bytes,
    // a connection's handshake within header_timeout_ms, a connection with no call closed after
    // idle_timeout_ms. And a bound on calls at once: each holds a server thread for its life (a
    // Generate stream for its whole answer), so without one a client opening streams would make
    // the server start threads without limit. One thread waits for new calls; past the others a
    // call gets RESOURCE_EXHAUSTED at once. grpc.max_threads 0: as many calls as HTTP's workers.
    builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(config.max_body_bytes, INT32_MAX)));
    builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, config.http_limits.max_header_bytes);
    builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, config.http_limits.header_timeout_ms);
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, config.http_limits.idle_timeout_ms);
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxStreamsPerConnection);
    grpc::ResourceQuota quota("fathom-grpc");
    quota.SetMaxThreads(config.grpc_max_threads > 0 ? config.grpc_max_threads : http_workers(config) + 1);
    builder.SetResourceQuota(quota);
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
    interceptors.push_back(write_watch_.interceptor_factory());  // a send stalled past write_timeout_ms is cancelled
    interceptors.push_back(grpc_metrics_interceptors(metrics));  // fathom_grpc_requests_total, fathom_errors_total
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
    builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    if (!server_ || port_ == 0) {
      if (server_) server_->Shutdown();
      throw Error("cannot listen for gRPC on " + address);
    }
    set_serving(true);
  }

  ~GrpcServerImpl() override { shutdown(std::chrono::milliseconds(0)); }

  int port() const override { return port_; }

  void set_serving(bool serving) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return;
    grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
    if (!health) return;
    health->SetServingStatus("", serving);
    health->SetServingStatus(kServiceName, serving);
  }

  void shutdown(std::chrono::milliseconds grace) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopped_) return;
    stopped_ = true;
    if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
    // Generate calls still writing a drained answer to a slow client get up to `grace`; then every
    // call left (a health Watch never ends by itself) gets kShutdownGrace before it is cancelled.
    // A cancelled Generate sees IsCancelled() and cancels its engine request within kPollInterval.
    const auto until = Clock::now() + grace;
    while (service_.running_generates() > 0 && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    server_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
    server_->Wait();
  }

 private:
  GrpcWriteWatch write_watch_;  // outlives server_ and the interceptors it made
  FathomService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::mutex mutex_;
  bool stopped_ = false;
};

}  // namespace

std::unique_ptr<GrpcServer> start_grpc_server(Engine& engine, const ServerConfig& config, int port, KeyLimiter& keys,
                                              MetricsRegistry& metrics) {
  return std::make_unique<GrpcServerImpl>(engine, config, port, keys, metrics);
}

}  // namespace fathom
