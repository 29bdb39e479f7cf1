// read_file: the bytes of a regular file, or an error naming the path and what went wrong.
#include "io/file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace atelier {
namespace {

namespace fs = std::filesystem;

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("atelier_file_" + std::to_string(::getpid()) + "_" + name);
}

TEST(ReadFile, ReturnsEveryByte) {
  const fs::path p = temp_path("bytes.bin");
  const std::string bytes("a\0b\r\n\xff", 6);  // NUL, CR LF and a high byte survive: binary mode
  std::ofstream(p, std::ios::binary) << bytes;
  auto r = read_file(p.string());
  ASSERT_TRUE(r.has_value()) << r.status().message();
  EXPECT_EQ(*r, bytes);
  auto at_limit = read_file(p.string(), "file", bytes.size());  // exactly at the limit: read
  EXPECT_TRUE(at_limit.has_value());
  fs::remove(p);
}

TEST(ReadFile, MissingFileIsNotFoundAndNamesThePath) {
  const fs::path p = temp_path("missing.json");
  auto r = read_file(p.string(), "JSON file");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_EQ(r.status().message(), p.string() + ": no such JSON file");
}

TEST(ReadFile, FolderIsRefused) {
  auto r = read_file(fs::temp_directory_path().string(), "image file");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("not a regular file"), std::string::npos) << r.status().message();
}

TEST(ReadFile, FileOverTheLimitIsRefusedWithTheLimit) {
  const fs::path p = temp_path("big.txt");
  std::ofstream(p, std::ios::binary) << std::string(101, 'x');
  auto r = read_file(p.string(), "vocabulary", 100);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), p.string() + ": 101 bytes is too large for a vocabulary (limit 100)");
  fs::remove(p);
}

}  // namespace
}  // namespace atelier
