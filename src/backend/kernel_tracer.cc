#include "backend/kernel_tracer.h"

#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#ifdef ATELIER_HAVE_CUDA
#include "backend/cuda/cupti_tracer.h"
#endif

namespace atelier {

Expected<std::unique_ptr<KernelTracer>> open_kernel_tracer() {
#ifdef ATELIER_HAVE_CUDA
  return cuda::open_cupti_tracer();
#else
  return unsupported("kernel tracing needs the CUDA backend (CUPTI); this build has none (configure with -DATELIER_CUDA=ON)");
#endif
}

namespace {

// Where the parameter list of a demangled function name opens: the last '(' at template depth 0 whose
// parentheses close at the end of the name ("f<(E)1>(int, P)" -> 7). npos when the name has none.
size_t parameter_list(const std::string& s) {
  if (s.empty() || s.back() != ')') return std::string::npos;
  int depth = 0;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] == ')') ++depth;
    if (s[i] == '(' && --depth == 0) return i;
  }
  return std::string::npos;
}

// Drops every "qualifier::" (identifiers and "(anonymous namespace)" followed by "::").
std::string without_qualifiers(const std::string& s) {
  static const std::string kAnonymous = "(anonymous namespace)::";
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, kAnonymous.size(), kAnonymous) == 0) {
      i += kAnonymous.size();
      continue;
    }
    size_t j = i;
    while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
    if (j > i && s.compare(j, 2, "::") == 0) {
      i = j + 2;  // a qualifier: skip it and its "::"
      continue;
    }
    out.append(s, i, std::max(j, i + 1) - i);
    i = std::max(j, i + 1);
  }
  return out;
}

}  // namespace

std::string short_kernel_name(const char* mangled) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  if (status != 0 || !demangled) {
    std::free(demangled);
    return mangled;
  }
  std::string s = demangled;
  std::free(demangled);
  if (const size_t p = parameter_list(s); p != std::string::npos) s.resize(p);
  // A return type precedes templated names ("void f<...>"): the name starts after the last space at depth 0.
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '<' || s[i] == '(') ++depth;
    if (s[i] == '>' || s[i] == ')') --depth;
    if (s[i] == ' ' && depth == 0) start = i + 1;
  }
  return without_qualifiers(s.substr(start));
}

}  // namespace atelier
