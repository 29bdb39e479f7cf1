#include "pipeline/bench_kernels.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include <fmt/printf.h>

#include "backend/kernel_tracer.h"
#include "pipeline/sd_bench.h"

namespace atelier {
namespace {

constexpr double kPercent = 100.0;
constexpr double kNsPerMs = 1e6;
constexpr size_t kNameColumns = 90;  // text table: longer names are cut (the JSON keeps them whole)

using trace::Category;
using trace::Event;

// A call's device span on the host clock (ns): the event timer's span where resolved, else the host range.
std::pair<int64_t, int64_t> call_span(const Event& call, int64_t origin_ns) {
  if (call.device_dur_us < 0) return {call.start_ns, call.start_ns + call.dur_ns};
  const int64_t start = origin_ns + int64_t(call.device_start_us * 1e3);
  return {start, start + int64_t(call.device_dur_us * 1e3)};
}

// Seconds covered by the union of the kernels that start inside [from_ns, to_ns), clipped to it.
double kernel_union_seconds(const std::vector<const Event*>& kernels, int64_t from_ns, int64_t to_ns) {
  std::vector<std::pair<int64_t, int64_t>> spans;
  for (const Event* k : kernels)
    if (k->start_ns >= from_ns && k->start_ns < to_ns) spans.emplace_back(k->start_ns, std::min(k->start_ns + k->dur_ns, to_ns));
  std::sort(spans.begin(), spans.end());
  int64_t busy = 0, end = from_ns;
  for (const auto& [s, t] : spans) {
    if (t <= end) continue;
    busy += t - std::max(s, end);
    end = t;
  }
  return double(busy) * 1e-9;
}

}  // namespace

std::optional<KernelFigures> summarize_kernels(const std::vector<Event>& ev, int64_t origin_ns, const char* call_range,
                                               int64_t window_from_ns, int64_t window_to_ns) {
  std::vector<const Event*> kernels, copies;
  for (const Event& e : ev)
    if (e.category == Category::kKernel) (is_copy_activity(e) ? copies : kernels).push_back(&e);
  const auto by_start = [](const Event* a, const Event* b) { return a->start_ns < b->start_ns; };
  std::sort(kernels.begin(), kernels.end(), by_start);
  KernelFigures f;
  std::vector<double> counts, sums, spans, idles, unions, copy_counts, copy_sums;
  std::vector<int64_t> firsts;  // each call's first kernel
  std::map<std::string, KernelGroup> groups;
  double total_ms = 0;
  for (const Event* call : trace::named(ev, call_range)) {
    const auto [from, to] = call_span(*call, origin_ns);
    auto it = std::lower_bound(kernels.begin(), kernels.end(), from, [](const Event* k, int64_t t) { return k->start_ns < t; });
    std::vector<const Event*> mine;
    for (; it != kernels.end() && (*it)->start_ns < to; ++it) mine.push_back(*it);
    if (mine.empty()) continue;
    double sum_ms = 0;
    int64_t last_end = 0;
    for (const Event* k : mine) {
      const double ms = double(k->dur_ns) / kNsPerMs;
      sum_ms += ms;
      last_end = std::max(last_end, k->start_ns + k->dur_ns);
      KernelGroup& g = groups[k->name];
      g.count_per_call += 1;
      g.ms_per_call += ms;
    }
    const int64_t first = mine.front()->start_ns;
    firsts.push_back(first);
    const double span_ms = double(last_end - first) / kNsPerMs;
    counts.push_back(double(mine.size()));
    sums.push_back(sum_ms);
    spans.push_back(span_ms);
    unions.push_back(kernel_union_seconds(mine, first, last_end + 1) * 1e3);
    idles.push_back(span_ms - unions.back());
    double copy_count = 0, copy_ms = 0;
    for (const Event* c : copies)
      if (c->start_ns >= from && c->start_ns < to) copy_count += 1, copy_ms += double(c->dur_ns) / kNsPerMs;
    copy_counts.push_back(copy_count);
    copy_sums.push_back(copy_ms);
    total_ms += sum_ms;
    ++f.calls;
  }
  if (f.calls == 0) return std::nullopt;
  f.kernels_per_call = bench_median(counts);
  f.kernel_ms_per_call = bench_median(sums);
  f.span_ms_per_call = bench_median(spans);
  f.idle_ms_per_call = bench_median(idles);
  f.union_ms_per_call = bench_median(unions);
  f.copies_per_call = bench_median(copy_counts);
  f.copy_ms_per_call = bench_median(copy_sums);
  if (window_to_ns > window_from_ns) {
    // The kernels' union over [from, to) as a share of it.
    const auto busy = [&](int64_t from, int64_t to) { return kPercent * kernel_union_seconds(kernels, from, to) / (double(to - from) * 1e-9); };
    f.busy_pct = busy(window_from_ns, window_to_ns);
    std::sort(firsts.begin(), firsts.end());
    const int64_t steady_from = firsts.size() >= 2 ? std::max(firsts[1], window_from_ns) : window_to_ns;
    if (steady_from < window_to_ns) f.steady_busy_pct = busy(steady_from, window_to_ns);
    for (const Event* c : copies)
      if (c->start_ns >= window_from_ns && c->start_ns < window_to_ns) ++f.window_copies, f.window_copy_ms += double(c->dur_ns) / kNsPerMs;
  }
  for (auto& [name, g] : groups) {
    g.name = name;
    g.mean_us = g.ms_per_call * 1e3 / g.count_per_call;
    g.share_pct = total_ms > 0 ? kPercent * g.ms_per_call / total_ms : 0;
    g.count_per_call /= f.calls;
    g.ms_per_call /= f.calls;
    f.top.push_back(g);
  }
  std::sort(f.top.begin(), f.top.end(), [](const KernelGroup& a, const KernelGroup& b) { return a.ms_per_call > b.ms_per_call; });
  if (f.top.size() > kTopKernelGroups) f.top.resize(kTopKernelGroups);
  return f;
}

nlohmann::json KernelFigures::to_json() const {
  nlohmann::json groups = nlohmann::json::array();
  for (const KernelGroup& g : top)
    groups.push_back({{"name", g.name}, {"count_per_call", g.count_per_call}, {"ms_per_call", g.ms_per_call}, {"mean_us", g.mean_us},
                      {"share_pct", g.share_pct}});
  return {{"calls", calls},
          {"kernels_per_call", kernels_per_call},
          {"kernel_ms_per_call", kernel_ms_per_call},
          {"span_ms_per_call", span_ms_per_call},
          {"idle_ms_per_call", idle_ms_per_call},
          {"union_ms_per_call", union_ms_per_call},
          {"busy_pct", busy_pct ? nlohmann::json(*busy_pct) : nlohmann::json(nullptr)},
          {"steady_busy_pct", steady_busy_pct ? nlohmann::json(*steady_busy_pct) : nlohmann::json(nullptr)},
          {"copies_per_call", copies_per_call},
          {"copy_ms_per_call", copy_ms_per_call},
          {"window_copies", window_copies},
          {"window_copy_ms", window_copy_ms},
          {"top", std::move(groups)}};
}

std::string KernelFigures::to_text(const std::string& call) const {
  std::string s = "kernels           " + fmt::sprintf("%.0f", kernels_per_call) + " per " + call + " call, " + fmt::sprintf("%.3f ms", kernel_ms_per_call) +
                  " of kernel time in a " + fmt::sprintf("%.3f ms", span_ms_per_call) + " span: the device idle " +
                  fmt::sprintf("%.3f ms", idle_ms_per_call) + " between them (medians over " + std::to_string(calls) + " calls";
  if (busy_pct) s += fmt::sprintf("; kernels busy %.1f%% of the denoise loop", *busy_pct);
  if (busy_pct && steady_busy_pct) s += fmt::sprintf(", %.1f%% from its second call on", *steady_busy_pct);
  s += ", CUPTI)\n";
  if (copies_per_call > 0 || window_copies > 0)
    s += "copies            " + fmt::sprintf("%.0f per %s call (%.3f ms); %d in the denoise loop (%.3f ms): ", copies_per_call, call,
                                             copy_ms_per_call, window_copies, window_copy_ms) +
         "copy engines' memcpys and memsets, not in the kernel figures\n";
  s += "  ms/call  share  count  mean us  kernel\n";
  for (const KernelGroup& g : top) {
    const std::string name = g.name.size() > kNameColumns ? g.name.substr(0, kNameColumns - 3) + "..." : g.name;
    char line[256];
    std::snprintf(line, sizeof(line), "  %7.3f %5.1f%% %6.1f %8.1f  ", g.ms_per_call, g.share_pct, g.count_per_call, g.mean_us);
    s += line + name + "\n";
  }
  return s;
}

}  // namespace atelier
