// Metrics registry and Prometheus text exposition (format 0.0.4).
//
// Naming is the caller's: counters are registered with their `_total` suffix already in the
// name (e.g. "fathom_prompt_tokens_total"); nothing is appended here, so the name in the code
// is the name that appears in /metrics. Histograms render `<name>_bucket{le=...}` (cumulative,
// `le` inclusive, "+Inf" last), `<name>_sum` and `<name>_count`.
#include "engine/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace fathom {

namespace {

// std::atomic<double> has no portable fetch_add before C++20 library support is universal;
// a compare-exchange loop is lock-free wherever atomic<double> is.
void atomic_add(std::atomic<double>& a, double v) {
  double old = a.load(std::memory_order_relaxed);
  while (!a.compare_exchange_weak(old, old + v, std::memory_order_relaxed)) {
  }
}

bool valid_metric_name(const std::string& s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool valid_label_name(const std::string& s) {
  if (s.empty() || s.rfind("__", 0) == 0) return false;  // "__" prefix is reserved
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

// Shortest text that parses back to the same double (Go's ParseFloat, which Prometheus uses,
// accepts every form to_chars produces), with Prometheus' spellings of the special values.
std::string format_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, res.ptr);
}

// HELP text: backslash and newline escaped.
std::string escape_help(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// Label values: backslash, double quote and newline escaped.
std::string escape_label_value(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// `{a="1",b="2"}` (with `extra` appended last, e.g. le), or "" without labels.
std::string format_labels(const Labels& labels, const std::string& extra_name = "",
                          const std::string& extra_value = "") {
  if (labels.empty() && extra_name.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out += ',';
    first = false;
    out += k;
    out += "=\"";
    out += escape_label_value(v);
    out += '"';
  }
  if (!extra_name.empty()) {
    if (!first) out += ',';
    out += extra_name;
    out += "=\"";
    out += escape_label_value(extra_value);
    out += '"';
  }
  out += '}';
  return out;
}

void append_sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name;
  out += labels;
  out += ' ';
  out += format_number(v);
  out += '\n';
}

}  // namespace

// ---- Counter, Gauge, Histogram ----------------------------------------------------------

void Counter::inc(double v) {
  // A counter never decreases; a negative or NaN increment is a caller bug, dropped here rather
  // than thrown on the engine thread (metrics must never take a request down).
  if (!(v >= 0.0)) return;
  atomic_add(value_, v);
}

void Gauge::inc(double v) { atomic_add(value_, v); }

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)) {
  if (!bounds_.empty() && std::isinf(bounds_.back()) && bounds_.back() > 0) bounds_.pop_back();
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (std::isnan(bounds_[i]) || (i > 0 && !(bounds_[i - 1] < bounds_[i]))) {
      throw std::invalid_argument("histogram bounds must be strictly increasing numbers");
    }
  }
  buckets_ = std::make_unique<std::atomic<uint64_t>[]>(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::observe(double v) {
  // le is inclusive: v lands in the first bucket whose bound is >= v; NaN in +Inf only
  // (as the Go client does).
  size_t i = bounds_.size();
  if (!std::isnan(v)) {
    i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  }
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  atomic_add(sum_, v);
  count_.fetch_add(1, std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::cumulative_counts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  uint64_t acc = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    acc += buckets_[i].load(std::memory_order_relaxed);
    out[i] = acc;
  }
  return out;
}

// ---- Registry -----------------------------------------------------------------------------

struct MetricsRegistry::Family {
  std::string name;
  std::string help;
  std::string type;            // "counter", "gauge" or "histogram"
  std::vector<double> bounds;  // histograms: every series of the family shares them
  std::map<Labels, std::unique_ptr<Counter>> counters;
  std::map<Labels, std::unique_ptr<Gauge>> gauges;
  std::map<Labels, std::unique_ptr<Histogram>> histograms;
};

static void check_labels(const std::string& metric, const Labels& labels, bool histogram) {
  for (const auto& [k, v] : labels) {
    if (!valid_label_name(k) || (histogram && k == "le")) {
      throw std::invalid_argument("metric " + metric + ": invalid label name '" + k + "'");
    }
  }
}

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

MetricsRegistry::Family& MetricsRegistry::family(const std::string& name, const std::string& help,
                                                 const char* type) {
  // Caller holds mutex_.
  auto it = families_.find(name);
  if (it != families_.end()) {
    if (it->second->type != type) {
      throw std::logic_error("metric " + name + " is a " + it->second->type + ", not a " + type);
    }
    return *it->second;  // the first help text wins
  }
  if (!valid_metric_name(name)) throw std::invalid_argument("invalid metric name '" + name + "'");
  auto fam = std::make_unique<Family>();
  fam->name = name;
  fam->help = help;
  fam->type = type;
  Family& ref = *fam;
  families_.emplace(name, std::move(fam));
  return ref;
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mutex_);
  Family& fam = family(name, help, "counter");
  auto it = fam.counters.find(labels);
  if (it != fam.counters.end()) return *it->second;
  check_labels(name, labels, false);
  return *fam.counters.emplace(labels, std::make_unique<Counter>()).first->second;
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mutex_);
  Family& fam = family(name, help, "gauge");
  auto it = fam.gauges.find(labels);
  if (it != fam.gauges.end()) return *it->second;
  check_labels(name, labels, false);
  return *fam.gauges.emplace(labels, std::make_unique<Gauge>()).first->second;
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                      const std::vector<double>& bounds, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mutex_);
  Family& fam = family(name, help, "histogram");
  auto it = fam.histograms.find(labels);
  if (it != fam.histograms.end()) return *it->second;
  check_labels(name, labels, true);
  auto hist = std::make_unique<Histogram>(bounds);  // validates and normalises the bounds
  if (fam.histograms.empty()) {
    fam.bounds = hist->bounds();
  } else if (fam.bounds != hist->bounds()) {
    throw std::logic_error("metric " + name + ": every series of a histogram needs the same buckets");
  }
  Histogram& ref = *hist;
  fam.histograms.emplace(labels, std::move(hist));
  return ref;
}

std::string MetricsRegistry::render() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  for (const auto& [name, fam] : families_) {
    out += "# HELP " + name + " " + escape_help(fam->help) + "\n";
    out += "# TYPE " + name + " " + fam->type + "\n";
    for (const auto& [labels, c] : fam->counters) append_sample(out, name, format_labels(labels), c->value());
    for (const auto& [labels, g] : fam->gauges) append_sample(out, name, format_labels(labels), g->value());
    for (const auto& [labels, h] : fam->histograms) {
      const std::vector<uint64_t> cum = h->cumulative_counts();
      const std::vector<double>& b = h->bounds();
      for (size_t i = 0; i < b.size(); ++i) {
        append_sample(out, name + "_bucket", format_labels(labels, "le", format_number(b[i])),
                      static_cast<double>(cum[i]));
      }
      append_sample(out, name + "_bucket", format_labels(labels, "le", "+Inf"), static_cast<double>(cum.back()));
      append_sample(out, name + "_sum", format_labels(labels), h->sum());
      // _count from the same snapshot as the buckets, so it always equals the +Inf bucket.
      append_sample(out, name + "_count", format_labels(labels), static_cast<double>(cum.back()));
    }
  }
  return out;
}

std::vector<double> MetricsRegistry::latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0};
}

}  // namespace fathom
