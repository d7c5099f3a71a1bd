// bench_codec: decode latency of infill-tiny 2's codec (patch PCA encoder + learned conv
// decoder, model/learned_decoder_codec.h) against the PCA's own patch decode in the same run:
// a 512x512 image and a 128x128 box through decode_crop with the exact context margin.
// Random weights (the cost does not depend on their values). Prints one JSON document.
//
// usage: bench_codec [--threads N] [--repeats N] [--widths 64,32,16,8] [--blocks 1,1,1,0]
#include <algorithm>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "bench_stats.h"
#include "common/blas_kernel.h"
#include "machine_info.h"
#include "model/compute_threads.h"
#include "model/learned_decoder_codec.h"

namespace {

std::vector<int> int_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream s(text);
  for (std::string item; std::getline(s, item, ',');) out.push_back(std::stoi(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  int threads = 2, repeats = 15;
  infill::LearnedDecoderConfig config;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    const bool known =
        flag == "--threads" || flag == "--repeats" || flag == "--widths" || flag == "--blocks";
    if (!known || i + 1 >= argc) {
      std::cerr << "bench_codec: "
                << (known ? flag + " needs a value" : "unknown option '" + flag + "'")
                << "\nusage: bench_codec [--threads N] [--repeats N] [--widths 64,32,16,8] "
                   "[--blocks 1,1,1,0]\n";
      return 2;
    }
    try {
      if (flag == "--threads")
        threads = std::stoi(argv[i + 1]);
      else if (flag == "--repeats")
        repeats = std::max(1, std::stoi(argv[i + 1]));
      else if (flag == "--widths")
        config.widths = int_list(argv[i + 1]);
      else
        config.blocks = int_list(argv[i + 1]);
    } catch (const std::exception&) {
      std::cerr << "bench_codec: " << flag << " takes a number or a comma-separated list, not '"
                << argv[i + 1] << "'\n";
      return 2;
    }
  }
  if (const infill::Status valid = config.validate(); !valid.ok()) {
    std::cerr << "bench_codec: " << valid.message() << "\n";
    return 2;
  }
  infill::set_compute_threads(threads);
  c10::InferenceMode guard;
  const infill::LearnedDecoderCodec codec = infill::LearnedDecoderCodec::random(config, 1);
  constexpr int kImage = 512, kBox = 128;
  const int f = codec.factor(), margin = codec.context_margin();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const at::Tensor latent = at::randn({1, codec.latent_channels(), kImage / f, kImage / f}, gen);
  const int box = kBox / f, at_latent = (kImage / f - box) / 2;  // a box in the middle

  const double learned_ms = infill::bench::median_ms(repeats, [&] { codec.decode(latent); });
  const double pca_ms = infill::bench::median_ms(repeats, [&] { codec.decode_pca(latent); });
  const double crop_ms = infill::bench::median_ms(
      repeats, [&] { codec.decode_crop(latent, at_latent, at_latent, box, box, margin); });
  const double encode_ms = infill::bench::median_ms(repeats, [&] {
    codec.encode(at::rand({1, 3, kImage, kImage}, gen));
  });

  nlohmann::json out = {
      {"benchmark", "codec"},
      {"machine", infill::bench::machine_info()},
      {"device", "cpu"},
      {"codec",
       {{"pca_factor", config.pca_factor},
        {"pca_channels", config.pca_channels},
        {"latent_channels", codec.latent_channels()},
        {"factor", f},
        {"widths", config.widths},
        {"blocks", config.blocks},
        {"context_margin", margin}}},
      {"repeats", repeats},
      {"decode_512_ms", {{"learned", learned_ms}, {"pca", pca_ms}}},
      {"decode_crop_128_ms", {{"learned", crop_ms}, {"margin_latent_px", margin}}},
      {"encode_512_ms", encode_ms},
  };
  std::cout << out.dump(2) << std::endl;
  return 0;
}
