// Images answered by URL (the OpenAI images API's response_format "url"): each finished image under an unguessable
// token (128 bits from std::random_device), served at GET /v1/images/files/{token}.{ext} without the API key, as
// OpenAI's signed URLs are, for an hour (OpenAI's URLs last 60 minutes), within a byte budget (oldest dropped first).
#pragma once
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <string>

namespace atelier::serve {

constexpr std::chrono::seconds kImageUrlLifetime{3600};
constexpr const char* kImageFilesPath = "/v1/images/files/";

class ImageFiles {
 public:
  explicit ImageFiles(size_t max_bytes) : max_bytes_(max_bytes) {}
  struct File {
    std::string bytes;
    std::string format;  // png | jpeg | webp
  };
  // Keeps `bytes` and returns its file name ("<token>.<ext>"), dropping the oldest files past the budget.
  std::string put(std::string bytes, const std::string& format);
  // The file named `name` while it lasts.
  std::optional<File> get(const std::string& name) const;

 private:
  struct Entry {
    std::string name;
    File file;
    std::chrono::steady_clock::time_point expires;
  };
  void expire_locked();

  const size_t max_bytes_;
  mutable std::mutex mu_;
  std::deque<Entry> files_;  // oldest first
  size_t bytes_ = 0;
  std::random_device random_;  // the kernel's generator: tokens nobody can predict from the ones they have seen
};

}  // namespace atelier::serve
