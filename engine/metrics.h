#pragma once
// A small Prometheus-style metrics registry (prometheus-cpp is not packaged for Debian 12):
// counters, gauges and histograms, each a family with optional labels, rendered in the text
// exposition format (version 0.0.4). Thread-safe: values are atomics, families are created
// under a mutex and never destroyed, so returned references stay valid.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace fathom {

using Labels = std::map<std::string, std::string>;

class Counter {
 public:
  void inc(double v = 1.0);  // v >= 0
  double value() const { return value_.load(); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double v) { value_.store(v); }
  void inc(double v = 1.0);
  void dec(double v = 1.0) { inc(-v); }
  double value() const { return value_.load(); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);  // sorted, +Inf implied
  void observe(double v);
  const std::vector<double>& bounds() const { return bounds_; }
  // Cumulative counts per bound (+Inf last), sum, count — a consistent-enough snapshot.
  std::vector<uint64_t> cumulative_counts() const;
  double sum() const { return sum_.load(); }
  uint64_t count() const { return count_.load(); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // [bounds + 1], non-cumulative
  std::atomic<double> sum_{0.0};
  std::atomic<uint64_t> count_{0};
};

class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();  // out of line: Family is defined in metrics.cpp
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The same (name, labels) returns the same object. A name is one type with one help text;
  // reusing it with another type throws std::logic_error.
  Counter& counter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& gauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& histogram(const std::string& name, const std::string& help, const std::vector<double>& bounds,
                       const Labels& labels = {});
  // Prometheus text exposition of every family, sorted by name (HELP, TYPE, samples).
  std::string render() const;

  // Bucket helpers: latency buckets in seconds from 1 ms to ~60 s.
  static std::vector<double> latency_buckets();

 private:
  struct Family;
  Family& family(const std::string& name, const std::string& help, const char* type);
  mutable std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Family>> families_;
};

}  // namespace fathom
