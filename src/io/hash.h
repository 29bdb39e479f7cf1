// SHA-256 (FIPS 180-4) through OpenSSL's libcrypto (its SHA-NI / AVX2 code: ~1.5 GB/s where the scalar form
// written here before took 0.28 GB/s, 6.1 s for SD 1.5's 1.7 GB UNet file), and the A1111 "Model hash" shown in
// infotext.
//
// Model hash: A1111 writes the first 10 hex digits of the SHA-256 of the checkpoint file ("shorthash").
// A diffusers folder has no single checkpoint file; we define its model hash as the SHA-256 of the
// denoiser's weights file — the first that exists of unet/diffusion_pytorch_model.safetensors,
// unet/diffusion_pytorch_model.fp16.safetensors, transformer/diffusion_pytorch_model.safetensors,
// transformer/diffusion_pytorch_model.fp16.safetensors, then (sharded models) the *.safetensors.index.json
// beside them — since those weights are what makes one fine-tune differ from another.
// Hashing reads the whole file (about 0.7 s per GB), so model_hash keeps each file's digest in a cache (as A1111's
// cache.json does): a file of the same path, size and modification time is not read again.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <future>
#include <string>
#include <string_view>

#include "core/status.h"
#include "io/file.h"

struct evp_md_ctx_st;

namespace atelier {

class Sha256 {
 public:
  static constexpr size_t kDigestBytes = 32;
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t bytes);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // Pads and returns the digest; the object must not be updated afterwards.
  std::array<uint8_t, kDigestBytes> finish();
  // Lowercase hex of finish().
  std::string hex_digest();

 private:
  evp_md_ctx_st* ctx_;  // OpenSSL's EVP_MD_CTX
};

// Lowercase hex SHA-256 of a string.
std::string sha256_hex(std::string_view data);
// Lowercase hex SHA-256 of a file, streamed; a cancelled status when `stop` is set while it reads.
Expected<std::string> file_sha256(const std::string& path, const std::atomic<bool>* stop = nullptr);
// Number of hex digits in A1111's "Model hash".
constexpr size_t kModelHashDigits = 10;
// A1111 "Model hash" of a checkpoint file, or of a diffusers folder (see the file comment). The digest comes from the
// cache in `cache_dir` (default_cache_dir(); "" keeps none) when it holds the file at its current size and
// modification time; otherwise the file is read, and its digest kept there.
Expected<std::string> model_hash(const std::string& path, const std::string& cache_dir = default_cache_dir(),
                                 const std::atomic<bool>* stop = nullptr);
// model_hash(path) on a thread of its own, started with the task. A loader starts it before reading the weights and
// takes it after: the first hash of a file (about 1.1 s for a 1.7 GB SD UNet) then runs beside the load instead of
// after it. A task dropped unfinished (the load failed) stops reading at its next chunk.
class ModelHashTask {
 public:
  // enabled false: no task (valid() is false).
  ModelHashTask(const std::string& path, bool enabled);
  ~ModelHashTask();
  ModelHashTask(const ModelHashTask&) = delete;
  ModelHashTask& operator=(const ModelHashTask&) = delete;
  bool valid() const { return result_.valid(); }
  // Waits for the hash.
  Expected<std::string> get() { return result_.get(); }

 private:
  std::atomic<bool> stop_{false};  // before result_: it outlives the thread, which result_'s destructor joins
  std::future<Expected<std::string>> result_;
};
// The cache file of model_hash in `cache_dir`.
std::string model_hash_cache_path(const std::string& cache_dir);

}  // namespace atelier
