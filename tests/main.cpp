#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "common/blas_kernel.h"

int main(int argc, char** argv) {
  // As every binary does at start-up: the tests compute with the kernels the product uses.
  infill::select_blas_kernel();
  return Catch::Session().run(argc, argv);
}
