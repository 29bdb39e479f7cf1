#include "io/hash.h"

#include <openssl/evp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <system_error>
#include <vector>

namespace atelier {
namespace {

namespace fs = std::filesystem;

constexpr size_t kFileChunkBytes = size_t(1) << 20;  // streaming read size
constexpr int kHashCacheVersion = 1;
// The cache holds a line per checkpoint file; more entries than any model folder would hold are not kept (the
// oldest are dropped first).
constexpr size_t kMaxCachedHashes = 4096;
constexpr uint64_t kMaxHashCacheBytes = uint64_t(4) << 20;

std::string to_hex(const uint8_t* p, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kDigits[p[i] >> 4];
    s[2 * i + 1] = kDigits[p[i] & 0xf];
  }
  return s;
}

// What identifies a file's contents without reading them: its size and modification time (nanoseconds).
struct FileStamp {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

std::optional<FileStamp> stamp_of(const std::string& file) {
  std::error_code ec;
  const uint64_t size = fs::file_size(file, ec);
  if (ec) return std::nullopt;
  const auto mtime = fs::last_write_time(file, ec);
  if (ec) return std::nullopt;
  return FileStamp{size, int64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(mtime.time_since_epoch()).count())};
}

// The cache's entries ({"files": {path: {"size", "mtime_ns", "sha256", "used"}}}); empty when it is missing or not
// ours (it is then replaced at the next write).
nlohmann::json read_hash_cache(const std::string& path) {
  auto bytes = read_file(path, "model hash cache", kMaxHashCacheBytes);
  if (!bytes) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(*bytes, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("version", 0) != kHashCacheVersion || !j.contains("files") || !j["files"].is_object())
    return nlohmann::json::object();
  nlohmann::json files = j["files"];
  for (auto it = files.begin(); it != files.end();) it = it->is_object() ? std::next(it) : files.erase(it);  // not ours
  return files;
}

std::optional<std::string> cached_digest(const nlohmann::json& files, const std::string& key, const FileStamp& st) {
  const auto it = files.find(key);
  if (it == files.end()) return std::nullopt;
  const nlohmann::json& e = *it;
  if (e.value("size", uint64_t(0)) != st.size || e.value("mtime_ns", int64_t(0)) != st.mtime_ns) return std::nullopt;
  const std::string digest = e.value("sha256", std::string());
  if (digest.size() != 2 * Sha256::kDigestBytes || digest.find_first_not_of("0123456789abcdef") != std::string::npos)
    return std::nullopt;
  return digest;
}

// Adds (or refreshes) `key`'s entry, merged with what other processes wrote since; the least recently hashed entries
// go beyond kMaxCachedHashes. A cache that cannot be written costs the next process a hash, nothing else.
void keep_digest(const std::string& cache_path, const std::string& key, const FileStamp& st, const std::string& digest) {
  static std::mutex mu;  // one writer per process; processes merge through the rename
  std::lock_guard<std::mutex> lock(mu);
  nlohmann::json files = read_hash_cache(cache_path);
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  files[key] = {{"size", st.size}, {"mtime_ns", st.mtime_ns}, {"sha256", digest}, {"used", now}};
  while (files.size() > kMaxCachedHashes) {
    auto oldest = files.begin();
    for (auto it = files.begin(); it != files.end(); ++it)
      if (it->value("used", int64_t(0)) < oldest->value("used", int64_t(0))) oldest = it;
    files.erase(oldest);
  }
  write_file_atomically(cache_path, nlohmann::json{{"version", kHashCacheVersion}, {"files", files}}.dump(1));
}

// The SHA-256 of `file`, from the cache in `cache_dir` when it holds the file unchanged, else read (and kept there).
Expected<std::string> cached_file_sha256(const std::string& file, const std::string& cache_dir, const std::atomic<bool>* stop) {
  const std::optional<FileStamp> st = cache_dir.empty() ? std::nullopt : stamp_of(file);
  if (!st) return file_sha256(file, stop);
  std::error_code ec;
  const fs::path canonical = fs::canonical(file, ec);
  const std::string key = ec ? file : canonical.string();
  const std::string cache_path = model_hash_cache_path(cache_dir);
  if (std::optional<std::string> d = cached_digest(read_hash_cache(cache_path), key, *st)) return *d;
  ATELIER_ASSIGN_OR_RETURN(std::string digest, file_sha256(file, stop));
  // Kept only if the file did not change while it was read.
  if (stamp_of(file) == st) keep_digest(cache_path, key, *st, digest);
  return digest;
}

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1)
    throw Error(internal_error("SHA-256: OpenSSL's digest could not be set up"));
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }

void Sha256::update(const void* data, size_t bytes) {
  if (bytes > 0 && EVP_DigestUpdate(ctx_, data, bytes) != 1) throw Error(internal_error("SHA-256: OpenSSL's update failed"));
}

std::array<uint8_t, Sha256::kDigestBytes> Sha256::finish() {
  std::array<uint8_t, kDigestBytes> out{};
  unsigned int n = 0;
  if (EVP_DigestFinal_ex(ctx_, out.data(), &n) != 1 || n != kDigestBytes)
    throw Error(internal_error("SHA-256: OpenSSL's final step failed"));
  return out;
}

std::string Sha256::hex_digest() {
  const auto d = finish();
  return to_hex(d.data(), d.size());
}

std::string sha256_hex(std::string_view data) {
  Sha256 h;
  h.update(data);
  return h.hex_digest();
}

Expected<std::string> file_sha256(const std::string& path, const std::atomic<bool>* stop) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return not_found(path + ": no such file");
  if (!std::filesystem::is_regular_file(path, ec)) return invalid_argument(path + ": not a regular file");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) return invalid_argument(path + ": cannot open for reading");
  std::vector<uint8_t> chunk(kFileChunkBytes);
  Sha256 h;
  size_t n = 0;
  while ((n = std::fread(chunk.data(), 1, chunk.size(), f.get())) > 0) {
    if (stop && stop->load(std::memory_order_relaxed)) return cancelled(path + ": hashing stopped");
    h.update(chunk.data(), n);
  }
  if (std::ferror(f.get())) return invalid_argument(path + ": read error");
  return h.hex_digest();
}

ModelHashTask::ModelHashTask(const std::string& path, bool enabled) {
  if (enabled)
    result_ = std::async(std::launch::async, [path, stop = &stop_] { return model_hash(path, default_cache_dir(), stop); });
}

ModelHashTask::~ModelHashTask() { stop_.store(true); }  // then result_'s destructor waits for the thread

std::string model_hash_cache_path(const std::string& cache_dir) { return (fs::path(cache_dir) / "model-hashes.json").string(); }

Expected<std::string> model_hash(const std::string& path, const std::string& cache_dir, const std::atomic<bool>* stop) {
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) {
    static const char* kCandidates[] = {
        "unet/diffusion_pytorch_model.safetensors",           "unet/diffusion_pytorch_model.fp16.safetensors",
        "transformer/diffusion_pytorch_model.safetensors",    "transformer/diffusion_pytorch_model.fp16.safetensors",
        "unet/diffusion_pytorch_model.safetensors.index.json", "transformer/diffusion_pytorch_model.safetensors.index.json"};
    file.clear();
    for (const char* c : kCandidates) {
      const fs::path p = fs::path(path) / c;
      if (fs::is_regular_file(p, ec)) {
        file = p.string();
        break;
      }
    }
    if (file.empty())
      return not_found(path + ": diffusers folder without unet/ or transformer/ diffusion_pytorch_model(.fp16)"
                       ".safetensors (or a shard index) to hash");
  }
  ATELIER_ASSIGN_OR_RETURN(std::string full, cached_file_sha256(file, cache_dir, stop));
  return full.substr(0, kModelHashDigits);
}

}  // namespace atelier
