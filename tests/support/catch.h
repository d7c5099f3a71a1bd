#pragma once
// Include this instead of <catch2/catch.hpp>, and first.
//
// libtorch pulls in glog, whose CHECK(cond) macro silently replaces Catch's CHECK when glog
// comes second: such checks then abort on failure and are never counted. Including glog's
// header first, dropping its CHECK and then including Catch makes every CHECK Catch's
// (later includes of glog are no-ops thanks to its include guard).
#ifdef INFILL_TEST_WITH_TORCH
#include <c10/util/Logging.h>
#undef CHECK
#endif
#include <catch2/catch.hpp>
