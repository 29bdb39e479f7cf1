// SHA-256 (FIPS 180-4), implemented here so that model hashes need no crypto library, and the A1111
// "Model hash" shown in infotext.
//
// Model hash: A1111 writes the first 10 hex digits of the SHA-256 of the checkpoint file ("shorthash").
// A diffusers folder has no single checkpoint file; we define its model hash as the SHA-256 of the
// denoiser's weights file — the first that exists of unet/diffusion_pytorch_model.safetensors,
// unet/diffusion_pytorch_model.fp16.safetensors, transformer/diffusion_pytorch_model.safetensors,
// transformer/diffusion_pytorch_model.fp16.safetensors, then (sharded models) the *.safetensors.index.json
// beside them — since those weights are what makes one fine-tune differ from another.
// Hashing reads the whole file (a few seconds per GB); callers that show hashes should cache them.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace atelier {

class Sha256 {
 public:
  static constexpr size_t kDigestBytes = 32;
  static constexpr size_t kBlockBytes = 64;
  Sha256();
  void update(const void* data, size_t bytes);
  void update(std::string_view s) { update(s.data(), s.size()); }
  // Pads and returns the digest; the object must not be updated afterwards.
  std::array<uint8_t, kDigestBytes> finish();
  // Lowercase hex of finish().
  std::string hex_digest();

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> h_;
  std::array<uint8_t, kBlockBytes> buf_{};
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
};

// Lowercase hex SHA-256 of a string.
std::string sha256_hex(std::string_view data);
// Lowercase hex SHA-256 of a file, streamed.
Expected<std::string> file_sha256(const std::string& path);
// Number of hex digits in A1111's "Model hash".
constexpr size_t kModelHashDigits = 10;
// A1111 "Model hash" of a checkpoint file, or of a diffusers folder (see the file comment).
Expected<std::string> model_hash(const std::string& path);

}  // namespace atelier
