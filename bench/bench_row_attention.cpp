// bench_row_attention: the attention of a mask-aware FLUX.2 step (klein 4B: 24 heads of 128,
// the masked rows of a 512x512 edit over all 2560 positions) with each kernel the engine has,
// in the same run, medians over repeats. On the CPU: the fused kernel (kernels/masked_attention)
// against plain matmul-softmax-matmul. On a CUDA device (--device cuda): libtorch's scaled-dot-
// product attention (what row_attention picks there) on device tensors, and on host tensors
// copied in and out (what a cache read from host memory costs). Prints JSON.
//
// It once also timed the project's own CUDA kernel (a dlopen'd library taking host tensors).
// On an H200 with torch 2.11, 100 query rows: 18.2 ms for it, 5.1 ms for SDPA on the same
// host tensors (float32), 0.17 ms for SDPA on device-resident bf16; 512 rows: 56.0 / 9.7 /
// 0.56 ms; 2560 rows: 241 / 16.3 / 2.2 ms. The kernel lost everywhere and was removed.
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "common/blas_kernel.h"
#include "bench_stats.h"
#include "kernels/masked_attention.h"
#include "machine_info.h"
#include "model/compute_device.h"
#include "model/compute_threads.h"
#include "model/row_attention.h"

namespace {

double median_ms(int repeats, const std::function<void()>& fn) {
  fn();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < repeats; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return infill::bench::percentile(ms, 0.5);
}

}  // namespace

int main(int argc, char** argv) {
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  infill::ComputeDevice device;
  int repeats = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--device") {
      auto parsed = infill::parse_compute_device(value);
      if (!parsed.ok()) {
        std::cerr << "bench_row_attention: " << parsed.status().message() << "\n";
        return 2;
      }
      device = *parsed;
    } else if (flag == "--repeats") {
      repeats = std::stoi(value);
    } else {
      std::cerr << "usage: bench_row_attention [--device cpu|cuda[:N]] [--repeats N]\n";
      return 2;
    }
  }
  if (const infill::Status usable = infill::check_compute_device(device); !usable.ok()) {
    std::cerr << "bench_row_attention: " << usable.to_string() << "\n";
    return 1;
  }
  infill::set_compute_threads(0);
  c10::InferenceMode guard;
  const int64_t heads = 24, d = 128, keys = 2560;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  nlohmann::ordered_json out;
  out["benchmark"] = "bench_row_attention";
  out["machine"] = infill::bench::machine_info(device.cuda ? infill::describe_compute_device(device) : "none used");
  out["device"] = device.name();
  out["shape"] = {{"heads", heads}, {"head_dim", d}, {"keys", keys}};
  out["repeats"] = repeats;
  out["statistic"] = "median ms";
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const int64_t m : {100, 512, 2560}) {
    const at::Tensor q = at::empty({m, heads * d}).normal_(0, 1, gen);
    const at::Tensor k = at::empty({keys, heads * d}).normal_(0, 1, gen);
    const at::Tensor v = at::empty({keys, heads * d}).normal_(0, 1, gen);
    nlohmann::ordered_json row{{"query_rows", m}};
    if (!device.cuda) {
      row["fused_cpu_kernel"] = median_ms(repeats, [&] { infill::row_attention(q, k, v, heads, scale); });
      row["matmul_softmax"] = median_ms(repeats, [&] { infill::kernels::masked_attention_reference(q, k, v, heads, scale); });
    } else {
      const at::Device where = device.torch_device();
      auto synced = [&](const std::function<at::Tensor()>& fn) {
        return [fn] { (void)fn().to(at::kCPU).sum().item<float>(); };
      };
      for (const at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
        const at::Tensor qd = q.to(where, dtype), kd = k.to(where, dtype), vd = v.to(where, dtype);
        const std::string name = dtype == at::kFloat ? "float32" : "bf16";
        row["sdpa_device_" + name] =
            median_ms(repeats, synced([&] { return infill::row_attention(qd, kd, vd, heads, scale); }));
        row["sdpa_from_host_" + name] = median_ms(repeats, synced([&] {
          return infill::row_attention(q.to(where, dtype), k.to(where, dtype), v.to(where, dtype), heads, scale);
        }));
      }
    }
    rows.push_back(row);
  }
  out["results"] = rows;
  std::cout << out.dump(2) << std::endl;
  return 0;
}
