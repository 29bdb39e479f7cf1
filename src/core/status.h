// Errors as values: Status carries a message that says what went wrong and what is supported;
// Expected<T> carries a value or a Status. Library code returns these across API boundaries and never
// calls exit(). Inside a module, invariant violations throw atelier::Error, and each public entry point
// (pipeline, loaders, CLI, server) converts that back into a Status with catch_status().
#pragma once
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace atelier {

enum class ErrorCode { kOk = 0, kInvalidArgument, kNotFound, kCorrupt, kUnsupported, kInternal, kCancelled, kResourceExhausted };

class Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return {}; }
  bool is_ok() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {ErrorCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {ErrorCode::kNotFound, std::move(m)}; }
inline Status corrupt(std::string m) { return {ErrorCode::kCorrupt, std::move(m)}; }
inline Status unsupported(std::string m) { return {ErrorCode::kUnsupported, std::move(m)}; }
inline Status internal_error(std::string m) { return {ErrorCode::kInternal, std::move(m)}; }
inline Status cancelled(std::string m) { return {ErrorCode::kCancelled, std::move(m)}; }
// `s` with "prefix: " before its message (the file or part it came from), same code.
inline Status prefixed(const Status& s, const std::string& prefix) { return {s.code(), prefix + ": " + s.message()}; }

// Thrown for violated invariants inside a module; never crosses a public API (see catch_status).
class Error : public std::runtime_error {
 public:
  explicit Error(Status s) : std::runtime_error(s.message()), status_(std::move(s)) {}
  explicit Error(const std::string& m) : Error(Status(ErrorCode::kInternal, m)) {}
  const Status& status() const { return status_; }

 private:
  Status status_;
};

template <typename T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}          // NOLINT: implicit by design
  Expected(Status error) : v_(std::move(error)) {      // NOLINT
    if (std::get<Status>(v_).is_ok()) v_ = Status(ErrorCode::kInternal, "Expected built from an ok Status");
  }
  bool has_value() const { return v_.index() == 0; }
  explicit operator bool() const { return has_value(); }
  T& value() & { check(); return std::get<T>(v_); }
  const T& value() const& { check(); return std::get<T>(v_); }
  T&& value() && { check(); return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  const Status& status() const {
    static const Status kOk;
    return has_value() ? kOk : std::get<Status>(v_);
  }

 private:
  void check() const {
    if (!has_value()) throw Error(std::get<Status>(v_));
  }
  std::variant<T, Status> v_;
};

#define ATELIER_CONCAT_INNER(a, b) a##b
#define ATELIER_CONCAT(a, b) ATELIER_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` (a Status) is not ok.
#define ATELIER_RETURN_IF_ERROR(expr)          \
  do {                                         \
    ::atelier::Status _st = (expr);            \
    if (!_st.is_ok()) return _st;              \
  } while (0)

// `ATELIER_ASSIGN_OR_RETURN(auto x, f())`: x = value of f(), or return its Status.
#define ATELIER_ASSIGN_OR_RETURN(decl, expr)                              \
  auto ATELIER_CONCAT(_exp_, __LINE__) = (expr);                          \
  if (!ATELIER_CONCAT(_exp_, __LINE__)) return ATELIER_CONCAT(_exp_, __LINE__).status(); \
  decl = std::move(ATELIER_CONCAT(_exp_, __LINE__)).value()

// Throws atelier::Error with a message when `cond` is false (invariants inside a module).
#define ATELIER_CHECK(cond, msg)                                                      \
  do {                                                                                \
    if (!(cond)) throw ::atelier::Error(std::string(msg) + " [" #cond "]");          \
  } while (0)

// Inside a catch block: the Status of the exception being handled (an atelier::Error's own, out of memory,
// or an internal error with the exception's message). Other exception types propagate.
inline Status current_exception_status() {
  try {
    throw;
  } catch (const Error& e) {
    return e.status();
  } catch (const std::bad_alloc&) {
    return Status(ErrorCode::kResourceExhausted, "out of memory");
  } catch (const std::exception& e) {
    return internal_error(e.what());
  }
}

// Runs `fn` (returning Status) and turns an atelier::Error or std::exception into a Status.
template <typename Fn>
Status catch_status(Fn&& fn) {
  try {
    return fn();
  } catch (...) {
    return current_exception_status();
  }
}

// Runs `fn` (returning Expected<T>) and turns an atelier::Error or std::exception into its Status.
template <typename T, typename Fn>
Expected<T> catch_expected(Fn&& fn) {
  try {
    return fn();
  } catch (...) {
    return current_exception_status();
  }
}

}  // namespace atelier
