#pragma once
/// infill-render's command line: everything main() does, so the binary stays a thin main()
/// and tests can read the usage text. See docs/farm.md for the protocol and exit codes.

#include <ostream>

namespace infill::render {

/// Runs the command line. Returns the exit code (exit_codes.h); when the run was stopped by
/// SIGTERM or SIGINT, sets `stop_signal` and the caller should die_by_signal() after this
/// returned (every engine thread is stopped and every partial file removed by then).
int render_main(int argc, char** argv, std::ostream& out, std::ostream& err, int& stop_signal);

}  // namespace infill::render
