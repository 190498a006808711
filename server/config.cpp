#include "server/config.h"

#include <unistd.h>  // environ

#include <cctype>

#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "server/attention_options.h"

namespace fathom {

namespace {

using nlohmann::json;

// Reads one JSON object key by key, remembering which keys were read so that finish() can
// reject the rest. Every error names the dotted key path, e.g. "kv_cache.block_size".
class ObjectReader {
 public:
  ObjectReader(const json& object, std::string path, const std::string& origin)
      : object_(object), path_(std::move(path)), origin_(origin) {
    if (!object_.is_object()) {
      if (path_.empty()) throw Error(origin_ + ": the top level must be a JSON object");
      fail(path_, "must be an object");
    }
  }

  bool has(const std::string& key) {
    seen_.insert(key);
    return object_.contains(key) && !object_.at(key).is_null();
  }

  void read(const std::string& key, std::string& out) {
    if (!has(key)) return;
    const json& v = object_.at(key);
    if (!v.is_string()) fail(key, "must be a string");
    out = v.get<std::string>();
  }

  void read(const std::string& key, bool& out) {
    if (!has(key)) return;
    const json& v = object_.at(key);
    if (!v.is_boolean()) fail(key, "must be true or false");
    out = v.get<bool>();
  }

  template <typename Int>
  void read_int(const std::string& key, Int& out, int64_t min, int64_t max) {
    if (!has(key)) return;
    const json& v = object_.at(key);
    if (!v.is_number_integer()) fail(key, "must be an integer");
    // Unsigned JSON integers above INT64_MAX are out of every range we accept.
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(key, "is out of range");
    const int64_t x = v.get<int64_t>();
    if (x < min || x > max)
      fail(key, "must be between " + std::to_string(min) + " and " + std::to_string(max) + ", got " + std::to_string(x));
    out = static_cast<Int>(x);
  }

  // A number in (0, 1].
  void read_ratio(const std::string& key, double& out) {
    if (!has(key)) return;
    const json& v = object_.at(key);
    if (!v.is_number() || !(v.get<double>() > 0 && v.get<double>() <= 1)) fail(key, "must be a number in (0, 1]");
    out = v.get<double>();
  }

  void read(const std::string& key, std::vector<std::string>& out) {
    if (!has(key)) return;
    const json& v = object_.at(key);
    if (!v.is_array()) fail(key, "must be an array of strings");
    out.clear();
    for (const json& item : v) {
      if (!item.is_string() || item.get<std::string>().empty()) fail(key, "must contain only non-empty strings");
      out.push_back(item.get<std::string>());
    }
  }

  // A nested object, or nullptr when the key is absent (or null).
  std::unique_ptr<ObjectReader> object(const std::string& key) {
    if (!has(key)) return nullptr;
    return std::make_unique<ObjectReader>(object_.at(key), full(key), origin_);
  }

  void finish() const {
    for (auto it = object_.begin(); it != object_.end(); ++it)
      if (!seen_.count(it.key())) throw Error(origin_ + ": unknown key '" + full(it.key()) + "'");
  }

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw Error(origin_ + ": '" + (key == path_ ? key : full(key)) + "' " + what);
  }

 private:
  std::string full(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  const json& object_;
  std::string path_;
  const std::string& origin_;
  std::set<std::string> seen_;
};

constexpr int64_t kMaxMib = int64_t{1} << 24;  // 16 TiB: a typo guard, not a real limit

const std::set<std::string> kLogLevels = {"trace", "debug", "info", "warn", "error", "critical", "off"};

// The top-level keys parse_server_config reads: a FATHOM_ variable whose first level is one of
// them is a config override; the others (FATHOM_API_KEYS, FATHOM_FAILPOINTS, FATHOM_SIMD, ...)
// belong to other features.
const std::set<std::string> kTopLevelKeys = {"model",     "model_name", "threads",   "precision", "pack_weights",
                                             "chat_template", "embedding_pooling", "log_level", "log_format", "drain_timeout_ms", "kv_cache",
                                             "attention", "speculative", "scheduler",  "http",      "grpc",      "limits"};

// FATHOM_HTTP__MAX_CONNECTIONS=4096 -> root["http"]["max_connections"] = 4096.
void apply_env_overrides(json& root, const EnvVars& env, const std::string& origin) {
  for (const auto& [name, value] : env) {
    if (name.rfind("FATHOM_", 0) != 0) continue;
    std::string path = name.substr(7);
    for (char& ch : path) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    std::vector<std::string> keys;
    for (size_t at = 0;;) {
      const size_t sep = path.find("__", at);
      keys.push_back(path.substr(at, sep == std::string::npos ? std::string::npos : sep - at));
      if (sep == std::string::npos) break;
      at = sep + 2;
    }
    if (!kTopLevelKeys.count(keys[0])) continue;
    if (!root.is_object()) throw Error(origin + ": the top level must be a JSON object");
    json* node = &root;
    for (size_t i = 0; i + 1 < keys.size(); ++i) {
      json& next = (*node)[keys[i]];
      if (next.is_null()) next = json::object();
      if (!next.is_object()) throw Error(name + ": '" + keys[i] + "' is not an object in the configuration");
      node = &next;
    }
    // JSON when the value parses as a number, true/false or an array; otherwise the text itself.
    json parsed = json::parse(value, nullptr, /*allow_exceptions=*/false);
    (*node)[keys.back()] = parsed.is_discarded() || parsed.is_object() || parsed.is_null() ? json(value) : parsed;
  }
}

}  // namespace

EnvVars fathom_environment() {
  EnvVars env;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos && entry.rfind("FATHOM_", 0) == 0) env.emplace_back(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

ServerConfig parse_server_config(const std::string& json_text, const std::string& origin, const EnvVars& env) {
  json root = json::parse(json_text, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (root.is_discarded()) throw Error(origin + ": not valid JSON");
  apply_env_overrides(root, env, origin);

  ServerConfig c;
  ObjectReader top(root, "", origin);
  top.read("model", c.model);
  top.read("model_name", c.model_name);
  top.read_int("threads", c.model_options.threads, 0, 1024);
  std::string precision;
  top.read("precision", precision);
  if (precision == "q8") c.model_options.precision = cpu::Precision::kQ8;
  else if (precision == "f32") c.model_options.precision = cpu::Precision::kF32;
  else if (!precision.empty()) top.fail("precision", "must be \"q8\" or \"f32\", got \"" + precision + "\"");
  top.read("pack_weights", c.model_options.pack_weights);
  top.read("chat_template", c.model_options.chat_template);
  top.read("embedding_pooling", c.embedding_pooling);
  if (!valid_embedding_pooling(c.embedding_pooling))
    top.fail("embedding_pooling", "must be \"mean\", \"cls\", \"last\" or \"none\", got \"" + c.embedding_pooling + "\"");
  top.read("log_level", c.log_level);
  top.read("log_format", c.log_format);
  if (c.log_format != "text" && c.log_format != "json") top.fail("log_format", "must be \"text\" or \"json\"");
  if (!kLogLevels.count(c.log_level)) top.fail("log_level", "must be one of trace, debug, info, warn, error, critical, off");
  top.read_int("drain_timeout_ms", c.drain_timeout_ms, 0, 3600 * 1000);

  if (auto kv = top.object("kv_cache")) {
    int64_t device_mib = c.model_options.kv_cache_bytes >> 20, host_mib = c.scheduler.host_kv_bytes >> 20;
    kv->read_int("device_mib", device_mib, 0, kMaxMib);
    kv->read_int("host_mib", host_mib, 0, kMaxMib);
    c.model_options.kv_cache_bytes = device_mib << 20;
    c.scheduler.host_kv_bytes = host_mib << 20;
    std::string dtype;
    kv->read("dtype", dtype);
    if (dtype == "f16") c.model_options.kv_dtype = KvDtype::kF16;
    else if (dtype == "f32") c.model_options.kv_dtype = KvDtype::kF32;
    else if (dtype == "int8") c.model_options.kv_dtype = KvDtype::kI8;
    else if (!dtype.empty()) kv->fail("dtype", "must be \"f16\", \"f32\" or \"int8\", got \"" + dtype + "\"");
    kv->read("transposed_k", c.model_options.kv_transposed_k);
    kv->read_int("block_size", c.model_options.block_size, 1, 1024);
    kv->read_int("hot_rows_percent", c.model_options.hot_rows_percent, 0, 100);
    std::string recompute;
    kv->read("recompute", recompute);
    if (recompute == "auto") c.scheduler.recompute = SchedulerConfig::Recompute::kAuto;
    else if (recompute == "off") c.scheduler.recompute = SchedulerConfig::Recompute::kOff;
    else if (recompute == "always") c.scheduler.recompute = SchedulerConfig::Recompute::kAlways;
    else if (!recompute.empty()) kv->fail("recompute", "must be \"auto\", \"off\" or \"always\", got \"" + recompute + "\"");
    kv->finish();
  }
  if (auto a = top.object("attention")) {
    const AttentionOptionFail fail = [&](const std::string& param, const std::string& message) {
      a->fail(param, message);
    };
    check_attention_aliases(root["attention"], fail);
    for (auto it = root["attention"].begin(); it != root["attention"].end(); ++it) {
      a->has(it.key());  // mark as seen; unknown keys fail below
      if (!apply_attention_option("policy", it.key(), *it, c.attention, fail))
        a->fail(it.key(), "is not an attention option (" + attention_option_keys("policy") + ")");
    }
    a->finish();
  }
  if (auto s = top.object("speculative")) {
    std::string mode;
    s->read("mode", mode);
    if (!mode.empty()) {
      const std::optional<Speculation> m = parse_speculation(mode);
      if (!m) s->fail("mode", "must be one of " + std::string(kSpeculationNames) + ", got \"" + mode + "\"");
      c.speculative = *m;
    }
    s->read_int("max_draft_tokens", c.scheduler.max_draft_tokens, 0, 16);
    s->read_ratio("draft_kv_read_ratio", c.scheduler.draft_kv_read_ratio);
    s->read("adaptive", c.scheduler.adaptive_drafts);
    s->read("draft_model", c.draft_model);
    s->finish();
  }
  if (auto s = top.object("scheduler")) {
    s->read_int("max_num_seqs", c.scheduler.max_num_seqs, 1, 4096);
    s->read_int("max_batched_tokens", c.scheduler.max_batched_tokens, 1, 1 << 20);
    s->read_int("max_queue", c.scheduler.max_queue, 0, 1 << 20);
    s->read("prefix_caching", c.scheduler.prefix_caching);
    s->read("bifurcated", c.scheduler.bifurcated);
    s->read_int("bifurcated_min_seqs", c.scheduler.bifurcated_min_seqs, 2, 4096);
    s->read_int("bifurcated_min_prefix", c.scheduler.bifurcated_min_prefix, 1, 1 << 24);
    s->finish();
  }
  if (auto h = top.object("http")) {
    h->read("host", c.host);
    if (c.host.empty()) h->fail("host", "must not be empty");
    h->read_int("port", c.port, 0, 65535);
    h->read("api_keys", c.api_keys);
    h->read("api_keys_file", c.api_keys_file);
    h->read_int("max_body_bytes", c.max_body_bytes, 1024, int64_t{1} << 30);
    std::string unknown = c.reject_unknown_fields ? "reject" : "ignore";
    h->read("unknown_fields", unknown);
    if (unknown != "reject" && unknown != "ignore") h->fail("unknown_fields", "must be \"reject\" or \"ignore\"");
    c.reject_unknown_fields = unknown == "reject";
    h->read("cors_origins", c.cors_origins);
    h->read("playground", c.playground);
    HttpLimits& l = c.http_limits;
    h->read_int("max_header_bytes", l.max_header_bytes, 1024, 1 << 20);
    h->read_int("max_connections", l.max_connections, 1, 1 << 20);
    h->read_int("max_workers", l.max_workers, 0, 4096);
    h->read_int("header_timeout_ms", l.header_timeout_ms, 100, 3600 * 1000);
    h->read_int("body_timeout_ms", l.body_timeout_ms, 100, 3600 * 1000);
    h->read_int("idle_timeout_ms", l.idle_timeout_ms, 100, 3600 * 1000);
    h->read_int("write_timeout_ms", l.write_timeout_ms, 100, 3600 * 1000);
    h->finish();
  }
  if (auto g = top.object("grpc")) {
    g->read_int("port", c.grpc_port, -1, 65535);
    g->read_int("max_threads", c.grpc_max_threads, 0, 4096);
    if (c.grpc_max_threads == 1) g->fail("max_threads", "must be 0 (as http.max_workers) or at least 2: one waits for calls");
    g->read("reflection", c.grpc_reflection);
    g->finish();
  }
  if (auto l = top.object("limits")) {
    l->read_int("max_n", c.max_n, 1, 128);
    l->read_int("max_tokens", c.max_tokens_limit, 1, 1 << 24);
    l->read_int("default_max_tokens", c.default_max_tokens, 1, 1 << 24);
    l->read_int("max_priority", c.max_priority, 0, 1000000);
    l->read_int("constraint_compile_ms", c.scheduler.constraint_compile_ms, 1, 3600 * 1000);
    l->read_int("max_compiling_constraints", c.scheduler.max_compiling_constraints, 1, 1024);
    l->read_int("constraint_cache_mib", c.scheduler.constraint_cache_mib, 0, 1 << 20);
    l->read_int("max_requests_per_key", c.max_requests_per_key, 0, 1 << 20);
    l->finish();
  }
  top.finish();
  return c;
}

ServerConfig load_server_config(const std::string& json_path, const EnvVars& env) {
  std::ifstream in(json_path, std::ios::binary);
  if (!in) throw Error("cannot read config file '" + json_path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  ServerConfig c = parse_server_config(text.str(), json_path, env);

  // A relative model path is tried against the working directory first, then against the
  // config file's directory and its parent (configs/default.json names models/... relative
  // to the repository root).
  namespace fs = std::filesystem;
  for (std::string* path : {&c.model, &c.draft_model}) {
    if (path->empty() || !fs::path(*path).is_relative() || fs::exists(*path)) continue;
    const fs::path dir = fs::absolute(json_path).parent_path();
    for (const fs::path& base : {dir, dir.parent_path()}) {
      if (fs::exists(base / *path)) {
        *path = (base / *path).lexically_normal().string();
        break;
      }
    }
  }
  return c;
}

}  // namespace fathom
