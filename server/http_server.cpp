#include "server/http_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "base/error.h"
#include "engine/metrics.h"
#include "engine/model.h"
#include "server/auth.h"
#include "server/config.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
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

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = "",
                const std::string& code = "") {
  send_json(res, status, error_body(status, message, param, code));
  if (status == 429) res.set_header("Retry-After", kRetryAfterBusy);
  if (status == 503) res.set_header("Retry-After", kRetryAfterUnavailable);
}

// Label for the per-route request counter: known routes by name, everything else "other"
// (a scanner must not create unbounded label values).
std::string route_label(const std::string& path) {
  static const char* kRoutes[] = {"/v1/completions", "/v1/chat/completions", "/v1/models", "/tokenize",
                                  "/detokenize",     "/health",              "/metrics"};
  for (const char* r : kRoutes)
    if (path == r) return r;
  return "other";
}

}  // namespace

struct HttpServer::Impl {
  Impl(const ServerConfig& c, MetricsRegistry& m) : config(c), metrics(m) {
    std::random_device rd;
    id_salt = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }

  const ServerConfig& config;
  MetricsRegistry& metrics;
  httplib::Server server;
  std::thread thread;
  std::atomic<State> state{State::kLoading};
  // Set once the model is loaded; null while loading (also when draining starts first).
  std::atomic<Engine*> engine_ptr{nullptr};
  std::atomic<const Model*> model_ptr{nullptr};
  uint64_t id_salt = 0;
  std::atomic<uint64_t> id_counter{0};

  void install_routes();
  httplib::Server::Handler guarded(std::function<void(const httplib::Request&, httplib::Response&)> handler);
  // Throws ApiError 503 unless the state allows the route: generation needs kReady, the
  // tokenizer routes only a loaded model.
  // Returns the loaded model.
  const Model& require(bool generation) const;
  std::string new_id(ApiKind kind);
  void generate(const httplib::Request& req, httplib::Response& res, ApiKind kind);
};

httplib::Server::Handler HttpServer::Impl::guarded(
    std::function<void(const httplib::Request&, httplib::Response&)> handler) {
  // Nothing a client sends may take the process down: every failure becomes an error body.
  return [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    try {
      handler(req, res);
    } catch (const ApiError& e) {
      send_error(res, e.status, e.what(), e.param, e.code);
    } catch (const EngineBusy& e) {
      send_error(res, 429, std::string("the server is busy: ") + e.what(), "", "queue_full");
    } catch (const EngineDraining& e) {
      send_error(res, 503, "the server is shutting down", "", "draining");
    } catch (const Error& e) {
      send_error(res, 400, e.what(), "", "invalid_value");
    } catch (const std::exception& e) {
      spdlog::error("internal error on {} {}: {}", req.method, req.path, e.what());
      send_error(res, 500, std::string("internal error: ") + e.what(), "", "internal_error");
    } catch (...) {
      spdlog::error("internal error on {} {}", req.method, req.path);
      send_error(res, 500, "internal error", "", "internal_error");
    }
  };
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
  std::snprintf(buf, sizeof buf, "%s-%016llx%08llx", kind == ApiKind::kChat ? "chatcmpl" : "cmpl",
                static_cast<unsigned long long>(id_salt),
                static_cast<unsigned long long>(id_counter.fetch_add(1) & 0xffffffffu));
  return buf;
}

void HttpServer::Impl::generate(const httplib::Request& req, httplib::Response& res, ApiKind kind) {
  const Model& model = require(/*generation=*/true);
  Engine& engine = *engine_ptr.load(std::memory_order_acquire);
  const json body = parse_json_body(req.body);
  check_model_name(body, config);
  ApiRequest api = kind == ApiKind::kChat ? parse_chat_request(body, model, config)
                                          : parse_completion_request(body, model, config);
  const ResponseMeta meta{new_id(kind), static_cast<int64_t>(std::time(nullptr)), config.model_name};
  auto gen = std::make_shared<Generation>(engine, model.tokenizer(), std::move(api), meta);
  if (!gen->request().stream) {
    send_json(res, 200, gen->collect());
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // The provider owns the Generation: if the response is dropped before the stream ends,
  // ~Generation cancels the request.
  res.set_chunked_content_provider("text/event-stream", [gen](size_t, httplib::DataSink& sink) {
    const bool finished = gen->stream([&sink](const std::string& frame) { return sink.write(frame.data(), frame.size()); },
                                      [&sink] { return sink.is_writable(); });
    if (finished) sink.done();
    return finished;
  });
}

void HttpServer::Impl::install_routes() {
  server.Post("/v1/completions", guarded([this](const httplib::Request& req, httplib::Response& res) {
                generate(req, res, ApiKind::kCompletion);
              }));
  server.Post("/v1/chat/completions", guarded([this](const httplib::Request& req, httplib::Response& res) {
                generate(req, res, ApiKind::kChat);
              }));
  server.Get("/v1/models", guarded([this](const httplib::Request&, httplib::Response& res) {
               const Model& model = require(/*generation=*/false);
               json m = {{"id", config.model_name},
                         {"object", "model"},
                         {"created", 0},
                         {"owned_by", "fathom"},
                         {"max_model_len", model.config().context_length}};
               send_json(res, 200, {{"object", "list"}, {"data", json::array({m})}});
             }));
  server.Post("/tokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
                const Model& model = require(/*generation=*/false);
                const std::vector<int32_t> tokens = parse_tokenize_request(parse_json_body(req.body), model);
                send_json(res, 200, {{"tokens", tokens},
                                     {"count", tokens.size()},
                                     {"max_model_len", model.config().context_length}});
              }));
  server.Post("/detokenize", guarded([this](const httplib::Request& req, httplib::Response& res) {
                const Model& model = require(/*generation=*/false);
                const std::string text = model.tokenizer().decode(parse_detokenize_request(parse_json_body(req.body), model));
                send_json(res, 200, {{"prompt", text}, {"text", text}});
              }));
  server.Get("/health", guarded([this](const httplib::Request&, httplib::Response& res) {
               const State s = state.load(std::memory_order_acquire);
               send_json(res, s == State::kReady ? 200 : 503, {{"status", state_name(s)}});
               if (s != State::kReady) res.set_header("Retry-After", kRetryAfterUnavailable);
             }));
  server.Get("/metrics", guarded([this](const httplib::Request&, httplib::Response& res) {
               res.set_content(metrics.render(), "text/plain; version=0.0.4; charset=utf-8");
             }));

  // API keys: everything but /health and /metrics (probes and scrapers stay open).
  server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (config.api_keys.empty() || req.path == "/health" || req.path == "/metrics")
      return httplib::Server::HandlerResponse::Unhandled;
    if (api_key_accepted(req.get_header_value("Authorization"), config.api_keys))
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, 401, "missing or incorrect API key (send 'Authorization: Bearer <key>')", "", "invalid_api_key");
    return httplib::Server::HandlerResponse::Handled;
  });
  // Statuses httplib produces itself (404 no route, 413 body too large, 400 bad HTTP) get
  // the OpenAI error shape too; our own error bodies pass through.
  server.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                       httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string message;
    if (res.status == 404) message = "no route " + req.method + " " + req.path;
    else if (res.status == 413)
      message = "the request body exceeds the limit of " + std::to_string(config.max_body_bytes) + " bytes";
    else message = "HTTP error " + std::to_string(res.status);
    send_json(res, res.status, error_body(res.status, message, "", res.status == 413 ? "request_too_large" : ""));
    return httplib::Server::HandlerResponse::Handled;
  }));
  server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    send_error(res, 500, "internal error", "", "internal_error");
  });
  server.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    metrics
        .counter("fathom_http_requests_total", "HTTP requests by route and status",
                 {{"route", route_label(req.path)}, {"status", std::to_string(res.status)}})
        .inc();
  });
}

HttpServer::HttpServer(const ServerConfig& config, MetricsRegistry& metrics)
    : impl_(std::make_unique<Impl>(config, metrics)) {}

HttpServer::~HttpServer() { stop(); }

int HttpServer::start() {
  Impl& s = *impl_;
  s.install_routes();
  s.server.set_payload_max_length(static_cast<size_t>(s.config.max_body_bytes));
  // One thread per open connection (a stream holds its thread until it ends): room for a
  // full batch of streams plus probes and clients waiting in the engine's queue.
  const size_t threads = std::clamp<size_t>(static_cast<size_t>(s.config.scheduler.max_num_seqs) * 2 + 8, 16, 512);
  s.server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  int port = s.config.port;
  if (port == 0) port = s.server.bind_to_any_port(s.config.host);
  else if (!s.server.bind_to_port(s.config.host, port)) port = -1;
  if (port < 0)
    throw Error("cannot listen for HTTP on " + s.config.host + ":" + std::to_string(s.config.port));
  s.thread = std::thread([&s] { s.server.listen_after_bind(); });
  return port;
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

void HttpServer::stop() {
  if (!impl_->thread.joinable()) return;
  impl_->server.stop();
  impl_->thread.join();
}

}  // namespace fathom
