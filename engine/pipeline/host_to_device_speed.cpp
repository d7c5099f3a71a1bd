#include "pipeline/host_to_device_speed.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace infill {

double measure_host_to_device_bytes_per_ms(const c10::Device& device) {
  if (device.is_cpu()) return 0.0;
  constexpr int64_t kBytes = int64_t{64} << 20;
  const at::Tensor host = at::zeros({kBytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  at::Tensor on_device = at::empty({kBytes}, at::TensorOptions().dtype(at::kByte).device(device));
  const c10::impl::VirtualGuardImpl guard(device.type());
  const c10::Stream stream = guard.getStream(device);
  std::vector<double> ms;
  for (int i = 0; i < 4; ++i) {
    stream.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    on_device.copy_(host, /*non_blocking=*/true);
    stream.synchronize();
    const double took = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0) ms.push_back(took);  // the first pays for the driver's first use of the buffers
  }
  std::sort(ms.begin(), ms.end());
  return static_cast<double>(kBytes) / std::max(ms[ms.size() / 2], 1e-6);
}

}  // namespace infill
