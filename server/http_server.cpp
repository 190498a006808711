#include "server/http_server.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>
#include <optional>

#include "engine/engine.h"
#include "base/error.h"
#include "engine/metrics.h"
#include "engine/model/model.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/cors.h"
#include "server/embedding_run.h"
#include "server/http_transport.h"
#include "server/key_limiter.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "server/playground.h"
#include "server/request_rules.h"
#include "server/responses_api.h"
#include "server/sse.h"

namespace fathom {

namespace {

using nlohmann::json;

enum class State { kLoading, kReady, kDraining };

const char* state_name(State s) {
  switch (s) {
    case State::kLoading: return "loading";
    case State::kReady: return "ready";
    case State::kDraining: return "draining";
  }
  return "?";
}

// Seconds a client should wait before retrying a 429 / 503.
constexpr const char* kRetryAfterBusy = "1";
constexpr const char* kRetryAfterUnavailable = "5";

HttpResponse json_response(int status, const json& body) {
  HttpResponse r;
  r.status = status;
  r.body = dump_json(body);
  return r;
}

HttpResponse error_response(int status, const std::string& message, const std::string& param = "",
                            const std::string& code = "") {
  HttpResponse r = json_response(status, error_body(status, message, param, code));
  if (status == 429) r.headers.emplace_back("Retry-After", kRetryAfterBusy);
  if (status == 503) r.headers.emplace_back("Retry-After", kRetryAfterUnavailable);
  return r;
}

struct Route {
  const char* method;
  const char* path;
  bool runs_inline;  // answers on the I/O thread: must be quick and never block
  bool open;         // no API key needed (probes, scrapers, the playground's static files)
};

constexpr Route kRoutes[] = {
    {"POST", "/v1/completions", false, false},   {"POST", "/v1/chat/completions", false, false},
    {"POST", "/v1/responses", false, false},      {"POST", "/v1/embeddings", false, false},
    {"GET", "/v1/models", true, false},          {"POST", "/tokenize", false, false},
    {"POST", "/detokenize", false, false},       {"GET", "/health", true, true},
    {"GET", "/ready", true, true},               {"GET", "/live", true, true},
    {"GET", "/metrics", true, true},
};

// The playground's page and files (server/playground.h) when http.playground is on: open, since
// the page must load before the user has typed a key; what it calls needs one.
// GET /v1/models/{id}: one model (the openai client's models.retrieve).
constexpr Route kModel = {"GET", "/v1/models/", true, false};
constexpr Route kPlaygroundPage = {"GET", "/", true, true};
constexpr Route kPlaygroundFiles = {"GET", "/playground/", true, true};

const Route* find_route(const HttpRequest& req, bool playground) {
  for (const Route& r : kRoutes)
    if (req.path == r.path && req.method == r.method) return &r;
  if (req.method == "GET" && req.path.size() > std::strlen(kModel.path) && req.path.rfind(kModel.path, 0) == 0) return &kModel;
  if (playground && req.method == "GET" && is_playground_path(req.path))
    return req.path == "/" ? &kPlaygroundPage : &kPlaygroundFiles;
  return nullptr;
}

// Label for the per-route request counter: known routes by name (the playground's files as one),
// everything else "other" (a scanner must not create unbounded label values).
std::string route_label(const HttpRequest& req, bool playground) {
  const Route* r = find_route(req, playground);
  return r ? r->path : "other";
}

}  // namespace

struct HttpServer::Impl {
  Impl(const ServerConfig& c, MetricsRegistry& m, KeyLimiter& k) : config(c), metrics(m), key_limiter(k), cors(c.cors_origins) {
    std::random_device rd;
    id_salt = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }

  const ServerConfig& config;
  MetricsRegistry& metrics;
  KeyLimiter& key_limiter;  // limits.max_requests_per_key
  Cors cors;  // http.cors_origins
  std::unique_ptr<HttpTransport> transport;
  std::atomic<State> state{State::kLoading};
  // Set once the model is loaded; null while loading (also when draining starts first).
  std::atomic<Engine*> engine_ptr{nullptr};
  std::atomic<const Model*> model_ptr{nullptr};
  uint64_t id_salt = 0;
  std::atomic<uint64_t> id_counter{0};

  HttpRoutes routes();
  // CORS preflights, then answer_head; CORS headers on what it answers.
  std::optional<HttpResponse> check_head(const HttpRequest& req) const;
  std::optional<HttpResponse> answer_head(const HttpRequest& req) const;  // API keys, unknown routes
  // answer() with CORS headers.
  HttpResponse handle(const HttpRequest& req, HttpClient& client);
  // Nothing a client sends may take the process down: every failure becomes an error body.
  HttpResponse answer(const HttpRequest& req, HttpClient& client);
  HttpResponse route(const HttpRequest& req, HttpClient& client);
  // error_response, counted in fathom_errors_total{protocol="http", code}.
  HttpResponse error(int status, const std::string& message, const std::string& param, const std::string& code) const;
  // Throws ApiError 503 unless the state allows the route: generation needs kReady, the
  // tokenizer routes only a loaded model. Returns the loaded model.
  const Model& require(bool generation) const;
  std::string new_id(ApiKind kind);
  HttpResponse generate(const HttpRequest& req, HttpClient& client, ApiKind kind);
  HttpResponse embed(const HttpRequest& req, HttpClient& client);
  // The request's share of its API key's limit, held until the answer is delivered; 429 when the
  // key has limits.max_requests_per_key in flight.
  std::shared_ptr<KeyLimiter::Slot> key_slot(const HttpRequest& req);
};

std::shared_ptr<KeyLimiter::Slot> HttpServer::Impl::key_slot(const HttpRequest& req) {
  std::optional<KeyLimiter::Slot> slot = key_limiter.acquire(api_key_index(req.header("authorization"), config.api_keys));
  if (!slot) throw ApiError(429, key_limiter.refusal(), "", "rate_limit_exceeded");
  return std::make_shared<KeyLimiter::Slot>(std::move(*slot));
}

HttpResponse HttpServer::Impl::error(int status, const std::string& message, const std::string& param,
                                     const std::string& code) const {
  metrics
      .counter("fathom_errors_total", "Error responses by protocol and error code",
               {{"protocol", "http"}, {"code", code.empty() ? "http_" + std::to_string(status) : code}})
      .inc();
  return error_response(status, message, param, code);
}

std::optional<HttpResponse> HttpServer::Impl::check_head(const HttpRequest& req) const {
  if (Cors::is_preflight(req)) {  // before the key check: a browser's preflight carries none
    if (std::optional<HttpResponse> ok = cors.preflight(req)) return ok;
    return error(403, "this origin may not call the server (http.cors_origins)", "", "cors_forbidden");
  }
  std::optional<HttpResponse> early = answer_head(req);
  if (early) cors.decorate(req, *early);
  return early;
}

std::optional<HttpResponse> HttpServer::Impl::answer_head(const HttpRequest& req) const {
  const Route* r = find_route(req, config.playground);
  // API keys before anything else: an unauthenticated client learns nothing, not even routes.
  if (!(r && r->open) && !config.api_keys.empty() &&
      !api_key_accepted(req.header("authorization"), config.api_keys))
    return error(401, "missing or incorrect API key (send 'Authorization: Bearer <key>')", "",
                          "invalid_api_key");
  if (!r) return error(404, "no route " + req.method + " " + req.path, "", "not_found");
  return std::nullopt;
}

HttpResponse HttpServer::Impl::handle(const HttpRequest& req, HttpClient& client) {
  HttpResponse r = answer(req, client);
  cors.decorate(req, r);
  return r;
}

HttpResponse HttpServer::Impl::answer(const HttpRequest& req, HttpClient& client) {
  try {
    return route(req, client);
  } catch (const ApiError& e) {
    return error(e.status, e.what(), e.param, e.code);
  } catch (const RuleError& e) {
    const bool not_found = e.kind == RuleError::Kind::kNotFound;
    return error(not_found ? 404 : 400, e.what(), e.field,
                 !e.code.empty() ? e.code : not_found ? "model_not_found" : "invalid_value");
  } catch (const EngineBusy& e) {
    return error(429, std::string("the server is busy: ") + e.what(), "", "queue_full");
  } catch (const EngineDraining&) {
    return error(503, "the server is shutting down", "", "draining");
  } catch (const EmbeddingFailed& e) {
    return error(500, e.what(), "", "engine_error");
  } catch (const Error& e) {
    return error(400, e.what(), "", "invalid_value");
  } catch (const std::exception& e) {
    spdlog::error("internal error on {} {}: {}", req.method, req.path, e.what());
    return error(500, std::string("internal error: ") + e.what(), "", "internal_error");
  }
}

const Model& HttpServer::Impl::require(bool generation) const {
  const State s = state.load(std::memory_order_acquire);
  if (generation && s == State::kDraining) throw ApiError(503, "the server is shutting down", "", "draining");
  const Model* model = model_ptr.load(std::memory_order_acquire);
  if (!model) throw ApiError(503, "the model is still loading", "", "loading");
  return *model;
}

std::string HttpServer::Impl::new_id(ApiKind kind) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s%016llx%08llx",
                kind == ApiKind::kChat        ? "chatcmpl-"
                : kind == ApiKind::kResponses ? "resp_"
                : kind == ApiKind::kEmbeddings ? "embd-"
                                              : "cmpl-",
                static_cast<unsigned long long>(id_salt),
                static_cast<unsigned long long>(id_counter.fetch_add(1) & 0xffffffffu));
  return buf;
}

HttpResponse HttpServer::Impl::generate(const HttpRequest& req, HttpClient& client, ApiKind kind) {
  const Model& model = require(/*generation=*/true);
  Engine& engine = *engine_ptr.load(std::memory_order_acquire);
  std::shared_ptr<KeyLimiter::Slot> slot = key_slot(req);
  const json body = parse_json_body(req.body);
  check_model_name(body, config);
  ApiRequest api = kind == ApiKind::kChat        ? parse_chat_request(body, model, config, req.body)
                   : kind == ApiKind::kResponses ? parse_responses_request(body, model, config, req.body)
                                                 : parse_completion_request(body, model, config);
  const ResponseMeta meta{new_id(kind), static_cast<int64_t>(std::time(nullptr)), config.model_name, req.id};
  auto gen = std::make_shared<Generation>(engine, model.tokenizer(), std::move(api), meta);
  if (!gen->request().stream) {
    std::optional<json> whole = gen->collect([&client] { return client.alive(); });
    // 499 (nginx's "client closed request"): nobody reads it, but metrics and logs see it.
    if (!whole) return error(499, "the client closed the connection", "", "client_closed");
    return json_response(200, *whole);
  }
  HttpResponse r;
  r.content_type = "text/event-stream";
  r.headers = {{"Cache-Control", "no-cache"}, {"X-Accel-Buffering", "no"}};
  // The response owns the Generation: if the stream ends early, ~Generation cancels the request.
  r.stream = [gen, slot](HttpClient& out) {  // the key's share is held until the stream ends
    return gen->stream([&out](const std::string& frame) { return out.write(frame); }, [&out] { return out.alive(); });
  };
  return r;
}

HttpResponse HttpServer::Impl::embed(const HttpRequest& req, HttpClient& client) {
  const Model& model = require(/*generation=*/true);
  Engine& engine = *engine_ptr.load(std::memory_order_acquire);
  const std::shared_ptr<KeyLimiter::Slot> slot = key_slot(req);
  const json body = parse_json_body(req.body);
  check_model_name(body, config);
  const EmbeddingRequest request = parse_embeddings_request(body, model, config);
  const std::string id = new_id(ApiKind::kEmbeddings);
  const auto start = std::chrono::steady_clock::now();
  const std::optional<EmbeddingResult> result =
      run_embeddings(engine, request, id, embedding_window(config), [&client] { return client.alive(); });
  if (!result) return error(499, "the client closed the connection", "", "client_closed");
  spdlog::info("{} {}embeddings inputs={} prompt_tokens={} total_ms={:.1f}", id,
               req.id.empty() ? "" : "request_id=" + req.id + " ", request.inputs.size(), result->prompt_tokens,
               std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  return json_response(200, embeddings_response(request, *result, config.model_name));
}

HttpResponse HttpServer::Impl::route(const HttpRequest& req, HttpClient& client) {
  if (req.path == "/v1/embeddings") return embed(req, client);
  if (req.path == "/v1/completions") return generate(req, client, ApiKind::kCompletion);
  if (req.path == "/v1/chat/completions") return generate(req, client, ApiKind::kChat);
  if (req.path == "/v1/responses") return generate(req, client, ApiKind::kResponses);
  if (req.path == "/v1/models" || req.path.rfind(kModel.path, 0) == 0) {
    const Model& model = require(/*generation=*/false);
    json m = {{"id", config.model_name},
              {"object", "model"},
              {"created", 0},
              {"owned_by", "fathom"},
              {"max_model_len", model.config().context_length}};
    if (req.path == "/v1/models") return json_response(200, {{"object", "list"}, {"data", json::array({m})}});
    // The id as the list gives it, or any other name a request's "model" may use for it (with or
    // without ".gguf"; "/" as itself or %2F); else 404 model_not_found, as a request naming it.
    std::string id = req.path.substr(std::strlen(kModel.path));
    for (size_t at; (at = id.find("%2F")) != std::string::npos || (at = id.find("%2f")) != std::string::npos;)
      id.replace(at, 3, "/");
    check_served_model(id, config, "model");
    return json_response(200, m);
  }
  if (req.path == "/tokenize") {
    const Model& model = require(/*generation=*/false);
    const std::vector<int32_t> tokens = parse_tokenize_request(parse_json_body(req.body), model, req.body);
    return json_response(200, {{"tokens", tokens}, {"count", tokens.size()}, {"max_model_len", model.config().context_length}});
  }
  if (req.path == "/detokenize") {
    const Model& model = require(/*generation=*/false);
    const std::string text = model.tokenizer().decode(parse_detokenize_request(parse_json_body(req.body), model));
    return json_response(200, {{"prompt", text}, {"text", text}});
  }
  if (req.path == "/health") {
    const State s = state.load(std::memory_order_acquire);
    HttpResponse r = json_response(s == State::kReady ? 200 : 503, {{"status", state_name(s)}});
    if (s != State::kReady) r.headers.emplace_back("Retry-After", kRetryAfterUnavailable);
    return r;
  }
  // Kubernetes probes. /live: the process answers (liveness; never fails for load). /ready: take
  // traffic (readiness): loaded, not draining and the engine's queue not full.
  if (req.path == "/live") return json_response(200, {{"status", "alive"}});
  if (req.path == "/ready") {
    const State s = state.load(std::memory_order_acquire);
    const Engine* engine = engine_ptr.load(std::memory_order_acquire);
    const int32_t waiting = engine ? engine->waiting() : 0;
    const bool overloaded = s == State::kReady && waiting >= std::max(1, config.scheduler.max_queue);
    HttpResponse r = json_response(s == State::kReady && !overloaded ? 200 : 503,
                                   {{"status", overloaded ? "overloaded" : state_name(s)}, {"waiting", waiting}});
    if (r.status != 200) r.headers.emplace_back("Retry-After", kRetryAfterBusy);
    return r;
  }
  if (req.path == "/metrics") {
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = metrics.render();
    return r;
  }
  if (config.playground && req.method == "GET" && is_playground_path(req.path))
    return playground_response(req.path);
  throw ApiError(404, "no route " + req.method + " " + req.path, "", "not_found");
}

HttpRoutes HttpServer::Impl::routes() {
  HttpRoutes r;
  r.check_head = [this](const HttpRequest& req) { return check_head(req); };
  r.runs_inline = [this](const HttpRequest& req) {
    const Route* route = find_route(req, config.playground);
    return route && route->runs_inline;
  };
  r.handle = [this](const HttpRequest& req, HttpClient& client) { return handle(req, client); };
  r.error = [this](int status, const std::string& message, const std::string& code) {
    return error(status, message, "", code);
  };
  r.done = [this](const HttpRequest& req, int status) {
    metrics
        .counter("fathom_http_requests_total", "HTTP requests by route and status",
                 {{"route", route_label(req, config.playground)}, {"status", std::to_string(status)}})
        .inc();
  };
  return r;
}

HttpServer::HttpServer(const ServerConfig& config, MetricsRegistry& metrics, KeyLimiter& keys)
    : impl_(std::make_unique<Impl>(config, metrics, keys)) {}

HttpServer::~HttpServer() { stop(); }

int HttpServer::start() {
  Impl& s = *impl_;
  HttpLimits limits = s.config.http_limits;
  limits.max_body_bytes = s.config.max_body_bytes;
  limits.max_workers = http_workers(s.config);
  s.transport = std::make_unique<HttpTransport>(limits, s.routes(), s.metrics);
  return s.transport->start(s.config.host, s.config.port);
}

void HttpServer::set_ready(Engine& engine, const Model& model) {
  impl_->engine_ptr.store(&engine, std::memory_order_release);
  impl_->model_ptr.store(&model, std::memory_order_release);
  State loading = State::kLoading;  // a drain that began during loading wins
  impl_->state.compare_exchange_strong(loading, State::kReady, std::memory_order_acq_rel);
}

void HttpServer::set_draining() {
  impl_->state.store(State::kDraining, std::memory_order_release);
}

void HttpServer::stop(std::chrono::milliseconds grace) {
  if (impl_->transport) impl_->transport->stop(grace);
}

}  // namespace fathom
