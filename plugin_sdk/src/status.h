#pragma once
// The library's internal error type. Errors become infill_error objects in one place only
// (c_api.cpp); inside, functions return Status or Result<T>.
#include <string>
#include <utility>
#include <variant>

#include "infill/infill_client.h"

namespace infill::sdk {

struct Error {
  infill_error_code code = INFILL_ERROR_INTERNAL;
  std::string message;
  int http_status = 0;
  std::string engine_code;  // the engine's snake_case code, "" when not from the engine
  int retry_after_s = 0;
};

inline Error make_error(infill_error_code code, std::string message) {
  return Error{code, std::move(message), 0, {}, 0};
}

// ok() when no error is held.
class Status {
 public:
  Status() = default;
  Status(Error e) : error_(std::move(e)), failed_(true) {}  // NOLINT: implicit on purpose
  bool ok() const { return !failed_; }
  const Error& error() const { return error_; }

 private:
  Error error_;
  bool failed_ = false;
};

template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT
  Result(Error e) : v_(std::move(e)) {}      // NOLINT
  bool ok() const { return v_.index() == 0; }
  T& operator*() { return std::get<0>(v_); }
  const T& operator*() const { return std::get<0>(v_); }
  T* operator->() { return &std::get<0>(v_); }
  const Error& error() const { return std::get<1>(v_); }
  Status status() const { return ok() ? Status() : Status(error()); }

 private:
  std::variant<T, Error> v_;
};

}  // namespace infill::sdk
