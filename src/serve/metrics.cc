#include "serve/metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/status.h"

namespace atelier::serve {
namespace {

const std::vector<double> kLatencyBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
const std::vector<double> kBatchBuckets = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64};

const char* type_name(MetricType t) {
  switch (t) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

std::string escape_label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string format_number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string label_text(const Labels& labels, const std::string& extra_key = {}, const std::string& extra = {}) {
  if (labels.empty() && extra_key.empty()) return {};
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    out += (first ? "" : ",") + k + "=\"" + escape_label(v) + "\"";
    first = false;
  }
  if (!extra_key.empty()) out += (first ? "" : ",") + extra_key + "=\"" + extra + "\"";
  return out + "}";
}

Labels sorted(Labels l) {
  std::sort(l.begin(), l.end());
  return l;
}

}  // namespace

void MetricsRegistry::declare(const std::string& name, MetricType type, const std::string& help,
                              std::vector<double> buckets) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = families_[name];
  f.type = type;
  f.help = help;
  f.bounds = std::move(buckets);
}

MetricsRegistry::Family& MetricsRegistry::family(const std::string& name, MetricType expected) {
  auto it = families_.find(name);
  ATELIER_CHECK(it != families_.end(), "metric " + name + " is not declared");
  ATELIER_CHECK(it->second.type == expected || (expected == MetricType::kGauge && it->second.type == MetricType::kCounter),
                "metric " + name + " used with the wrong type");
  return it->second;
}

void MetricsRegistry::inc(const std::string& name, const Labels& labels, double v) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  ATELIER_CHECK(it != families_.end() && it->second.type != MetricType::kHistogram, "metric " + name + " cannot be incremented");
  it->second.series[sorted(labels)].value += v;
}

void MetricsRegistry::set(const std::string& name, const Labels& labels, double v) {
  std::lock_guard<std::mutex> lock(mu_);
  family(name, MetricType::kGauge).series[sorted(labels)].value = v;
}

void MetricsRegistry::observe(const std::string& name, const Labels& labels, double v) {
  std::lock_guard<std::mutex> lock(mu_);
  Family& f = family(name, MetricType::kHistogram);
  Series& s = f.series[sorted(labels)];
  if (s.buckets.empty()) s.buckets.assign(f.bounds.size(), 0);
  const auto b = std::lower_bound(f.bounds.begin(), f.bounds.end(), v);  // first bound >= v: le semantics
  if (b != f.bounds.end()) ++s.buckets[size_t(b - f.bounds.begin())];
  s.sum += v;
  ++s.count;
}

void MetricsRegistry::clear(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it != families_.end()) it->second.series.clear();
}

void MetricsRegistry::add_collector(std::function<void(MetricsRegistry&)> collector) {
  std::lock_guard<std::mutex> lock(collectors_mu_);
  collectors_.push_back(std::move(collector));
}

void MetricsRegistry::run_collectors() {
  std::lock_guard<std::mutex> lock(collectors_mu_);  // one scrape at a time refreshes the gauges
  for (auto& c : collectors_) c(*this);
}

std::string MetricsRegistry::prometheus_text() {
  run_collectors();
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream out;
  for (const auto& [name, f] : families_) {
    if (f.series.empty()) continue;
    out << "# HELP " << name << ' ' << f.help << "\n# TYPE " << name << ' ' << type_name(f.type) << '\n';
    for (const auto& [labels, s] : f.series) {
      if (f.type != MetricType::kHistogram) {
        out << name << label_text(labels) << ' ' << format_number(s.value) << '\n';
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t b = 0; b < f.bounds.size(); ++b) {
        cumulative += s.buckets.empty() ? 0 : s.buckets[b];
        out << name << "_bucket" << label_text(labels, "le", format_number(f.bounds[b])) << ' ' << cumulative << '\n';
      }
      out << name << "_bucket" << label_text(labels, "le", "+Inf") << ' ' << s.count << '\n';
      out << name << "_sum" << label_text(labels) << ' ' << format_number(s.sum) << '\n';
      out << name << "_count" << label_text(labels) << ' ' << s.count << '\n';
    }
  }
  return out.str();
}

nlohmann::json MetricsRegistry::to_json() {
  run_collectors();
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, f] : families_) {
    nlohmann::json series = nlohmann::json::array();
    for (const auto& [labels, s] : f.series) {
      nlohmann::json j = {{"labels", nlohmann::json::object()}};
      for (const auto& [k, v] : labels) j["labels"][k] = v;
      if (f.type == MetricType::kHistogram) {
        j["count"] = s.count;
        j["sum"] = s.sum;
        j["mean"] = s.count ? s.sum / double(s.count) : 0.0;
        nlohmann::json b = nlohmann::json::object();
        uint64_t cumulative = 0;
        for (size_t i = 0; i < f.bounds.size(); ++i) {
          cumulative += s.buckets.empty() ? 0 : s.buckets[i];
          b[format_number(f.bounds[i])] = cumulative;
        }
        j["buckets"] = b;
      } else {
        j["value"] = s.value;
      }
      series.push_back(j);
    }
    out[name] = {{"type", type_name(f.type)}, {"help", f.help}, {"series", series}};
  }
  return out;
}

double MetricsRegistry::value(const std::string& name, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  auto s = it->second.series.find(sorted(labels));
  if (s == it->second.series.end()) return 0;
  return it->second.type == MetricType::kHistogram ? double(s->second.count) : s->second.value;
}

double MetricsRegistry::mean(const std::string& name, const Labels& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  auto s = it->second.series.find(sorted(labels));
  if (s == it->second.series.end() || s->second.count == 0) return 0;
  return s->second.sum / double(s->second.count);
}

double MetricsRegistry::total(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  double sum = 0;
  for (const auto& [l, s] : it->second.series) sum += it->second.type == MetricType::kHistogram ? double(s.count) : s.value;
  return sum;
}

void declare_serve_metrics(MetricsRegistry& r) {
  using T = MetricType;
  namespace m = metric;
  r.declare(m::kHttpRequests, T::kCounter, "HTTP requests answered, by endpoint and status code");
  r.declare(m::kJobs, T::kCounter, "Jobs by outcome: submitted, rejected (queue full), done, failed, cancelled, timed_out");
  r.declare(m::kQueueDepth, T::kGauge, "Jobs waiting in the queue for a device");
  r.declare(m::kQueueCapacity, T::kGauge, "Jobs the queue accepts before answering 429");
  r.declare(m::kJobsStored, T::kGauge, "Jobs the job store holds (unfinished plus finished results kept for polling)");
  r.declare(m::kQueueWait, T::kHistogram, "Seconds from submission to the first model call", kLatencyBuckets);
  r.declare(m::kLatency, T::kHistogram, "Seconds from submission to the finished result (end to end)", kLatencyBuckets);
  r.declare(m::kStage, T::kHistogram,
            "Seconds per stage: model_load, text_encode, init_encode (img2img VAE encode), model_call (one batched "
            "denoising call), vae_decode, image_encode (PNG/JPEG/WebP on the host pool)", kLatencyBuckets);
  r.declare(m::kImages, T::kCounter, "Images finished");
  r.declare(m::kSteps, T::kCounter, "Denoising model calls summed over samples (one per sample per call)");
  r.declare(m::kModelCalls, T::kCounter, "Batched denoising model calls, by device");
  r.declare(m::kBatchSize, T::kHistogram, "Samples per batched denoising model call", kBatchBuckets);
  r.declare(m::kDeviceHealthy, T::kGauge, "1 when the device worker is healthy, 0 while it is out of service");
  r.declare(m::kDeviceBusy, T::kGauge, "Fraction of the last window the device worker spent computing");
  r.declare(m::kDeviceBusySeconds, T::kCounter, "Seconds the device worker spent computing");
  r.declare(m::kDeviceFailures, T::kCounter, "Device failures (the worker's jobs were re-queued)");
  r.declare(m::kDeviceActive, T::kGauge, "Samples assigned to the device worker");
  r.declare(m::kDeviceOutstanding, T::kGauge, "Estimated outstanding work of the device worker (model calls x pixels)");
  r.declare(m::kModelsLoaded, T::kGauge, "Models resident on the device worker");
  r.declare(m::kRequeued, T::kCounter, "Jobs handed back to the queue after a device failure");
  r.declare(m::kGpuUtil, T::kGauge, "NVML GPU utilisation (0..1)");
  r.declare(m::kGpuMemUsed, T::kGauge, "NVML device memory used");
  r.declare(m::kGpuMemTotal, T::kGauge, "NVML device memory total");
  r.declare(m::kGpuTemp, T::kGauge, "NVML GPU temperature");
  r.declare(m::kGpuPower, T::kGauge, "NVML power draw");
  r.declare(m::kGpuSmClock, T::kGauge, "NVML SM clock");
  r.declare(m::kGpuEnergy, T::kCounter, "NVML energy used by the GPU since its driver loaded (Volta and newer)");
  r.declare(m::kResident, T::kGauge, "Resident set size of the server process");
  r.declare(m::kUptime, T::kGauge, "Seconds since the server started");
}

double resident_bytes() {
  std::ifstream f("/proc/self/statm");
  long long size = 0, resident = 0;
  if (!(f >> size >> resident)) return 0;
  return double(resident) * double(sysconf(_SC_PAGESIZE));
}

}  // namespace atelier::serve
