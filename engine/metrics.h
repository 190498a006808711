#pragma once
// fathom's metrics interface over prometheus-cpp's core library (Debian: prometheus-cpp-dev):
// counters, gauges and histograms, each a family with optional labels, kept in a
// prometheus::Registry and rendered by prometheus::TextSerializer (text format 0.0.4) for the
// HTTP front end's /metrics. Callers see only the thin types below, so no prometheus header
// leaks into the engine's. Thread-safe: families and series are created under a mutex and never
// removed, so returned references stay valid for the registry's lifetime; updates are
// prometheus-cpp's (atomics; a histogram's observation takes its own lock).
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace fathom {

using Labels = std::map<std::string, std::string>;

class MetricsRegistry;

class Counter {
 public:
  void inc(double v = 1.0);  // v >= 0; a negative or NaN v is dropped
  double value() const;

 private:
  friend class MetricsRegistry;
  explicit Counter(prometheus::Counter& c) : c_(c) {}
  prometheus::Counter& c_;
};

class Gauge {
 public:
  void set(double v);
  void inc(double v = 1.0);
  void dec(double v = 1.0) { inc(-v); }
  double value() const;

 private:
  friend class MetricsRegistry;
  explicit Gauge(prometheus::Gauge& g) : g_(g) {}
  prometheus::Gauge& g_;
};

class Histogram {
 public:
  void observe(double v);  // le is inclusive; NaN counts in +Inf only
  const std::vector<double>& bounds() const { return bounds_; }
  // Cumulative counts per bound (+Inf last), sum and count, each from one consistent snapshot.
  std::vector<uint64_t> cumulative_counts() const;
  double sum() const;
  uint64_t count() const;

 private:
  friend class MetricsRegistry;
  Histogram(prometheus::Histogram& h, std::vector<double> bounds) : h_(h), bounds_(std::move(bounds)) {}
  prometheus::Histogram& h_;
  std::vector<double> bounds_;  // finite, strictly increasing; +Inf implied
};

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();  // out of line: Family and prometheus::Registry are complete in metrics.cpp
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The same (name, labels) returns the same object. A name is one type with one help text (the
  // first one given); reusing it with another type throws std::logic_error, and so does a
  // histogram series whose buckets differ from its family's. Invalid metric or label names
  // throw std::invalid_argument, as do histogram bounds that are not strictly increasing
  // numbers (a trailing +Inf is implied and dropped).
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                       const Labels& labels = {});
  // Prometheus text exposition of every family, sorted by name and each family's series by
  // labels (prometheus-cpp keeps them in registration and hash order).
  std::string render() const;

  // Bucket helpers: latency buckets in seconds from 1 ms to ~60 s.
  static std::vector<double> latency_buckets();

 private:
  struct Family;
  Family& family(const std::string& name, const std::string& help, const char* type);
  std::mutex mutex_;
  std::unique_ptr<prometheus::Registry> registry_;
  std::map<std::string, std::unique_ptr<Family>> families_;
};

}  // namespace fathom
