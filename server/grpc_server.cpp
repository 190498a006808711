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
#include <filesystem>
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
#include "server/bounded_json.h"
#include "server/request_rules.h"
#include "server/config.h"
#include "server/embedding_run.h"
#include "server/grpc_write_watch.h"
#include "server/key_limiter.h"
#include "server/schema_rules.h"
#include "server/openai_request.h"
#include "server/answer.h"
#include "server/harmony.h"
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

// A request error with its gRPC code, thrown while translating a request.
class RpcError : public std::runtime_error {
 public:
  RpcError(grpc::StatusCode code, const std::string& message) : std::runtime_error(message), code(code) {}
  grpc::StatusCode code;
};

[[noreturn]] void invalid(const std::string& message) { throw RpcError(grpc::StatusCode::INVALID_ARGUMENT, message); }

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

// The ids of `in`, each inside the vocabulary (else INVALID_ARGUMENT).
std::vector<int32_t> checked_token_ids(const pb::TokenIds& in, int32_t vocab) {
  std::vector<int32_t> ids;
  for (int32_t id : in.ids()) {
    if (id < 0 || id >= vocab)
      invalid("token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    ids.push_back(id);
  }
  return ids;
}

// The id the server reports; the same rule as /v1/models (file name without .gguf by default).
std::string model_id(const ServerConfig& config) {
  if (!config.model_name.empty()) return config.model_name;
  return std::filesystem::path(config.model).stem().string();
}

SamplingParams to_sampling(const pb::SamplingParameters& s, const Model& model) {
  const int32_t vocab = model.vocab();
  SamplingParams p = default_sampling(model);
  auto in_range = [](const char* name, double v) { return check_sampling_number(name, v, std::string("sampling.") + name); };
  if (s.has_temperature()) p.temperature = in_range("temperature", s.temperature());
  if (s.has_top_p()) p.top_p = in_range("top_p", s.top_p());
  if (s.has_top_k()) {
    if (s.top_k() < -1 || s.top_k() > vocab)
      invalid("sampling.top_k must be in [-1, " + std::to_string(vocab) + "] (0 or -1: off)");
    p.top_k = std::max(0, s.top_k());
  }
  if (s.has_min_p()) p.min_p = in_range("min_p", s.min_p());
  if (s.has_presence_penalty()) p.presence_penalty = in_range("presence_penalty", s.presence_penalty());
  if (s.has_frequency_penalty()) p.frequency_penalty = in_range("frequency_penalty", s.frequency_penalty());
  if (s.has_repetition_penalty()) p.repetition_penalty = in_range("repetition_penalty", s.repetition_penalty());
  if (s.has_seed()) p.seed = s.seed();
  for (const auto& [id, bias] : s.logit_bias()) {
    if (id < 0 || id >= vocab)
      invalid("sampling.logit_bias key " + std::to_string(id) + " is not a token id of this model");
    p.logit_bias.emplace_back(id, check_sampling_number("logit_bias", bias, "sampling.logit_bias"));
  }
  std::sort(p.logit_bias.begin(), p.logit_bias.end());  // map order is unspecified; keep requests reproducible
  if (s.has_logprobs()) {
    if (s.logprobs() < 0 || s.logprobs() > kMaxTopLogprobs)
      invalid("sampling.logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) + "]");
    p.logprobs = s.logprobs();
  }
  validate(p, vocab);  // the sampler's own checks (fathom::Error -> INVALID_ARGUMENT)
  return p;
}

// Chat input and tools in the HTTP API's JSON shape, so that the same code (server/tools.h, the
// chat template) reads both protocols.
// The chat input's tools as JSON text in the order a client writes them (name, description,
// parameters in its own key order, strict): what the template prints with tojson.
std::string ordered_tools_text(const pb::GenerateRequest& in) {
  using nlohmann::ordered_json;
  ordered_json tools = ordered_json::array();
  for (const pb::FunctionTool& t : in.tools()) {
    ordered_json function = {{"name", t.name()}, {"description", t.description()}};
    if (!t.parameters().empty()) function["parameters"] = parse_bounded_ordered_json(t.parameters());
    function["strict"] = t.strict();
    tools.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return ordered_json{{"tools", std::move(tools)}}.dump();
}

nlohmann::json chat_body(const pb::GenerateRequest& in) {
  using nlohmann::json;
  json messages = json::array();
  for (const pb::ChatMessage& m : in.chat().messages()) {
    json msg = {{"role", m.role()}, {"content", m.content()}};
    if (m.tool_calls_size() > 0) {
      json calls = json::array();
      for (const pb::ToolCall& c : m.tool_calls())
        calls.push_back({{"id", c.id()}, {"type", "function"}, {"function", {{"name", c.name()}, {"arguments", c.arguments()}}}});
      msg["tool_calls"] = std::move(calls);
    }
    if (!m.tool_call_id().empty()) msg["tool_call_id"] = m.tool_call_id();
    messages.push_back(std::move(msg));
  }
  json body = {{"messages", std::move(messages)}};
  if (in.tools_size() > 0) {
    json tools = json::array();
    for (int i = 0; i < in.tools_size(); ++i) {
      const pb::FunctionTool& t = in.tools(i);
      json function = {{"name", t.name()}, {"description", t.description()}, {"strict", t.strict()}};
      if (!t.parameters().empty()) {
        check_schema_keywords(t.parameters(), "tools[" + std::to_string(i) + "].parameters");  // also: JSON, depth
        function["parameters"] = json::parse(t.parameters());
      }
      tools.push_back({{"type", "function"}, {"function", std::move(function)}});
    }
    body["tools"] = std::move(tools);
  }
  const std::string& choice = in.tool_choice();
  if (choice == "none" || choice == "auto" || choice == "required") body["tool_choice"] = choice;
  else if (!choice.empty()) body["tool_choice"] = {{"type", "function"}, {"function", {{"name", choice}}}};
  return body;
}

Request to_engine_request(const pb::GenerateRequest& in, const Model& model, const ServerConfig& config,
                          ToolPlan& tools, ReasoningMode& reasoning) {
  check_served_model(in.model(), config, "model");
  Request r;
  r.attention = config.attention;
  if (!in.attention().empty()) {
    try {
      r.attention.kind = policy_kind(in.attention());
    } catch (const Error& e) {
      invalid(e.what());
    }
  }
  if (in.kv_read_ratio() != 0.0) {
    if (!(in.kv_read_ratio() > 0.0 && in.kv_read_ratio() <= 1.0)) invalid("kv_read_ratio must be in (0, 1]");
    r.attention.kv_read_ratio = in.kv_read_ratio();
  }
  r.speculative = config.speculative;
  if (!in.speculative().empty()) {
    const std::optional<Speculation> m = parse_speculation(in.speculative());
    if (!m) invalid("speculative must be one of " + std::string(kSpeculationNames));
    r.speculative = *m;
  }
  const int32_t vocab = model.vocab();
  switch (in.input_case()) {
    case pb::GenerateRequest::kText:
      if (in.text().empty()) invalid("text is empty");
      r.prompt = model.tokenizer().encode(in.text());  // BOS when the vocabulary asks for it
      break;
    case pb::GenerateRequest::kTokenIds:
      r.prompt = checked_token_ids(in.token_ids(), vocab);
      break;
    case pb::GenerateRequest::kChat:
      try {
        const nlohmann::json body = chat_body(in);
        tools = parse_tools(body);
        ChatPrompt prompt = encode_chat_body(body, model, tools, in.tools_size() > 0 ? ordered_tools_text(in) : "");
        r.prompt = std::move(prompt.ids);
        reasoning = prompt.reasoning;
      } catch (const ApiError& e) {  // the HTTP API's 400s: INVALID_ARGUMENT naming the field
        invalid(e.param.empty() ? std::string(e.what()) : e.param + ": " + e.what());
      }
      break;
    case pb::GenerateRequest::INPUT_NOT_SET:
      break;
  }
  if ((in.tools_size() > 0 || !in.tool_choice().empty()) && in.input_case() != pb::GenerateRequest::kChat)
    invalid("tools and tool_choice need chat input");
  if (r.prompt.empty()) invalid("the prompt is empty: set text or token_ids");

  check_prompt_fits(r.prompt.size(), model, "text");
  r.max_tokens = resolve_max_tokens(in.has_max_tokens() ? std::optional<int64_t>(in.max_tokens()) : std::nullopt,
                                    r.prompt.size(), model, config, "max_tokens");
  r.n = resolve_n(in.n() == 0 ? std::nullopt : std::optional<int64_t>(in.n()), config, "n");
  r.priority = resolve_priority(in.priority(), config, "priority");
  for (const std::string& s : in.stop()) add_stop_string(s, r.stop, "stop");
  r.stop.ignore_eos = in.ignore_eos();
  if (in.has_constraint()) {
    const pb::OutputConstraint& c = in.constraint();
    switch (c.kind_case()) {
      case pb::OutputConstraint::kJsonObject:
        if (c.json_object()) r.constraint.kind = OutputConstraint::Kind::kJson;
        break;
      case pb::OutputConstraint::kJsonSchema:
        if (c.json_schema().empty()) invalid("constraint.json_schema is empty");
        check_schema_keywords(c.json_schema(), "constraint.json_schema");
        r.constraint = {OutputConstraint::Kind::kJsonSchema, c.json_schema(), c.strict()};
        break;
      case pb::OutputConstraint::kGrammar:
        if (c.grammar().empty()) invalid("constraint.grammar is empty");
        check_grammar_text(c.grammar(), "constraint.grammar");
        r.constraint = {OutputConstraint::Kind::kGrammar, c.grammar(), true};
        break;
      case pb::OutputConstraint::KIND_NOT_SET:
        break;
    }
  }
  if (const OutputConstraint c = tool_constraint(tools); c.kind != OutputConstraint::Kind::kNone) {
    if (r.constraint.kind != OutputConstraint::Kind::kNone) invalid("a named or required tool_choice takes no constraint");
    r.constraint = c;
  }
  // A harmony model's JSON answer goes in its final channel, after the analysis (as over HTTP).
  if (reasoning.harmony) r.constraint = harmony_answer_constraint(r.constraint);
  // A reasoning model's thinking: counted in usage, free of any constraint (as over HTTP).
  r.thinking = thinking_span(reasoning, model.tokenizer());
  r.shown_tokens = shown_call_tokens(tools, model.tokenizer());
  r.sampling = to_sampling(in.sampling(), model);
  return r;
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
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "this API key has " + std::to_string(key_limiter_.per_key()) +
                            " requests in progress (limits.max_requests_per_key); retry when one ends");
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
  GrpcServerImpl(Engine& engine, const ServerConfig& config, int port, KeyLimiter& keys)
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
    const int32_t http_workers = config.http_limits.max_workers > 0 ? config.http_limits.max_workers : request_workers(config);
    quota.SetMaxThreads(config.grpc_max_threads > 0 ? config.grpc_max_threads : http_workers + 1);
    builder.SetResourceQuota(quota);
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
    interceptors.push_back(write_watch_.interceptor_factory());  // a send stalled past write_timeout_ms is cancelled
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

std::unique_ptr<GrpcServer> start_grpc_server(Engine& engine, const ServerConfig& config, int port, KeyLimiter& keys) {
  return std::make_unique<GrpcServerImpl>(engine, config, port, keys);
}

}  // namespace fathom
