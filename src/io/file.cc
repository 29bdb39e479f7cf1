#include "io/file.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

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

}  // namespace atelier
