// fathom's metrics over prometheus-cpp: the values, the name and label checks, histogram
// bucketing and the text exposition are the library's; this file adds what fathom's interface
// promises beyond it:
// - one (name, labels) is one object for the registry's lifetime, one name one type, and every
//   series of a histogram has the family's buckets;
// - a counter drops NaN increments (prometheus-cpp drops only negative ones), a histogram
//   counts NaN in +Inf only, as the Go client does (prometheus-cpp's bucket search puts it in
//   the first bucket), and histograms take no `le` label and no NaN or +Inf bounds;
// - HELP text is escaped (prometheus-cpp 1.0 writes it verbatim, so a newline would end the line);
// - families render sorted by name and series by labels, so /metrics is stable between scrapes.
//
// Naming is the caller's: counters are registered with their `_total` suffix already in the
// name (e.g. "fathom_prompt_tokens_total"); nothing is appended, so the name in the code is the
// name that appears in /metrics.
#include "engine/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace fathom {

namespace {

// HELP text: backslash and newline escaped, as the text format asks.
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

}  // namespace

// ---- Counter, Gauge, Histogram ----------------------------------------------------------

void Counter::inc(double v) {
  // A counter never decreases; a negative or NaN increment is a caller bug, dropped here rather
  // than thrown on the engine thread (metrics must never take a request down).
  if (!(v >= 0.0)) return;
  c_.Increment(v);
}

double Counter::value() const { return c_.Value(); }

void Gauge::set(double v) { g_.Set(v); }
void Gauge::inc(double v) { g_.Increment(v); }
double Gauge::value() const { return g_.Value(); }

void Histogram::observe(double v) {
  if (std::isnan(v)) {
    std::vector<double> increments(bounds_.size() + 1, 0.0);
    increments.back() = 1.0;
    h_.ObserveMultiple(increments, v);
    return;
  }
  h_.Observe(v);
}

std::vector<uint64_t> Histogram::cumulative_counts() const {
  const prometheus::ClientMetric m = h_.Collect();
  std::vector<uint64_t> out;
  out.reserve(m.histogram.bucket.size());
  for (const auto& b : m.histogram.bucket) out.push_back(b.cumulative_count);
  return out;
}

double Histogram::sum() const { return h_.Collect().histogram.sample_sum; }
uint64_t Histogram::count() const { return h_.Collect().histogram.sample_count; }

// ---- Registry -----------------------------------------------------------------------------

struct MetricsRegistry::Family {
  std::string type;  // "counter", "gauge" or "histogram"; only that type's members below are set
  prometheus::Family<prometheus::Counter>* counter_family = nullptr;
  prometheus::Family<prometheus::Gauge>* gauge_family = nullptr;
  prometheus::Family<prometheus::Histogram>* histogram_family = nullptr;
  std::vector<double> bounds;  // histograms: every series of the family shares them
  std::map<Labels, std::unique_ptr<Counter>> counters;
  std::map<Labels, std::unique_ptr<Gauge>> gauges;
  std::map<Labels, std::unique_ptr<Histogram>> histograms;
};

MetricsRegistry::MetricsRegistry() : registry_(std::make_unique<prometheus::Registry>()) {}
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
  auto fam = std::make_unique<Family>();
  fam->type = type;
  const std::string h = escape_help(help);
  // Register() validates the name (std::invalid_argument) before anything is kept.
  if (fam->type == "counter") {
    fam->counter_family = &prometheus::BuildCounter().Name(name).Help(h).Register(*registry_);
  } else if (fam->type == "gauge") {
    fam->gauge_family = &prometheus::BuildGauge().Name(name).Help(h).Register(*registry_);
  } else {
    fam->histogram_family = &prometheus::BuildHistogram().Name(name).Help(h).Register(*registry_);
  }
  return *families_.emplace(name, std::move(fam)).first->second;
}

Counter& MetricsRegistry::counter(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mutex_);
  Family& fam = family(name, help, "counter");
  auto it = fam.counters.find(labels);
  if (it != fam.counters.end()) return *it->second;
  prometheus::Counter& c = fam.counter_family->Add(labels);  // validates the label names
  return *fam.counters.emplace(labels, std::unique_ptr<Counter>(new Counter(c))).first->second;
}

Gauge& MetricsRegistry::gauge(const std::string& name, const std::string& help, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mutex_);
  Family& fam = family(name, help, "gauge");
  auto it = fam.gauges.find(labels);
  if (it != fam.gauges.end()) return *it->second;
  prometheus::Gauge& g = fam.gauge_family->Add(labels);
  return *fam.gauges.emplace(labels, std::unique_ptr<Gauge>(new Gauge(g))).first->second;
}

Histogram& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                      const std::vector<double>& bounds, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mutex_);
  Family& fam = family(name, help, "histogram");
  auto it = fam.histograms.find(labels);
  if (it != fam.histograms.end()) return *it->second;
  if (labels.count("le")) {
    throw std::invalid_argument("metric " + name + ": a histogram's series cannot have an 'le' label");
  }
  // +Inf is implied (prometheus-cpp always adds it): an explicit one last is dropped. NaN bounds
  // are refused here; prometheus-cpp refuses bounds that are not strictly increasing.
  std::vector<double> b = bounds;
  if (!b.empty() && std::isinf(b.back()) && b.back() > 0) b.pop_back();
  for (double x : b) {
    if (std::isnan(x) || (std::isinf(x) && x > 0)) {
      throw std::invalid_argument("metric " + name + ": histogram bounds must be strictly increasing numbers");
    }
  }
  if (!fam.histograms.empty() && fam.bounds != b) {
    throw std::logic_error("metric " + name + ": every series of a histogram needs the same buckets");
  }
  prometheus::Histogram& h = fam.histogram_family->Add(labels, b);  // validates labels and order
  if (fam.histograms.empty()) fam.bounds = b;
  return *fam.histograms.emplace(labels, std::unique_ptr<Histogram>(new Histogram(h, std::move(b))))
              .first->second;
}

std::string MetricsRegistry::render() const {
  // Collect() takes prometheus-cpp's own locks; the sort makes the order independent of the
  // order of registration and of the library's hash maps.
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::sort(families.begin(), families.end(),
            [](const prometheus::MetricFamily& a, const prometheus::MetricFamily& b) { return a.name < b.name; });
  for (auto& f : families) {
    std::sort(f.metric.begin(), f.metric.end(),
              [](const prometheus::ClientMetric& a, const prometheus::ClientMetric& b) { return a.label < b.label; });
  }
  return prometheus::TextSerializer().Serialize(families);
}

std::vector<double> MetricsRegistry::latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0};
}

}  // namespace fathom
