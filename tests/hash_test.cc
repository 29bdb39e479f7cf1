// SHA-256 against the FIPS 180-4 / NIST example vectors, block-boundary lengths (references from Python's
// hashlib), streaming in arbitrary pieces, files, and the A1111 model hash.
#include "io/hash.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "io/file.h"

#include "test_util.h"

namespace atelier {
namespace {

namespace fs = std::filesystem;

TEST(Hash, FipsVectors) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),  // 448 bits
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrs"
                       "mnopqrstnopqrstu"),  // 896 bits
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Hash, PaddingBoundaries) {
  // Messages of bytes (i*7+3) % 256; lengths around the 56- and 64-byte padding boundaries.
  const std::pair<size_t, const char*> cases[] = {
      {55, "e7313d333c272e639f790978283f9eb392e843d0f29b7016828bb1daa4aac70b"},
      {56, "4324d65f3c103567f5589c710bc08f8523f929a9272e3af36fc968e52abc6c27"},
      {63, "81c80242132f230c3bd41b3e63bbcff16107339549214a99614ff26664625055"},
      {64, "39e3d7b6b5d075d37d053ad89b24b41bef4f3c29760c84447cab3f3be1882241"},
      {65, "aacca6ff74fdbb296d165a45cecfa04e5127bc008770fbbdd48006f2d2fae95e"},
      {119, "9ce7368e4daf32341631b492e80359dc9f594b48453cd0dd5bf0b19279cc177e"},
      {120, "7836b787757e95e58b3ca5aec90b1b004e8deba1e50e9675af9cabf1a13a04b5"},
  };
  for (const auto& [n, hex] : cases) {
    std::string m(n, '\0');
    for (size_t i = 0; i < n; ++i) m[i] = char((i * 7 + 3) % 256);
    EXPECT_EQ(sha256_hex(m), hex) << n;
  }
}

TEST(Hash, StreamingInPiecesMatchesOneShot) {
  std::string m(1000, '\0');
  for (size_t i = 0; i < m.size(); ++i) m[i] = char(i * 31 + 1);
  const std::string whole = sha256_hex(m);
  for (size_t piece : {1, 3, 63, 64, 65, 127, 999}) {
    Sha256 h;
    for (size_t off = 0; off < m.size(); off += piece) h.update(m.data() + off, std::min(piece, m.size() - off));
    EXPECT_EQ(h.hex_digest(), whole) << piece;
  }
}

TEST(Hash, FileAndModelHash) {
  const fs::path p = fs::temp_directory_path() / ("atelier_hash_" + std::to_string(::getpid()) + ".bin");
  std::ofstream(p, std::ios::binary) << std::string(3 * 1000 * 1000 + 17, 'a');  // several read chunks
  Sha256 h;
  h.update(std::string(3 * 1000 * 1000 + 17, 'a'));
  const std::string expect = h.hex_digest();
  EXPECT_EQ(file_sha256(p.string()).value(), expect);
  EXPECT_EQ(model_hash(p.string()).value(), expect.substr(0, 10));
  fs::remove(p);
  EXPECT_EQ(file_sha256(p.string()).status().code(), ErrorCode::kNotFound);
  EXPECT_FALSE(model_hash(fs::temp_directory_path().string()).has_value());  // a folder without a UNet
}

// The model hash cache: a file's digest is read again only when the file's size or modification time changed.
TEST(Hash, ModelHashesAreKeptUntilTheFileChanges) {
  const test::TempDir dir;
  const fs::path file = dir.path / "model.safetensors", cache = dir.path / "cache";
  fs::create_directories(dir.path);
  std::ofstream(file, std::ios::binary) << std::string(100000, 'x');
  const std::string real = sha256_hex(std::string(100000, 'x'));
  EXPECT_EQ(model_hash(file.string(), cache.string()).value(), real.substr(0, 10));
  const std::string cache_file = model_hash_cache_path(cache.string());
  ASSERT_TRUE(fs::exists(cache_file)) << "the digest was not kept";

  // A kept digest is taken without reading the file: one planted in the cache comes back.
  const auto plant = [&](const std::string& digest) {
    nlohmann::json j = nlohmann::json::parse(read_file(cache_file).value());
    ASSERT_EQ(j["files"].size(), 1u);
    j["files"].begin().value()["sha256"] = digest;
    std::ofstream(cache_file, std::ios::trunc) << j.dump();
  };
  const std::string planted(64, 'a');
  plant(planted);
  EXPECT_EQ(model_hash(file.string(), cache.string()).value(), planted.substr(0, 10));

  // The file changed (same size, a later modification time): read again, and the cache corrected.
  std::ofstream(file, std::ios::binary | std::ios::trunc) << std::string(100000, 'y');
  fs::last_write_time(file, fs::last_write_time(file) + std::chrono::seconds(5));
  const std::string changed = sha256_hex(std::string(100000, 'y'));
  EXPECT_EQ(model_hash(file.string(), cache.string()).value(), changed.substr(0, 10));
  EXPECT_EQ(model_hash(file.string(), cache.string()).value(), changed.substr(0, 10));

  // A digest that is not one, or a cache that is not ours, is ignored and replaced.
  plant("not a digest");
  EXPECT_EQ(model_hash(file.string(), cache.string()).value(), changed.substr(0, 10));
  {  // an entry that is not an object, beside the file's own
    nlohmann::json j = nlohmann::json::parse(read_file(cache_file).value());
    j["files"]["/elsewhere/model.safetensors"] = 5;
    std::ofstream(cache_file, std::ios::trunc) << j.dump();
  }
  EXPECT_EQ(model_hash(file.string(), cache.string()).value(), changed.substr(0, 10));
  std::ofstream(cache_file, std::ios::trunc) << "{broken";
  EXPECT_EQ(model_hash(file.string(), cache.string()).value(), changed.substr(0, 10));
  EXPECT_TRUE(nlohmann::json::parse(read_file(cache_file).value(), nullptr, false).is_object());

  // No cache folder: nothing kept, nowhere.
  fs::remove(cache_file);
  EXPECT_EQ(model_hash(file.string(), "").value(), changed.substr(0, 10));
  EXPECT_FALSE(fs::exists(cache_file));
  EXPECT_FALSE(fs::exists(model_hash_cache_path("")));
}

TEST(Hash, ModelHashTasksHashBesideTheCallerAndStopWhenAsked) {
  const test::TempDir dir;
  fs::create_directories(dir.path);
  const fs::path file = dir.path / "model.safetensors";
  std::ofstream(file, std::ios::binary) << std::string(3 << 20, 'z');  // several read chunks
  const std::string want = sha256_hex(std::string(3 << 20, 'z'));
  ModelHashTask task(file.string(), true);
  ASSERT_TRUE(task.valid());
  EXPECT_EQ(task.get().value(), want.substr(0, 10));
  EXPECT_FALSE(ModelHashTask(file.string(), false).valid());
  const std::atomic<bool> stop{true};
  EXPECT_EQ(file_sha256(file.string(), &stop).status().code(), ErrorCode::kCancelled);
  EXPECT_EQ(model_hash(file.string(), "", &stop).status().code(), ErrorCode::kCancelled);
}

TEST(Hash, FixtureModelHashes) {
  ATELIER_REQUIRE_FIXTURE(dir, "sd15-tiny");
  // References from sha256sum.
  EXPECT_EQ(file_sha256((dir / "model/unet/diffusion_pytorch_model.safetensors").string()).value(),
            "cd69b5c545ecb807a8d2cca93d6a1768545bcde90d8abeb390bff60eeff617da");
  EXPECT_EQ(model_hash((dir / "sd15-tiny.safetensors").string()).value(), "9f3204df6c");
  EXPECT_EQ(model_hash((dir / "model").string()).value(), "cd69b5c545");  // diffusers folder: the UNet file
}

}  // namespace
}  // namespace atelier
