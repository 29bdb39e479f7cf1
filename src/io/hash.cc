#include "io/hash.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <vector>

namespace atelier {
namespace {

// FIPS 180-4 section 4.2.2: first 32 bits of the fractional parts of the cube roots of the first 64 primes.
constexpr uint32_t kRoundConstants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

// Section 5.3.3: first 32 bits of the fractional parts of the square roots of the first 8 primes.
constexpr std::array<uint32_t, 8> kInitialHash = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                                  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

constexpr size_t kLengthFieldBytes = 8;      // message length in bits, big-endian, ends the padding
constexpr size_t kFileChunkBytes = 1 << 20;  // streaming read size

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

std::string to_hex(const uint8_t* p, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kDigits[p[i] >> 4];
    s[2 * i + 1] = kDigits[p[i] & 0xf];
  }
  return s;
}

}  // namespace

Sha256::Sha256() : h_(kInitialHash) {}

void Sha256::compress(const uint8_t* block) {
  uint32_t w[64];
  for (int t = 0; t < 16; ++t)
    w[t] = uint32_t(block[4 * t]) << 24 | uint32_t(block[4 * t + 1]) << 16 | uint32_t(block[4 * t + 2]) << 8 |
           uint32_t(block[4 * t + 3]);
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    const uint32_t ch = (e & f) ^ (~e & g);
    const uint32_t t1 = h + S1 + ch + kRoundConstants[t] + w[t];
    const uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = S0 + maj;
    h = g; g = f; f = e; e = d + t1;
    d = c; c = b; b = a; a = t1 + t2;
  }
  h_[0] += a; h_[1] += b; h_[2] += c; h_[3] += d;
  h_[4] += e; h_[5] += f; h_[6] += g; h_[7] += h;
}

void Sha256::update(const void* data, size_t bytes) {
  const auto* p = static_cast<const uint8_t*>(data);
  total_bytes_ += bytes;
  if (buf_len_ > 0) {  // top up a partial block first
    const size_t take = std::min(bytes, kBlockBytes - buf_len_);
    std::memcpy(buf_.data() + buf_len_, p, take);
    buf_len_ += take;
    p += take;
    bytes -= take;
    if (buf_len_ < kBlockBytes) return;
    compress(buf_.data());
    buf_len_ = 0;
  }
  for (; bytes >= kBlockBytes; bytes -= kBlockBytes, p += kBlockBytes) compress(p);
  if (bytes > 0) std::memcpy(buf_.data(), p, bytes);
  buf_len_ = bytes;
}

std::array<uint8_t, Sha256::kDigestBytes> Sha256::finish() {
  const uint64_t bit_length = total_bytes_ * 8;
  // Padding: a 1 bit, zeros up to 8 bytes short of a block boundary, then the length.
  uint8_t pad[kBlockBytes + kLengthFieldBytes] = {0x80};
  const size_t pad_len = (buf_len_ < kBlockBytes - kLengthFieldBytes ? kBlockBytes : 2 * kBlockBytes) -
                         kLengthFieldBytes - buf_len_;
  uint8_t len_be[kLengthFieldBytes];
  for (size_t i = 0; i < kLengthFieldBytes; ++i) len_be[i] = uint8_t(bit_length >> (8 * (7 - i)));
  const uint64_t saved_total = total_bytes_;
  update(pad, pad_len);
  update(len_be, kLengthFieldBytes);
  total_bytes_ = saved_total;
  std::array<uint8_t, kDigestBytes> out{};
  for (size_t i = 0; i < 8; ++i)
    for (size_t j = 0; j < 4; ++j) out[4 * i + j] = uint8_t(h_[i] >> (8 * (3 - j)));
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

Expected<std::string> file_sha256(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return not_found(path + ": no such file");
  if (!std::filesystem::is_regular_file(path, ec)) return invalid_argument(path + ": not a regular file");
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "rb"), std::fclose);
  if (!f) return invalid_argument(path + ": cannot open for reading");
  std::vector<uint8_t> chunk(kFileChunkBytes);
  Sha256 h;
  size_t n = 0;
  while ((n = std::fread(chunk.data(), 1, chunk.size(), f.get())) > 0) h.update(chunk.data(), n);
  if (std::ferror(f.get())) return invalid_argument(path + ": read error");
  return h.hex_digest();
}

Expected<std::string> model_hash(const std::string& path) {
  namespace fs = std::filesystem;
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
  ATELIER_ASSIGN_OR_RETURN(std::string full, file_sha256(file));
  return full.substr(0, kModelHashDigits);
}

}  // namespace atelier
