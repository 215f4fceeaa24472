#include "server/metrics.h"

#include <fmt/format.h>

#include <algorithm>

namespace vlm::server {

const std::vector<MetricInfo>& metric_list() {
  static const std::vector<MetricInfo> list = {
      {"num_requests_running", "gauge", "Requests in the engine (encoding, prefill or decode)."},
      {"num_requests_waiting", "gauge", "Requests admitted and waiting for a place in the batch."},
      {"kv_cache_bytes", "gauge", "Bytes of KV cache held by running requests."},
      {"kv_cache_usage_perc", "gauge", "KV memory reserved by running requests, as a fraction of the budget (0 without one)."},
      {"prompt_tokens_total", "counter", "Prompt tokens of finished requests (image tokens included)."},
      {"prompt_tokens_cached_total", "counter", "Prompt tokens of finished requests whose rows came from the prefix cache."},
      {"generation_tokens_total", "counter", "Generated tokens."},
      {"request_success_total", "counter", "Finished requests by finish reason (stop, length, cancelled, error)."},
      {"requests_cancelled_total", "counter", "Requests cancelled by a client disconnect, by phase at the cancel."},
      {"tokens_after_cancel_total", "counter", "Tokens generated for a request after its client disconnected."},
      {"requests_rejected_total", "counter", "Requests refused before admission, by HTTP status."},
      {"engine_steps_total", "counter", "Engine steps run."},
      {"images_encoded_total", "counter", "Images (with their crops) run through the vision tower."},
      {"image_cache_hits_total", "counter", "Images whose projector rows came from the image cache instead."},
      {"image_cache_bytes", "gauge", "Bytes of projector rows held by the image cache."},
      {"prefix_cache_bytes", "gauge", "Bytes of finished requests' KV caches held by the prefix cache."},
      {"spec_decode_num_draft_tokens_total", "counter", "Draft ids checked (--draft)."},
      {"spec_decode_num_accepted_tokens_total", "counter", "Draft ids the answers took."},
      {"draft_row_cost", "gauge", "A draft row's cost against a lone decode step, as the engine timed its passes (--draft)."},
      {"time_to_first_token_seconds", "histogram", "Arrival to first generated token."},
      {"inter_token_latency_seconds", "histogram", "Time between two generated tokens of a request."},
      {"e2e_request_latency_seconds", "histogram", "Arrival to finish."},
      {"request_queue_time_seconds", "histogram", "Arrival to the engine taking the request."},
      {"engine_step_seconds", "histogram", "Duration of one engine step."},
  };
  return list;
}

const std::vector<double>& Metrics::latency_buckets() {
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                                        0.5,   0.75,   1.0,   2.5,  5.0,   7.5,  10.0,  20.0, 40.0, 80.0, 160.0,
                                        320.0, 640.0};
  return b;
}

void Metrics::observe(const std::string& histogram, double seconds) {
  const auto& b = latency_buckets();
  std::lock_guard lk(mu_);
  Histogram& h = hist_[histogram];
  if (h.counts.empty()) h.counts.assign(b.size() + 1, 0);
  h.counts[std::lower_bound(b.begin(), b.end(), seconds) - b.begin()]++;
  h.sum += seconds;
  h.n++;
}

void Metrics::add(const std::string& counter, double v, const std::string& labels) {
  std::lock_guard lk(mu_);
  counters_[counter][labels] += v;
}

void Metrics::set(const std::string& gauge, double v) {
  std::lock_guard lk(mu_);
  gauges_[gauge] = v;
}

std::string Metrics::text(const std::string& model) const {
  std::string esc;
  for (char c : model) {
    if (c == '\\' || c == '"') esc += '\\';
    if (c == '\n') { esc += "\\n"; continue; }
    esc += c;
  }
  const std::string base = fmt::format("model_name=\"{}\"", esc);
  auto labels = [&](const std::string& extra) { return "{" + base + (extra.empty() ? "" : "," + extra) + "}"; };
  const auto& b = latency_buckets();
  std::lock_guard lk(mu_);
  std::string out;
  for (const MetricInfo& m : metric_list()) {
    const std::string name = std::string("vlm:") + m.name;
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, m.help, name, m.type);
    const std::string type = m.type;
    if (type == "gauge") {
      auto it = gauges_.find(m.name);
      out += fmt::format("{}{} {}\n", name, labels({}), it == gauges_.end() ? 0.0 : it->second);
    } else if (type == "counter") {
      auto it = counters_.find(m.name);
      if (it == counters_.end() || it->second.empty())
        out += fmt::format("{}{} 0\n", name, labels({}));
      else
        for (const auto& [l, v] : it->second) out += fmt::format("{}{} {}\n", name, labels(l), v);
    } else {
      auto it = hist_.find(m.name);
      const Histogram* h = it == hist_.end() ? nullptr : &it->second;
      uint64_t cum = 0;
      for (size_t i = 0; i <= b.size(); ++i) {
        cum += h ? h->counts[i] : 0;
        const std::string le = i < b.size() ? fmt::format("{}", b[i]) : "+Inf";
        out += fmt::format("{}_bucket{} {}\n", name, labels("le=\"" + le + "\""), cum);
      }
      out += fmt::format("{}_sum{} {}\n{}_count{} {}\n", name, labels({}), h ? h->sum : 0.0, name, labels({}),
                         h ? h->n : 0);
    }
  }
  return out;
}

}  // namespace vlm::server
