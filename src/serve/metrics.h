// One registry of live figures that feeds both /metrics (Prometheus text format 0.0.4) and /v1/stats (JSON),
// so no figure is computed twice. Counters and histograms are updated where things happen (HTTP layer,
// scheduler, workers); gauges that describe a state (queue depth, device health, NVML readings) are refreshed
// by collectors right before each scrape.
#pragma once
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace atelier::serve {

using Labels = std::vector<std::pair<std::string, std::string>>;

enum class MetricType { kCounter, kGauge, kHistogram };

// Names of every metric the server exports (all prefixed atelier_), declared by declare_serve_metrics.
namespace metric {
inline constexpr const char* kHttpRequests = "atelier_http_requests_total";         // {endpoint, status}
inline constexpr const char* kJobs = "atelier_jobs_total";                           // {state}
inline constexpr const char* kQueueDepth = "atelier_queue_depth";
inline constexpr const char* kQueueCapacity = "atelier_queue_capacity";
inline constexpr const char* kJobsStored = "atelier_jobs_stored";
inline constexpr const char* kQueueWait = "atelier_queue_wait_seconds";
inline constexpr const char* kLatency = "atelier_request_latency_seconds";
inline constexpr const char* kStage = "atelier_stage_seconds";                      // {stage}
inline constexpr const char* kImages = "atelier_images_total";
inline constexpr const char* kSteps = "atelier_steps_total";
inline constexpr const char* kModelCalls = "atelier_model_calls_total";             // {device}
inline constexpr const char* kBatchSize = "atelier_batch_size";
inline constexpr const char* kDeviceHealthy = "atelier_device_healthy";             // {device} (worker label)
inline constexpr const char* kDeviceBusy = "atelier_device_busy_ratio";
inline constexpr const char* kDeviceBusySeconds = "atelier_device_busy_seconds_total";
inline constexpr const char* kDeviceFailures = "atelier_device_failures_total";
inline constexpr const char* kDeviceActive = "atelier_device_active_samples";
inline constexpr const char* kDeviceOutstanding = "atelier_device_outstanding_work";
inline constexpr const char* kModelsLoaded = "atelier_models_loaded";
inline constexpr const char* kRequeued = "atelier_jobs_requeued_total";
inline constexpr const char* kGpuUtil = "atelier_gpu_utilization_ratio";
inline constexpr const char* kGpuMemUsed = "atelier_gpu_memory_used_bytes";
inline constexpr const char* kGpuMemTotal = "atelier_gpu_memory_total_bytes";
inline constexpr const char* kGpuTemp = "atelier_gpu_temperature_celsius";
inline constexpr const char* kGpuPower = "atelier_gpu_power_watts";
inline constexpr const char* kGpuSmClock = "atelier_gpu_sm_clock_hertz";
inline constexpr const char* kGpuEnergy = "atelier_gpu_energy_joules_total";
inline constexpr const char* kResident = "atelier_process_resident_bytes";
inline constexpr const char* kUptime = "atelier_uptime_seconds";
}  // namespace metric

class MetricsRegistry {
 public:
  void declare(const std::string& name, MetricType type, const std::string& help,
               std::vector<double> buckets = {});
  // Updates; an undeclared name is an internal error (throws atelier::Error).
  void inc(const std::string& name, const Labels& labels = {}, double v = 1.0);
  void set(const std::string& name, const Labels& labels, double v);
  void observe(const std::string& name, const Labels& labels, double v);
  // Removes every series of a gauge (before a collector re-adds the live ones).
  void clear(const std::string& name);

  // Collectors run (outside the registry lock) before each rendering.
  void add_collector(std::function<void(MetricsRegistry&)> collector);

  std::string prometheus_text();
  // {name: {type, help, series: [{labels: {...}, value} | {labels, count, sum, buckets: {le: n}}]}}
  nlohmann::json to_json();

  // Current value of a counter/gauge series, or a histogram's count (0 when absent); for stats and tests.
  double value(const std::string& name, const Labels& labels = {});
  // A histogram series' mean (sum / count), 0 when empty.
  double mean(const std::string& name, const Labels& labels = {});
  // Sum over every series of a counter/gauge family (histograms: total count).
  double total(const std::string& name);

 private:
  struct Series {
    double value = 0;
    std::vector<uint64_t> buckets;  // per bucket (not cumulative)
    double sum = 0;
    uint64_t count = 0;
  };
  struct Family {
    MetricType type = MetricType::kCounter;
    std::string help;
    std::vector<double> bounds;
    std::map<Labels, Series> series;
  };
  Family& family(const std::string& name, MetricType expected);
  void run_collectors();

  std::mutex mu_;
  std::map<std::string, Family> families_;
  std::mutex collectors_mu_;
  std::vector<std::function<void(MetricsRegistry&)>> collectors_;
};

// Declares every metric in the `metric` namespace with its help text and buckets.
void declare_serve_metrics(MetricsRegistry& r);

// Resident set size of this process in bytes (/proc/self/statm), 0 when unavailable.
double resident_bytes();

}  // namespace atelier::serve
