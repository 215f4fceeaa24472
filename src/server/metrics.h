// Prometheus text exposition (format 0.0.4) of the server's counters, gauges and
// histograms, under vLLM's names with a `vlm:` prefix (vLLM docs/design/metrics.md).
// Thread-safe: the scheduler thread and the HTTP threads update it, /metrics reads it.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace vlm::server {

class Metrics {
 public:
  // Latency buckets sized for CPU inference: milliseconds for a decode step of a small model,
  // up to minutes for a long prompt with images on a big one.
  static const std::vector<double>& latency_buckets();

  void observe(const std::string& histogram, double seconds);
  void add(const std::string& counter, double v = 1, const std::string& labels = {});
  void set(const std::string& gauge, double v);

  // The exposition text; `model` labels every sample (model_name="...").
  std::string text(const std::string& model) const;

 private:
  struct Histogram {
    std::vector<uint64_t> counts;  // per bucket (not cumulative), then +Inf
    double sum = 0;
    uint64_t n = 0;
  };
  mutable std::mutex mu_;
  std::map<std::string, Histogram> hist_;
  std::map<std::string, std::map<std::string, double>> counters_;  // name → labels → value
  std::map<std::string, double> gauges_;
};

// Names and help texts of everything the server exports (one list, so /metrics always shows
// every series, zeros included, and tests can find them before the first request).
struct MetricInfo {
  const char* name;
  const char* type;  // counter | gauge | histogram
  const char* help;
};
const std::vector<MetricInfo>& metric_list();

}  // namespace vlm::server
