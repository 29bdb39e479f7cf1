#include "io/file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

namespace atelier {

Expected<std::string> read_file(const std::string& path, std::string_view what, uint64_t max_bytes) {
  const std::string kind(what);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return not_found(path + ": no such " + kind);
  if (!S_ISREG(st.st_mode)) return invalid_argument(path + ": not a regular file");
  if (uint64_t(st.st_size) > max_bytes)
    return invalid_argument(path + ": " + std::to_string(st.st_size) + " bytes is too large for a " + kind +
                            " (limit " + std::to_string(max_bytes) + ")");
  std::ifstream in(path, std::ios::binary);
  if (!in) return invalid_argument(path + ": cannot open for reading");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return invalid_argument(path + ": read error");
  return ss.str();
}

bool write_file_atomically(const std::string& path, const std::string& bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  static std::atomic<uint64_t> writes{0};
  const std::string tmp = path + ".tmp" + std::to_string(::getpid()) + "." + std::to_string(writes.fetch_add(1));
  bool written = false;
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (f) {
      f << bytes;
      f.flush();
      written = f.good();
    }
  }
  std::error_code renamed;
  if (written) fs::rename(tmp, path, renamed);
  const bool ok = written && !renamed;
  if (!ok) fs::remove(tmp, ec);
  return ok;
}

std::string default_cache_dir() {
  namespace fs = std::filesystem;
  const char* set = std::getenv("ATELIER_PLAN_CACHE");
  if (set && std::string(set) == "0") return {};
  if (set && *set) return set;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return (fs::path(xdg) / "atelier").string();
  if (const char* home = std::getenv("HOME"); home && *home) return (fs::path(home) / ".cache" / "atelier").string();
  return {};
}

}  // namespace atelier
