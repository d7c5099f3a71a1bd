#include "model/compute_threads.h"

#include <algorithm>
#include <thread>

#include <ATen/Parallel.h>

namespace infill {

int set_compute_threads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  return at::get_num_threads();
}

}  // namespace infill
