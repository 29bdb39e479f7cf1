#include "serve/image_files.h"

#include <algorithm>
#include <cstdio>

namespace atelier::serve {
namespace {

// The file extension of an image format ("jpeg" -> "jpg").
std::string image_extension(const std::string& format) { return format == "jpeg" ? "jpg" : format; }

}  // namespace

std::string ImageFiles::put(std::string bytes, const std::string& format) {
  std::lock_guard<std::mutex> lock(mu_);
  char token[33];
  std::snprintf(token, sizeof token, "%08x%08x%08x%08x", random_(), random_(), random_(), random_());
  std::string name = std::string(token) + "." + image_extension(format);
  expire_locked();
  bytes_ += bytes.size();
  files_.push_back({name, {std::move(bytes), format}, std::chrono::steady_clock::now() + kImageUrlLifetime});
  while (bytes_ > max_bytes_ && files_.size() > 1) {  // the newest stays even when it alone is over the budget
    bytes_ -= files_.front().file.bytes.size();
    files_.pop_front();
  }
  return name;
}

std::optional<ImageFiles::File> ImageFiles::get(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  const auto it = std::find_if(files_.begin(), files_.end(), [&](const Entry& e) { return e.name == name; });
  if (it == files_.end() || it->expires <= now) return std::nullopt;
  return it->file;
}

void ImageFiles::expire_locked() {
  const auto now = std::chrono::steady_clock::now();
  while (!files_.empty() && files_.front().expires <= now) {  // every file lives as long: the oldest expire first
    bytes_ -= files_.front().file.bytes.size();
    files_.pop_front();
  }
}

}  // namespace atelier::serve
