// MetricsRegistry (over prometheus-cpp): text exposition of each type, escaping, identity of
// (name, labels), type conflicts, exact sums under concurrent increments, inclusive histogram
// bucket bounds, and the order of families and series in /metrics.
#include "engine/metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace fathom {
namespace {

// True when `text` contains `line` as a whole line.
bool has_line(const std::string& text, const std::string& line) {
  size_t pos = 0;
  while ((pos = text.find(line, pos)) != std::string::npos) {
    const bool starts = pos == 0 || text[pos - 1] == '\n';
    const size_t end = pos + line.size();
    if (starts && end < text.size() && text[end] == '\n') return true;
    pos = end;
  }
  return false;
}

TEST(Metrics, CounterRendersHelpTypeAndValue) {
  MetricsRegistry reg;
  reg.counter("fathom_things_total", "Things done.").inc();
  reg.counter("fathom_things_total", "Things done.").inc(2.5);
  EXPECT_EQ(reg.render(),
            "# HELP fathom_things_total Things done.\n"
            "# TYPE fathom_things_total counter\n"
            "fathom_things_total 3.5\n");
}

TEST(Metrics, CounterNameIsNotSuffixed) {
  MetricsRegistry reg;
  reg.counter("fathom_bytes", "No suffix added.").inc(7);
  const std::string out = reg.render();
  EXPECT_TRUE(has_line(out, "fathom_bytes 7")) << out;
  EXPECT_EQ(out.find("_total"), std::string::npos) << out;
}

TEST(Metrics, CounterIgnoresNegativeAndNaN) {
  MetricsRegistry reg;
  Counter& c = reg.counter("c_total", "c");
  c.inc(2);
  c.inc(-1);
  c.inc(std::nan(""));
  EXPECT_EQ(c.value(), 2.0);
}

TEST(Metrics, GaugeWithLabels) {
  MetricsRegistry reg;
  reg.gauge("fathom_kv_blocks_used", "Blocks.", {{"tier", "host"}}).set(3);
  Gauge& dev = reg.gauge("fathom_kv_blocks_used", "Blocks.", {{"tier", "device"}});
  dev.inc(5);
  dev.dec(2);
  EXPECT_EQ(reg.render(),
            "# HELP fathom_kv_blocks_used Blocks.\n"
            "# TYPE fathom_kv_blocks_used gauge\n"
            "fathom_kv_blocks_used{tier=\"device\"} 3\n"
            "fathom_kv_blocks_used{tier=\"host\"} 3\n");
}

TEST(Metrics, GaugeSpecialValues) {
  MetricsRegistry reg;
  reg.gauge("a", "a").set(std::numeric_limits<double>::infinity());
  reg.gauge("b", "b").set(-std::numeric_limits<double>::infinity());
  reg.gauge("c", "c").set(std::nan(""));
  reg.gauge("d", "d").set(0.1);
  reg.gauge("e", "e").set(1e-300);
  reg.gauge("f", "f").set(-12345678901234567.0);
  reg.gauge("g", "g").set(123456789012.0);
  const std::string out = reg.render();
  EXPECT_TRUE(has_line(out, "a +Inf")) << out;
  EXPECT_TRUE(has_line(out, "b -Inf")) << out;
  // prometheus-cpp's spelling; Prometheus parses it case-insensitively (Go's ParseFloat).
  EXPECT_TRUE(has_line(out, "c Nan")) << out;
  EXPECT_TRUE(has_line(out, "d 0.1")) << out;
  EXPECT_TRUE(has_line(out, "e 1e-300")) << out;
  EXPECT_TRUE(has_line(out, "g 123456789012")) << out;  // not the stream default's 1.23457e+11
  // prometheus-cpp prints 16 significant digits: the value parses back to within 1e-15 of itself.
  const size_t pos = out.find("\nf ");
  ASSERT_NE(pos, std::string::npos);
  EXPECT_NEAR(std::stod(out.substr(pos + 3)), -12345678901234567.0, 12345678901234567.0 * 1e-15);
}

TEST(Metrics, HistogramRendering) {
  MetricsRegistry reg;
  Histogram& h = reg.histogram("fathom_latency_seconds", "Latency.", {0.005, 0.1, 1}, {{"policy", "dense"}});
  // Binary fractions, so the sum is exact.
  h.observe(0.00390625);
  h.observe(0.0625);
  h.observe(0.5);
  h.observe(3);
  // prometheus-cpp writes _count and _sum before the buckets (the order within a family is free).
  EXPECT_EQ(reg.render(),
            "# HELP fathom_latency_seconds Latency.\n"
            "# TYPE fathom_latency_seconds histogram\n"
            "fathom_latency_seconds_count{policy=\"dense\"} 4\n"
            "fathom_latency_seconds_sum{policy=\"dense\"} 3.56640625\n"
            "fathom_latency_seconds_bucket{policy=\"dense\",le=\"0.005\"} 1\n"
            "fathom_latency_seconds_bucket{policy=\"dense\",le=\"0.1\"} 2\n"
            "fathom_latency_seconds_bucket{policy=\"dense\",le=\"1\"} 3\n"
            "fathom_latency_seconds_bucket{policy=\"dense\",le=\"+Inf\"} 4\n");
}

TEST(Metrics, HistogramSumAndCountCarryLabels) {
  MetricsRegistry reg;
  Histogram& h = reg.histogram("h_seconds", "h", {1}, {{"a", "x"}});
  h.observe(0.25);
  const std::string out = reg.render();
  EXPECT_TRUE(has_line(out, "h_seconds_sum{a=\"x\"} 0.25")) << out;
  EXPECT_TRUE(has_line(out, "h_seconds_count{a=\"x\"} 1")) << out;
  EXPECT_TRUE(has_line(out, "h_seconds_bucket{a=\"x\",le=\"+Inf\"} 1")) << out;
}

TEST(Metrics, HistogramWithoutLabels) {
  MetricsRegistry reg;
  reg.histogram("h", "h", {1, 2}).observe(1.5);
  const std::string out = reg.render();
  EXPECT_TRUE(has_line(out, "h_bucket{le=\"1\"} 0")) << out;
  EXPECT_TRUE(has_line(out, "h_bucket{le=\"2\"} 1")) << out;
  EXPECT_TRUE(has_line(out, "h_bucket{le=\"+Inf\"} 1")) << out;
  EXPECT_TRUE(has_line(out, "h_sum 1.5")) << out;
  EXPECT_TRUE(has_line(out, "h_count 1")) << out;
}

TEST(Metrics, HistogramBoundaryIsInclusive) {
  MetricsRegistry reg;
  Histogram& h = reg.histogram("h", "h", {0.005, 0.01, 1.0});
  h.observe(0.005);  // exactly on a bound: counted in le="0.005"
  h.observe(0.01);
  h.observe(1.0);
  h.observe(std::nextafter(1.0, 2.0));  // just above the last bound: +Inf only
  h.observe(-5);                        // below everything: first bucket
  EXPECT_EQ(h.cumulative_counts(), (std::vector<uint64_t>{2, 3, 4, 5}));
  EXPECT_EQ(h.count(), 5u);
}

TEST(Metrics, HistogramNaNGoesToInfOnly) {
  MetricsRegistry reg;
  Histogram& h = reg.histogram("h", "h", {1.0});
  h.observe(std::nan(""));
  EXPECT_EQ(h.cumulative_counts(), (std::vector<uint64_t>{0, 1}));
  EXPECT_EQ(h.count(), 1u);
  EXPECT_TRUE(std::isnan(h.sum()));
}

TEST(Metrics, HistogramBoundsValidated) {
  MetricsRegistry reg;
  EXPECT_THROW(reg.histogram("h1", "h", {1.0, 1.0}), std::invalid_argument);
  EXPECT_THROW(reg.histogram("h2", "h", {2.0, 1.0}), std::invalid_argument);
  EXPECT_THROW(reg.histogram("h3", "h", {std::nan("")}), std::invalid_argument);
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THROW(reg.histogram("h4", "h", {1.0, inf, inf}), std::invalid_argument);
  Histogram& explicit_inf = reg.histogram("h5", "h", {1.0, inf});  // +Inf is implied; dropped
  EXPECT_EQ(explicit_inf.bounds(), std::vector<double>{1.0});
  explicit_inf.observe(2);
  const std::string out = reg.render();
  EXPECT_TRUE(has_line(out, "h5_bucket{le=\"1\"} 0")) << out;
  EXPECT_TRUE(has_line(out, "h5_bucket{le=\"+Inf\"} 1")) << out;
  const std::string inf_bucket = "h5_bucket{le=\"+Inf\"}";
  EXPECT_EQ(out.find(inf_bucket, out.find(inf_bucket) + 1), std::string::npos) << out;  // +Inf once
  // Failed registrations leave families without series: they render as HELP and TYPE only.
  EXPECT_EQ(out.find("h1_bucket"), std::string::npos) << out;
}

TEST(Metrics, LatencyBucketsAreSortedSeconds) {
  const std::vector<double> b = MetricsRegistry::latency_buckets();
  ASSERT_FALSE(b.empty());
  EXPECT_DOUBLE_EQ(b.front(), 0.001);
  EXPECT_GE(b.back(), 60.0);
  EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
}

TEST(Metrics, HelpAndLabelValuesEscaped) {
  MetricsRegistry reg;
  reg.counter("x_total", "a \\ back\nslash \"quoted\"", {{"path", "C:\\dir\n\"q\""}}).inc();
  const std::string out = reg.render();
  // HELP escapes backslash and newline only; quotes stay as they are.
  EXPECT_TRUE(has_line(out, "# HELP x_total a \\\\ back\\nslash \"quoted\"")) << out;
  EXPECT_TRUE(has_line(out, "x_total{path=\"C:\\\\dir\\n\\\"q\\\"\"} 1")) << out;
}

TEST(Metrics, LabelsRenderSortedByName) {
  MetricsRegistry reg;
  reg.counter("m_total", "m", {{"zeta", "1"}, {"alpha", "2"}}).inc();
  EXPECT_TRUE(has_line(reg.render(), "m_total{alpha=\"2\",zeta=\"1\"} 1"));
}

TEST(Metrics, FamiliesRenderSortedByName) {
  MetricsRegistry reg;
  // prometheus-cpp collects by type (counters, gauges, histograms) in registration order.
  reg.histogram("c_seconds", "c", {1}).observe(1);
  reg.counter("b_total", "b").inc();
  reg.gauge("a_gauge", "a").set(1);
  const std::string out = reg.render();
  EXPECT_LT(out.find("# HELP a_gauge"), out.find("# HELP b_total")) << out;
  EXPECT_LT(out.find("# HELP b_total"), out.find("# HELP c_seconds")) << out;
}

TEST(Metrics, SeriesRenderSortedByLabels) {
  MetricsRegistry reg;
  // prometheus-cpp keeps a family's series in a hash map; render() sorts them.
  std::string want;
  for (int i = 0; i < 40; ++i) {
    const std::string v = std::to_string(100 + i);
    want += "s_total{k=\"" + v + "\"} 1\n";
  }
  for (int i = 39; i >= 0; --i) reg.counter("s_total", "s", {{"k", std::to_string(100 + i)}}).inc();
  reg.counter("s_total", "s").inc();  // no labels sorts first
  EXPECT_EQ(reg.render(), "# HELP s_total s\n# TYPE s_total counter\ns_total 1\n" + want);
}

TEST(Metrics, SameNameAndLabelsReturnSameObject) {
  MetricsRegistry reg;
  EXPECT_EQ(&reg.counter("c_total", "c", {{"k", "v"}}), &reg.counter("c_total", "c", {{"k", "v"}}));
  EXPECT_NE(&reg.counter("c_total", "c", {{"k", "v"}}), &reg.counter("c_total", "c", {{"k", "w"}}));
  EXPECT_NE(&reg.counter("c_total", "c"), &reg.counter("c_total", "c", {{"k", "v"}}));
  EXPECT_EQ(&reg.gauge("g", "g"), &reg.gauge("g", "g"));
  EXPECT_EQ(&reg.histogram("h", "h", {1}), &reg.histogram("h", "h", {1}));
  // The same object also when the help text of a later call differs (the first one wins).
  Counter& first = reg.counter("d_total", "first help");
  EXPECT_EQ(&first, &reg.counter("d_total", "other help"));
  EXPECT_NE(reg.render().find("# HELP d_total first help\n"), std::string::npos);
}

TEST(Metrics, TypeConflictThrows) {
  MetricsRegistry reg;
  reg.counter("thing", "t");
  EXPECT_THROW(reg.gauge("thing", "t"), std::logic_error);
  EXPECT_THROW(reg.histogram("thing", "t", {1}), std::logic_error);
  reg.gauge("level", "l");
  EXPECT_THROW(reg.counter("level", "l"), std::logic_error);
  reg.histogram("lat", "l", {1, 2}, {{"a", "1"}});
  EXPECT_THROW(reg.histogram("lat", "l", {1, 3}, {{"a", "2"}}), std::logic_error);  // other buckets
  // The registry still renders after the failed calls.
  EXPECT_NE(reg.render().find("# TYPE thing counter"), std::string::npos);
}

TEST(Metrics, InvalidNamesThrow) {
  MetricsRegistry reg;
  EXPECT_THROW(reg.counter("", "x"), std::invalid_argument);
  EXPECT_THROW(reg.counter("9lives", "x"), std::invalid_argument);
  EXPECT_THROW(reg.counter("has-dash", "x"), std::invalid_argument);
  EXPECT_THROW(reg.counter("ok_total", "x", {{"bad-label", "v"}}), std::invalid_argument);
  EXPECT_THROW(reg.counter("ok_total", "x", {{"__reserved", "v"}}), std::invalid_argument);
  EXPECT_THROW(reg.histogram("h", "x", {1}, {{"le", "1"}}), std::invalid_argument);
  // A failed series leaves nothing behind that would break rendering.
  reg.counter("ok_total", "x").inc();
  EXPECT_TRUE(has_line(reg.render(), "ok_total 1"));
}

TEST(Metrics, ConcurrentIncrementsSumExactly) {
  MetricsRegistry reg;
  constexpr int kThreads = 8;
  constexpr int kIters = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&reg, t] {
      for (int i = 0; i < kIters; ++i) {
        // Look-ups from many threads too: registration is under the registry's mutex.
        reg.counter("n_total", "n").inc();
        reg.gauge("g", "g").inc(0.5);  // exact in binary floating point
        reg.histogram("h", "h", {0.5}).observe(t % 2 ? 1.0 : 0.25);
        if (i % 1000 == 0) (void)reg.render();
      }
    });
  }
  for (auto& th : threads) th.join();
  const double total = double(kThreads) * kIters;
  EXPECT_EQ(reg.counter("n_total", "n").value(), total);
  EXPECT_EQ(reg.gauge("g", "g").value(), total * 0.5);
  Histogram& h = reg.histogram("h", "h", {0.5});
  EXPECT_EQ(h.count(), uint64_t(total));
  EXPECT_EQ(h.cumulative_counts(), (std::vector<uint64_t>{uint64_t(total / 2), uint64_t(total)}));
  EXPECT_EQ(h.sum(), (total / 2) * 1.0 + (total / 2) * 0.25);
}

}  // namespace
}  // namespace fathom
