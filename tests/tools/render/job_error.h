#pragma once
// The parts every job-file error must have, checked on a failed parse.
#include <string>

#include "job_file.h"
#include "support/catch.h"

namespace infill::test {

/// `r` failed as invalid_argument with "FILE: POINTER: ...; expected ..." naming `expected_part`.
inline void require_job_error(const Result<render::Job>& r, const std::string& file, const std::string& pointer,
                              const std::string& expected_part) {
  REQUIRE_FALSE(r.ok());
  const std::string& m = r.status().message();
  INFO(m);
  CHECK(r.status().code() == ErrorCode::kInvalidArgument);
  CHECK(m.rfind(file + ": " + pointer + ": ", 0) == 0);
  CHECK(m.find("; expected ") != std::string::npos);
  CHECK(m.find(expected_part) != std::string::npos);
}

}  // namespace infill::test
