// fathom serve: the OpenAI-compatible HTTP server (and gRPC when configured) over one Engine.
//
// Lifecycle: HTTP listens first (/health says "loading"), then the model loads, the engine
// starts and /health says "ready". SIGTERM or SIGINT stops admission (503 + Retry-After),
// drains the engine within drain_timeout_ms, stops HTTP and gRPC, and exits 0.
#include <sys/resource.h>
#include <pthread.h>
#include <signal.h>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "base/error.h"
#include "base/failpoints.h"
#include "engine/backend/backend.h"
#include "engine/metrics.h"
#include "engine/model/model.h"
#include "engine/speculative/draft_model.h"
#include "server/auth.h"
#include "server/cli_args.h"
#include "server/commands.h"
#include "server/json_log.h"
#include "server/config.h"
#include "server/request_rules.h"
#include "server/grpc_server.h"
#include "server/key_limiter.h"
#include "server/http_server.h"
#include "server/model_options.h"

namespace fathom {

namespace {

template <typename Int>
void int_option(const CliArgs& args, const char* name, int64_t min, int64_t max, Int& target) {
  if (!args.has(name)) return;
  const int64_t v = args.get_int(name, 0);
  if (v < min || v > max)
    throw Error("--" + std::string(name) + " must be between " + std::to_string(min) + " and " + std::to_string(max));
  target = static_cast<Int>(v);
}

// --config FILE first, then FATHOM_* environment overrides, then every flag given on top.
ServerConfig config_from_args(const CliArgs& args) {
  const EnvVars env = fathom_environment();
  ServerConfig c = args.has("config") ? load_server_config(args.require("config"), env)
                                      : parse_server_config("{}", "the environment", env);
  if (auto v = args.get("model")) c.model = *v;
  if (auto v = args.get("model-name")) c.model_name = *v;
  if (auto v = args.get("host")) c.host = *v;
  int_option(args, "port", 0, 65535, c.port);
  int_option(args, "grpc-port", -1, 65535, c.grpc_port);
  c.model_options = model_options_from_args(args, c.model_options);
  if (auto v = args.get("embedding-pooling")) c.embedding_pooling = *v;
  if (!valid_embedding_pooling(c.embedding_pooling))
    throw Error("--embedding-pooling must be mean, cls, last or none, got '" + c.embedding_pooling + "'");
  // API keys: the config's list (or --api-key, which replaces it), plus a key file
  // (http.api_keys_file / --api-key-file) and FATHOM_API_KEYS (comma-separated): the latter two
  // keep keys out of the command line, where `ps` shows them.
  if (!args.all("api-key").empty()) c.api_keys = args.all("api-key");
  if (auto v = args.get("api-key-file")) c.api_keys_file = *v;
  if (!c.api_keys_file.empty())
    for (std::string& k : read_api_keys_file(c.api_keys_file)) c.api_keys.push_back(std::move(k));
  if (const char* env = std::getenv("FATHOM_API_KEYS"))
    for (std::string& k : split_api_keys(env)) c.api_keys.push_back(std::move(k));
  int64_t host_kv_mib = 0;
  int_option(args, "host-kv-mib", 0, int64_t{1} << 24, host_kv_mib);
  if (args.has("host-kv-mib")) c.scheduler.host_kv_bytes = host_kv_mib << 20;
  if (auto v = args.get("speculative")) {
    const std::optional<Speculation> m = parse_speculation(*v);
    if (!m) throw Error("--speculative must be one of " + std::string(kSpeculationNames) + ", got '" + *v + "'");
    c.speculative = *m;
  }
  int_option(args, "max-draft-tokens", 0, 16, c.scheduler.max_draft_tokens);
  if (auto v = args.get("draft-model")) c.draft_model = *v;
  int_option(args, "max-num-seqs", 1, 4096, c.scheduler.max_num_seqs);
  int_option(args, "max-batched-tokens", 1, 1 << 20, c.scheduler.max_batched_tokens);
  int_option(args, "max-queue", 0, 1 << 20, c.scheduler.max_queue);
  if (args.flag("no-prefix-caching")) c.scheduler.prefix_caching = false;
  if (args.flag("no-bifurcated")) c.scheduler.bifurcated = false;
  if (args.flag("no-playground")) c.playground = false;
  c.attention = attention_from_args(args, c.attention);
  int_option(args, "max-body-bytes", 1024, int64_t{1} << 30, c.max_body_bytes);
  int_option(args, "max-tokens-limit", 1, 1 << 24, c.max_tokens_limit);
  int_option(args, "max-n", 1, 128, c.max_n);
  int_option(args, "drain-timeout-ms", 0, 3600 * 1000, c.drain_timeout_ms);
  if (auto v = args.get("log-level")) c.log_level = *v;
  if (auto v = args.get("log-format")) c.log_format = *v;
  if (c.log_format != "text" && c.log_format != "json") throw Error("--log-format must be text or json");
  if (spdlog::level::from_str(c.log_level) == spdlog::level::off && c.log_level != "off")
    throw Error("--log-level must be one of trace, debug, info, warn, error, critical, off");

  if (c.model.empty()) throw Error("no model: give --model PATH, or --config FILE naming one");
  // A Hugging Face directory is served under its own name ("Qwen2.5-7B-Instruct", not "Qwen2"); a
  // GGUF file under its name without the extension.
  while (c.model.size() > 1 && c.model.back() == '/') c.model.pop_back();
  std::error_code ec;
  const std::filesystem::path model_path(c.model);
  if (c.model_name.empty())
    c.model_name = std::filesystem::is_directory(model_path, ec) ? model_path.filename().string()
                                                                 : model_path.stem().string();
  return c;
}

// SIGTERM / SIGINT, received synchronously: the signals are blocked in every thread (the mask
// is set before any thread starts) and one thread takes them with sigwait, so nothing runs in
// signal-handler context.
class ShutdownSignal {
 public:
  ShutdownSignal() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGINT);
    if (pthread_sigmask(SIG_BLOCK, &set_, nullptr) != 0) throw Error("cannot block SIGTERM/SIGINT");
    thread_ = std::thread([this] { run(); });
  }
  ~ShutdownSignal() {
    {
      std::lock_guard lock(mutex_);
      exiting_ = true;
    }
    pthread_kill(thread_.native_handle(), SIGTERM);  // wakes the sigwait; blocked, so it only queues
    thread_.join();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    requested_cv_.wait(lock, [this] { return requested_; });
  }
  bool requested() {
    std::lock_guard lock(mutex_);
    return requested_;
  }

 private:
  void run() {
    for (;;) {
      int sig = 0;
      if (sigwait(&set_, &sig) != 0) continue;
      std::lock_guard lock(mutex_);
      if (exiting_) return;
      if (requested_) {
        // A second signal while draining: the operator wants out now.
        std::fprintf(stderr, "fathom: second signal, exiting without finishing the drain\n");
        std::_Exit(1);
      }
      spdlog::info("received {}: draining", sig == SIGTERM ? "SIGTERM" : "SIGINT");
      requested_ = true;
      requested_cv_.notify_all();
    }
  }

  sigset_t set_;
  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable requested_cv_;
  bool requested_ = false;
  bool exiting_ = false;
};


// Each HTTP connection is a file descriptor: lift the soft limit to the hard one (often 1024
// vs 1M in containers), so http.max_connections, not the default ulimit, bounds them.
void raise_open_file_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  limit.rlim_cur = limit.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) spdlog::warn("cannot raise the open file limit");
}

}  // namespace

int run_serve(int argc, char** argv) {
  std::set<std::string> names = {"config",    "model-name",       "host",           "port",      "grpc-port",
                                 "api-key",   "api-key-file",     "host-kv-mib",      "max-num-seqs",   "max-queue", "max-batched-tokens",
                                 "log-level", "log-format", "max-body-bytes",   "max-tokens-limit", "max-n",   "drain-timeout-ms",
                                 "embedding-pooling", "speculative", "max-draft-tokens", "draft-model"};
  names.insert(kModelOptionNames.begin(), kModelOptionNames.end());
  std::set<std::string> flags = {"no-prefix-caching", "no-bifurcated", "no-playground"};
  flags.insert(kModelFlagNames.begin(), kModelFlagNames.end());
  CliArgs args(names, flags);
  args.parse(argc, argv, 2);
  const ServerConfig config = config_from_args(args);

  // Logs go to stderr; stdout carries only the "listening on" lines scripts parse.
  spdlog::set_default_logger(spdlog::stderr_color_mt("fathom"));
  if (config.log_format == "json") spdlog::set_formatter(make_json_log_formatter());
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  raise_open_file_limit();
  ::signal(SIGPIPE, SIG_IGN);  // a client that hangs up is a failed write, not a dead server
  ShutdownSignal shutdown;        // before any other thread exists

  MetricsRegistry metrics;
  KeyLimiter key_limiter(config.api_keys.size(), config.max_requests_per_key);  // HTTP and gRPC share it
  if (config.max_requests_per_key > 0 && config.api_keys.empty())
    spdlog::warn("limits.max_requests_per_key has no effect without API keys (http.api_keys)");
  HttpServer http(config, metrics, key_limiter);
  const int http_port = http.start();
  std::printf("fathom: HTTP listening on %s:%d\n", config.host.c_str(), http_port);
  std::fflush(stdout);

  spdlog::info("loading {}", config.model);
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Model> model = Model::load(config.model, config.model_options.chat_template);
  (void)default_sampling(*model);  // the model's sampling defaults within what a request may ask, or no start
  std::unique_ptr<Backend> backend = make_backend(*model, config.model_options);
  backend->check_policy(config.attention);  // the default policy must run on this backend
  if (const int32_t keys = backend->prepare_break_even(config.attention); keys >= 0)
    spdlog::info("attention: {} decodes sparse from {} keys (measured break-even; shorter steps run densely)",
                 config.attention.name(), keys == INT32_MAX ? std::string("no length") : std::to_string(keys));
  spdlog::info("loaded {} ({}, {} layers, context {}, {} chat template) on the {} backend in {:.2f} s", config.model_name,
               model->config().arch_name, model->config().n_layers, model->config().context_length,
               [&]() -> std::string {
                 try {
                   return model->chat_template().family_name();
                 } catch (const Error&) {
                   return "no";
                 }
               }(),
               backend->name(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  metrics.gauge("fathom_model_load_seconds", "Seconds the model took to load (mapping, tokenizer, backend weights)")
      .set(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  metrics
      .gauge("fathom_build_info", "Always 1: the build and what it serves, as labels",
             {{"version", FATHOM_VERSION},
              {"commit", FATHOM_COMMIT},
              {"backend", backend->name()},
              {"model", config.model_name},
              {"attention_policy", config.attention.name()},
              {"kv_dtype", kv_dtype_name(config.model_options.kv_dtype)}})
      .set(1);
  if (const std::string fp = failpoints::describe(); !fp.empty()) spdlog::warn("failpoints armed: {}", fp);
  LoadedDraftModel draft;
  if (!config.draft_model.empty()) {
    draft = load_draft_model(config.draft_model, *model, config.model_options);
    spdlog::info("draft model {} ({}, {} layers): speculative \"model\" drafts with it", config.draft_model,
                 draft.model->config().arch_name, draft.model->config().n_layers);
  } else if (config.speculative == Speculation::kModel) {
    throw Error("speculative mode \"model\" needs a draft model (--draft-model PATH or speculative.draft_model)");
  }
  Engine engine(*model, *backend, config.scheduler, metrics, draft.draft.get());
  const Engine::KvCapacity kv = engine.kv_capacity();
  spdlog::info("kv cache: {} device blocks + {} host blocks of {} tokens ({} tokens in all)", kv.device_blocks,
               kv.host_blocks, kv.block_size, static_cast<int64_t>(kv.device_blocks + kv.host_blocks) * kv.block_size);
  if (kv.recompute.capacity_tokens > 0)
    spdlog::info("kv cache-or-recompute: up to {} dropped tokens; recompute {:.3g} s/token, host->device {:.3g} "
                 "s/token (0: unmeasured): {}",
                 kv.recompute.capacity_tokens, kv.recompute.recompute_s_per_token, kv.recompute.transfer_s_per_token,
                 kv.recompute.before_host ? "old blocks are dropped from the host tier"
                                          : "blocks are dropped only when both tiers are full");
  if (config.scheduler.host_kv_bytes > 0 && kv.host_blocks == 0)
    spdlog::warn("the {} backend has no host KV tier yet: kv_cache.host_mib is not used", backend->name());
  if (kv.max_batched_tokens < config.scheduler.max_batched_tokens || kv.max_num_seqs < config.scheduler.max_num_seqs)
    spdlog::warn("the device KV tier holds {} blocks: steps limited to max_batched_tokens {} and max_num_seqs {}",
                 kv.device_blocks, kv.max_batched_tokens, kv.max_num_seqs);
  std::unique_ptr<GrpcServer> grpc;
  if (config.grpc_port != 0) {
    grpc = start_grpc_server(engine, config, config.grpc_port < 0 ? 0 : config.grpc_port, key_limiter, metrics);
    std::printf("fathom: gRPC listening on %s:%d\n", config.host.c_str(), grpc->port());
    std::fflush(stdout);
  }
  // Whatever happens from here on, HTTP handlers stop before the engine and model they use go.
  struct StopHttpFirst {
    HttpServer& http;
    ~StopHttpFirst() { http.stop(); }
  } stop_http_first{http};
  http.set_ready(engine, *model);
  spdlog::info("ready: {} on http://{}:{}", config.model_name, config.host, http_port);

  shutdown.wait();
  http.set_draining();
  if (grpc) grpc->set_serving(false);
  const std::chrono::milliseconds drain_timeout(config.drain_timeout_ms);
  const auto drain_end = std::chrono::steady_clock::now() + drain_timeout;
  const bool drained = engine.drain(drain_timeout);
  if (drained) spdlog::info("drained: every request finished");
  else spdlog::warn("drain timed out after {} ms: unfinished requests were cancelled", config.drain_timeout_ms);
  // The drain budget covers delivery too: a finished request's last events may still be on their
  // way to a slow (or CPU-starved) client, and the front ends give them what is left of it (at
  // least a few seconds each). A fixed 3 s once cut a 1,024-token gRPC stream short, UNAVAILABLE.
  const auto budget_left = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(drain_end - std::chrono::steady_clock::now());
  };
  http.stop(budget_left());
  if (grpc) grpc->shutdown(budget_left());
  spdlog::info("stopped");
  return 0;
}

}  // namespace fathom
