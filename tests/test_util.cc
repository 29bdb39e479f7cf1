#include "test_util.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "backend/cpu/cpu_backend.h"
#include "io/safetensors.h"

namespace atelier::test {

ChannelsLastOnCpu::ChannelsLastOnCpu() { cpu_backend().set_channels_last_for_tests(true); }
ChannelsLastOnCpu::~ChannelsLastOnCpu() { cpu_backend().set_channels_last_for_tests(false); }

std::optional<std::filesystem::path> fixtures_root() {
  if (const char* env = std::getenv("ATELIER_FIXTURES"); env && *env) {
    if (std::filesystem::is_directory(env)) return std::filesystem::path(env);
    return std::nullopt;
  }
  std::filesystem::path p(ATELIER_DEFAULT_FIXTURES);
  if (std::filesystem::is_directory(p)) return p;
  return std::nullopt;
}

std::optional<std::filesystem::path> fixture(const std::string& name) {
  auto root = fixtures_root();
  if (!root) return std::nullopt;
  auto p = *root / name;
  if (!std::filesystem::is_directory(p)) return std::nullopt;
  return p;
}

Tensor golden(const std::string& name, const std::string& key) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<SafeTensorsFile>> files;
  std::lock_guard<std::mutex> lock(mu);
  auto& f = files[name];
  if (!f) {
    auto dir = fixture(name);
    if (!dir) throw Error("fixture " + name + " missing");
    f = SafeTensorsFile::open((*dir / "golden.safetensors").string()).value();
  }
  return f->load(key, DType::F32).value();
}

std::vector<trace::Event> top_level_ops(const std::function<void()>& fn) {
  trace::Recorder rec(trace::bit(trace::Category::kOp));
  {
    trace::ThreadAttach attach(rec);
    fn();
  }
  std::vector<trace::Event> out;
  for (const trace::Event& e : rec.events())
    if (e.depth == 0) out.push_back(e);
  return out;
}

std::map<std::string, int> count_by_name(const std::vector<trace::Event>& ops) {
  std::map<std::string, int> n;
  for (const trace::Event& e : ops) ++n[e.name];
  return n;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double d = double(a[i]) - double(b[i]);
    if (std::isnan(a[i])) return INFINITY;
    num += d * d;
    den += double(b[i]) * double(b[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isnan(a[i])) return INFINITY;
    m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  }
  return m;
}

}  // namespace atelier::test
