// infill-render: runs job files for render farms (docs/farm.md), with an engine embedded in
// the process or against a running infill-engine. The logic lives in tools/render.
#include <iostream>

#include "common/blas_kernel.h"
#include "render_cli.h"
#include "signal_watch.h"

int main(int argc, char** argv) {
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  int stop_signal = 0;
  const int code = infill::render::render_main(argc, argv, std::cout, std::cerr, stop_signal);
  if (stop_signal) infill::render::die_by_signal(stop_signal);
  return code;
}
