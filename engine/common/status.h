#pragma once
/// Status and Result<T>: how expected failures travel inside the engine.
///
/// Expected failures (bad input, missing files, corrupt data) are values, never exceptions;
/// exceptions are reserved for programming errors. Every message names the input at fault
/// and what was expected, e.g. "mask is 511x512, template is 512x512".

#include <cassert>
#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace infill {

/// Error categories. They only grow; 0 is success.
enum class ErrorCode {
  kOk = 0,
  kInvalidArgument = 1,  ///< the caller's input is malformed or inconsistent
  kNotFound = 2,         ///< a named file, weight or entry does not exist
  kCorruptData = 3,      ///< a file exists but its content is damaged or inconsistent
  kIoError = 4,          ///< the operating system refused a read or write
  kOutOfRange = 5,       ///< a value is outside its configured limits
  kResourceExhausted = 6,
  kUnimplemented = 7,
  kInternal = 8,
  kCancelled = 9,
  kUnavailable = 10,     ///< nothing can serve it now (e.g. every worker's device failed)
};

/// Stable lower-case name of an error code ("invalid_argument", ...).
const char* error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status success() { return {}; }

  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "invalid_argument: mask is 511x512, template is 512x512"
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) { return {ErrorCode::kInvalidArgument, std::move(m)}; }
inline Status not_found(std::string m) { return {ErrorCode::kNotFound, std::move(m)}; }
inline Status corrupt_data(std::string m) { return {ErrorCode::kCorruptData, std::move(m)}; }
inline Status io_error(std::string m) { return {ErrorCode::kIoError, std::move(m)}; }
inline Status out_of_range(std::string m) { return {ErrorCode::kOutOfRange, std::move(m)}; }

/// A value or the Status explaining why there is none.
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).ok()); }  // NOLINT

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }

  const Status& status() const {
    static const Status kSuccess;
    return ok() ? kSuccess : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace infill

/// Propagates a failed Status from the enclosing function.
#define INFILL_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::infill::Status infill_status_ = (expr); \
    if (!infill_status_.ok()) return infill_status_; \
  } while (0)

#define INFILL_CONCAT_INNER_(a, b) a##b
#define INFILL_CONCAT_(a, b) INFILL_CONCAT_INNER_(a, b)
/// `INFILL_ASSIGN_OR_RETURN(auto x, make_x());` unwraps a Result or returns its Status.
#define INFILL_ASSIGN_OR_RETURN(lhs, expr)                                   \
  auto INFILL_CONCAT_(infill_result_, __LINE__) = (expr);                    \
  if (!INFILL_CONCAT_(infill_result_, __LINE__).ok())                        \
    return INFILL_CONCAT_(infill_result_, __LINE__).status();                \
  lhs = std::move(INFILL_CONCAT_(infill_result_, __LINE__)).value()
