// Device faults: the errors libtorch reports from CUDA, classified (out of memory, a sticky
// error that poisons the context, or none); and through the runtime, on the CPU with the step
// fault seam throwing those texts: out of memory fails the step's requests and the worker goes
// on; a sticky error takes the worker out of service, the router passes it over, and with no
// worker left a submit is refused as unavailable, naming the fault.
#include "support/catch.h"

#include <map>
#include <mutex>

#include "serving/device_fault.h"
#include "request_collector.h"
#include "serving_fixture.h"

using namespace infill;
using infill::test::ServingFixture;
using Collector = infill::test::RequestCollector;

namespace {

// As libtorch 2.x words them (c10::Error / c10::OutOfMemoryError), first line and more.
const char* const kIllegalAccess =
    "CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be asynchronously reported at some "
    "other API call, so the stacktrace below might be incorrect.";
const char* const kAssert = "CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.";
const char* const kOutOfMemory =
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free.";


ServingRequest request(const ServingFixture& f, uint64_t id, Collector& c) {
  ServingRequest r;
  r.id = id;
  r.client_id = 1;
  r.tmpl = f.templates[0];
  r.params = f.params(ServingFixture::rect_mask(8, 8, 16, 16), id);
  r.encode_result = false;
  r.on_complete = c.callback();
  return r;
}

}  // namespace

TEST_CASE("device faults are told apart by libtorch's CUDA error texts", "[serving][device]") {
  CHECK(classify_device_fault(kIllegalAccess) == DeviceFault::kLost);
  CHECK(classify_device_fault(kAssert) == DeviceFault::kLost);
  CHECK(classify_device_fault("CUDA error: unspecified launch failure") == DeviceFault::kLost);
  CHECK(classify_device_fault("CUDA error: uncorrectable ECC error encountered") == DeviceFault::kLost);
  CHECK(classify_device_fault(kOutOfMemory) == DeviceFault::kOutOfMemory);
  // The request's own errors are no device fault, even when they mention CUDA.
  CHECK(classify_device_fault("Expected all tensors to be on the same device, but found cuda:0 and cpu") == DeviceFault::kNone);
  CHECK(classify_device_fault("segment 0: img must be [R >= 1, 128]") == DeviceFault::kNone);
  CHECK(classify_device_fault("an illegal memory access") == DeviceFault::kNone);  // not from CUDA
  CHECK(std::string(device_fault_name(DeviceFault::kLost)) == "lost");
}

TEST_CASE("out of device memory fails the step's requests and the worker goes on", "[serving][device]") {
  ServingFixture f;
  Collector c;
  RuntimeOptions o;
  std::atomic<bool> armed{true};
  o.worker.before_step = [&](std::span<const uint64_t> ids) {
    for (uint64_t id : ids)
      if (id == 1 && armed.exchange(false)) throw std::runtime_error(kOutOfMemory);
  };
  auto rt = ServingRuntime::create(f.model, f.store, f.cost, o);
  REQUIRE(rt.ok());
  REQUIRE((*rt)->submit(request(f, 1, c)).ok());
  REQUIRE((*rt)->drain(60000));
  const RequestResult oom = c.only(1);
  CHECK(oom.state == RequestState::kFailed);
  CHECK(oom.status.message().find("step of request 1 failed on cpu: CUDA out of memory") != std::string::npos);
  CHECK(oom.status.message().find("out of service") == std::string::npos);
  CHECK((*rt)->loads().at(0).in_service);
  REQUIRE((*rt)->submit(request(f, 2, c)).ok());
  REQUIRE((*rt)->drain(60000));
  CHECK(c.only(2).state == RequestState::kDone);
}

TEST_CASE("a sticky device error takes the worker out of service, the others go on, then none is left",
          "[serving][device]") {
  ServingFixture f;
  Collector c;
  RuntimeOptions o;
  o.workers = 2;
  // Request 1's forward poisons worker 0's device, request 5's (later) worker 1's.
  o.worker.before_step = [&](std::span<const uint64_t> ids) {
    for (uint64_t id : ids)
      if (id == 1 || id == 5) throw std::runtime_error(kIllegalAccess);
  };
  auto made = ServingRuntime::create(f.model, f.store, f.cost, o);
  REQUIRE(made.ok());
  ServingRuntime& rt = **made;
  REQUIRE(rt.submit(request(f, 1, c)).ok());  // equal loads: worker 0
  REQUIRE(rt.drain(60000));
  const RequestResult lost = c.only(1);
  CHECK(lost.state == RequestState::kFailed);
  CHECK(lost.metrics.worker == 0);
  INFO(lost.status.to_string());
  CHECK(lost.status.message().find("step of request 1 failed on cpu: CUDA error: an illegal memory access") !=
        std::string::npos);
  CHECK(lost.status.message().find("worker 0 is out of service") != std::string::npos);
  const std::vector<WorkerLoad> loads = rt.loads();
  CHECK_FALSE(loads.at(0).in_service);
  CHECK(loads.at(1).in_service);
  const WorkerMetrics w0 = rt.worker_metrics().at(0);
  CHECK_FALSE(w0.in_service);
  CHECK(w0.fault.find("cpu failed: CUDA error: an illegal memory access") != std::string::npos);
  CHECK(w0.failed_steps == 1);

  // The router passes worker 0 over: every later edit runs on worker 1.
  for (uint64_t id = 2; id <= 4; ++id) REQUIRE(rt.submit(request(f, id, c)).ok());
  REQUIRE(rt.drain(60000));
  for (uint64_t id = 2; id <= 4; ++id) {
    const RequestResult r = c.only(id);
    INFO("request " << id << ": " << r.status.to_string());
    CHECK(r.state == RequestState::kDone);
    CHECK(r.metrics.worker == 1);
  }

  // Worker 1's device fails too: nothing is left, and a submit says so.
  REQUIRE(rt.submit(request(f, 5, c)).ok());
  REQUIRE(rt.drain(60000));
  CHECK(c.only(5).state == RequestState::kFailed);
  const Status refused = rt.submit(request(f, 6, c));
  CHECK(refused.code() == ErrorCode::kUnavailable);
  CHECK(refused.message().find("every worker is out of service") != std::string::npos);
  CHECK(refused.message().find("worker 1: cpu failed: CUDA error: an illegal memory access") != std::string::npos);
}
