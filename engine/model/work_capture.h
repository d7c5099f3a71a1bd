#pragma once
/// Records a piece of device work once and replays it later without the host issuing its
/// kernels one by one: CUDA graphs on a GPU (at::cuda::CUDAGraph), which is what a masked
/// step needs there, being bound by kernel launches rather than by the GPU (issue 39). On the
/// CPU there is nothing to record: a replay runs the piece again. The seam lets the code that
/// builds pieces (model/flux2_step_graph.h) run and be tested on the CPU as it runs on a GPU.
///
/// What a piece may do: read and write tensors that stay allocated at the same address for as
/// long as the capture is replayed (its inputs, copied in before a replay; its outputs, read
/// after), and allocate tensors of its own. What it may not: wait on the device (`.item()`,
/// a copy to the host), copy from pageable host memory, or depend on host values that change
/// between replays: a replay repeats the recorded kernels with the recorded arguments.
/// Pieces captured by one WorkCapture share one memory pool, so a tensor one piece leaves
/// behind is still valid in the next; they must be replayed in the order they were captured.
/// Threading: one thread at a time (the worker's step loop).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <c10/core/Device.h>

namespace infill {

class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  /// Runs the recorded work again, on the device's current stream.
  virtual void replay() = 0;
};

class WorkCapture {
 public:
  virtual ~WorkCapture() = default;
  /// Records `work` and runs it once (its results are there when this returns). Throws
  /// c10::Error when the recording fails (out of device memory, an operation a graph cannot
  /// hold): the caller then runs the work eagerly and stops capturing for that shape.
  virtual std::unique_ptr<CapturedWork> capture(const std::function<void()>& work) = 0;
  /// Device memory held by everything captured so far (the graphs' pool); 0 on the CPU.
  virtual int64_t bytes() const = 0;
  /// "cuda_graph" or "rerun".
  virtual std::string kind() const = 0;
};

/// CUDA graphs on a CUDA device (c10::Error if this build has no CUDA), re-running on the CPU.
std::unique_ptr<WorkCapture> make_work_capture(const c10::Device& device);

}  // namespace infill
