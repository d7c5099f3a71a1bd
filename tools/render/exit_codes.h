#pragma once
/// Exit codes of infill-render, part of its documented protocol (docs/farm.md). A farm
/// manager retries on 3 and 5, fails the task on 2 and 4. A run stopped by SIGTERM or SIGINT
/// does not exit with a code: it dies by the same signal.

namespace infill::render {

enum ExitCode : int {
  kExitOk = 0,
  kExitBadJob = 2,       ///< the job file, a file it names, a flag or an --items range is wrong
  kExitEngine = 3,       ///< the engine is unreachable, refused the token or cannot load the model
  kExitDeadline = 4,     ///< the job's deadline passed before every item was written
  kExitInternal = 5,     ///< anything else (write failures, engine errors mid-edit)
};

}  // namespace infill::render
