#include "model/work_capture.h"

#include <c10/util/Exception.h>

#ifdef INFILL_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace infill {

namespace {

// The CPU: nothing to record, a replay runs the work again.
class RerunWork : public CapturedWork {
 public:
  explicit RerunWork(std::function<void()> work) : work_(std::move(work)) {}
  void replay() override { work_(); }

 private:
  std::function<void()> work_;
};

class RerunCapture : public WorkCapture {
 public:
  std::unique_ptr<CapturedWork> capture(const std::function<void()>& work) override {
    work();
    return std::make_unique<RerunWork>(work);
  }
  int64_t bytes() const override { return 0; }
  std::string kind() const override { return "rerun"; }
};

#ifdef INFILL_TORCH_CUDA

class CudaGraphWork : public CapturedWork {
 public:
  explicit CudaGraphWork(std::unique_ptr<at::cuda::CUDAGraph> graph) : graph_(std::move(graph)) {}
  void replay() override { graph_->replay(); }  // on the current stream

 private:
  std::unique_ptr<at::cuda::CUDAGraph> graph_;
};

int64_t reserved_bytes(c10::DeviceIndex device) {
  namespace allocator = c10::cuda::CUDACachingAllocator;
  const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return allocator::getDeviceStats(device).reserved_bytes[aggregate].current;
}

class CudaGraphCapture : public WorkCapture {
 public:
  explicit CudaGraphCapture(c10::DeviceIndex device)
      : device_(device), pool_(at::cuda::graph_pool_handle()), stream_(c10::cuda::getStreamFromPool(false, device)) {}

  std::unique_ptr<CapturedWork> capture(const std::function<void()>& work) override {
    c10::cuda::CUDAGuard on_device(device_);
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_);
    // A graph is recorded on a stream other than the legacy default; the recording stream
    // first waits for what the compute stream has queued (the inputs copied in).
    at::cuda::CUDAEvent queued;
    queued.record(compute);
    queued.block(stream_);
    const int64_t before = reserved_bytes(device_);
    auto graph = std::make_unique<at::cuda::CUDAGraph>();
    {
      c10::cuda::CUDAStreamGuard recording(stream_);
      // Thread-local: the worker's other threads (copy streams, prefetch) may use CUDA while
      // this thread records; only this thread's unsafe calls end the recording.
      graph->capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
      try {
        work();
      } catch (...) {
        try {
          graph->capture_end();  // ends the stream's capture; the invalidated graph is dropped
        } catch (...) {
        }
        throw;
      }
      graph->capture_end();
    }
    bytes_ += reserved_bytes(device_) - before;
    // Recording did not run the work: the first replay does, on the compute stream.
    graph->replay();
    return std::make_unique<CudaGraphWork>(std::move(graph));
  }
  int64_t bytes() const override { return bytes_; }
  std::string kind() const override { return "cuda_graph"; }

 private:
  c10::DeviceIndex device_;
  at::cuda::MempoolId_t pool_;
  c10::cuda::CUDAStream stream_;
  int64_t bytes_ = 0;
};

#endif

}  // namespace

std::unique_ptr<WorkCapture> make_work_capture(const c10::Device& device) {
  if (device.is_cpu()) return std::make_unique<RerunCapture>();
#ifdef INFILL_TORCH_CUDA
  if (device.is_cuda()) return std::make_unique<CudaGraphCapture>(device.index() < 0 ? 0 : device.index());
#endif
  TORCH_CHECK(false, "no work capture for device ", device.str(), " in this build (CUDA graphs need a CUDA libtorch)");
}

}  // namespace infill
