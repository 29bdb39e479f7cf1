#include "backend/choice_store.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <system_error>
#include <vector>

#include "io/file.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;

constexpr int kFormatVersion = 1;
constexpr uint64_t kMaxStoreBytes = uint64_t(16) << 20;  // thousands of shapes take well under 1 MB
constexpr uint64_t kFnvOffset = 1469598103934665603ull, kFnvPrime = 1099511628211ull;

constexpr uint64_t kMaxTextBytes = uint64_t(64) << 20;   // a serialized plan with its kernels: well under this

std::string fnv_hex(const std::string& s) {
  uint64_t h = kFnvOffset;
  for (unsigned char c : s) h = (h ^ c) * kFnvPrime;
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// The file's name: a hash of the fingerprint, so that stores of different cards or builds sit side by side.
std::string file_name(const std::string& fingerprint) { return "plans-" + fnv_hex(fingerprint) + ".json"; }

// Stores (files and their .texts folders) left unused this long are removed when a store writes its file first: each
// rebuilt binary and new driver starts a store of its own (~1 MB with SD 1.5's serialized plans), and nothing else
// would ever remove the old ones. A store in use is touched at every opening, so only abandoned ones age.
constexpr auto kUnusedStoreAge = std::chrono::hours(24 * 30);

void remove_unused_stores(const fs::path& dir, const fs::path& keep) {
  std::error_code ec;
  const auto cutoff = fs::file_time_type::clock::now() - kUnusedStoreAge;
  std::vector<fs::path> old;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    if (p.filename().string().rfind("plans-", 0) != 0 || p.stem() == keep.stem()) continue;
    if (p.extension() != ".json" && p.extension() != ".texts") continue;
    std::error_code tec;
    const auto when = fs::last_write_time(p.extension() == ".texts" ? fs::path(p).replace_extension(".json") : p, tec);
    if (tec || when < cutoff) old.push_back(p);  // a folder without its file is left over too
  }
  for (const fs::path& p : old) fs::remove_all(p, ec);
}

}  // namespace

ChoiceStore::ChoiceStore(std::string dir, std::string fingerprint) : fingerprint_(std::move(fingerprint)) {
  if (dir.empty()) return;
  path_ = (fs::path(dir) / file_name(fingerprint_)).string();
  choices_ = read_file();
  std::error_code ec;
  if (!choices_.empty()) fs::last_write_time(path_, fs::file_time_type::clock::now(), ec);  // in use (see kUnusedStoreAge)
}

std::map<std::string, int64_t> ChoiceStore::read_file() const {
  std::map<std::string, int64_t> out;
  auto bytes = atelier::read_file(path_, "plan cache", kMaxStoreBytes);
  if (!bytes) return out;  // none yet (or unreadable): planned afresh
  const nlohmann::json j = nlohmann::json::parse(*bytes, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("version", 0) != kFormatVersion || !j.contains("fingerprint") ||
      j["fingerprint"] != fingerprint_ || !j.contains("choices") || !j["choices"].is_object())
    return out;  // another format or a hash collision: ignored, replaced at the next write
  for (const auto& [key, value] : j["choices"].items())
    if (value.is_number_integer()) out[key] = value.get<int64_t>();
  return out;
}

std::optional<int64_t> ChoiceStore::get(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = choices_.find(key);
  if (it == choices_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::pair<std::string, int64_t>> ChoiceStore::with_prefix(const std::string& prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<std::string, int64_t>> out;
  for (auto it = choices_.lower_bound(prefix); it != choices_.end() && it->first.starts_with(prefix); ++it)
    out.emplace_back(it->first, it->second);
  return out;
}

bool ChoiceStore::put(const std::string& key, int64_t value) {
  std::lock_guard<std::mutex> lock(mu_);
  choices_[key] = value;
  if (path_.empty()) return false;
  // What other processes wrote since this one read the file joins ours (ours win on the same key).
  for (const auto& [k, v] : read_file()) choices_.emplace(k, v);
  std::error_code ec;
  if (!fs::exists(path_, ec)) remove_unused_stores(fs::path(path_).parent_path(), path_);
  return write_file_atomically(path_, nlohmann::json{{"version", kFormatVersion}, {"fingerprint", fingerprint_}, {"choices", choices_}}.dump(1));
}

// <store file without ".json">.texts/<hash of the key>.txt, holding the key's line and then the text (the key is
// checked on reading: two keys of one hash do not take each other's text).
std::string ChoiceStore::text_path(const std::string& key) const {
  fs::path folder = path_;
  folder.replace_extension(".texts");
  return (folder / (fnv_hex(key) + ".txt")).string();
}

std::optional<std::string> ChoiceStore::get_text(const std::string& key) const {
  if (path_.empty()) return std::nullopt;
  auto bytes = atelier::read_file(text_path(key), "plan cache text", kMaxTextBytes);
  if (!bytes) return std::nullopt;
  const std::string head = key + "\n";
  if (bytes->compare(0, head.size(), head) != 0) return std::nullopt;
  return bytes->substr(head.size());
}

bool ChoiceStore::put_text(const std::string& key, const std::string& text) {
  if (path_.empty() || key.find('\n') != std::string::npos) return false;
  return write_file_atomically(text_path(key), key + "\n" + text);
}

std::string ChoiceStore::default_dir() { return default_cache_dir(); }

std::string ChoiceStore::executable_identity() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "unknown executable";
  const auto size = fs::file_size(exe, ec);
  const auto mtime = fs::last_write_time(exe, ec).time_since_epoch().count();
  return exe.string() + " " + std::to_string(ec ? 0 : size) + " " + std::to_string(mtime);
}

}  // namespace atelier
