// bench_model_quality: quality of the bundled model on the held-out split of its training
// data. Prints one JSON document:
//   ae_psnr_db                       codec round trip of held-out 256 px crops
//   prompt_adherence                 share of edits whose region's mean colour is nearest to the
//                                    prompted colour word's reference colour
//   cached_vs_full_ssim_mean / _by_mask_ratio
//                                    SSIM over the mask's bounding box between the mask-aware
//                                    cached edit and the full-recompute edit, same seed
//   global_prompt_cached_vs_full_ssim_mean
//                                    the same comparison if the prompt modulated every token
//                                    (the design infill-tiny does not use), on a subset
//   unmasked_identical_fraction      edits whose pixels outside the mask equal the template's
// and writes a contact sheet (template | mask | full | cached) of the first 16 edits.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <unistd.h>
#include <string>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "machine_info.h"
#include "model/compute_threads.h"
#include "model/model.h"
#include "model/prompt_encoder.h"
#include "pipeline/edit_pipeline.h"
#include "pipeline/image_io.h"
#include "pipeline/template_image.h"
#include "tools/train/colour_words.h"
#include "tools/train/image_metrics.h"
#include "tools/train/patch_pca_fit.h"
#include "tools/train/random_masks.h"
#include "tools/train/trainer.h"
#include "tools/train/wallpaper_dataset.h"

namespace fs = std::filesystem;
using namespace infill;

namespace {

PixelImage to_u8(const at::Tensor& rgb) {  // [3, H, W] in [0, 1]
  at::Tensor hwc = (rgb.clamp(0, 1) * 255.0).round().to(at::kByte).permute({1, 2, 0}).contiguous();
  PixelImage img = PixelImage::allocate(static_cast<int>(rgb.size(2)), static_cast<int>(rgb.size(1)), 3, PixelFormat::kU8);
  std::memcpy(img.data.data(), hwc.data_ptr(), img.data.size());
  return img;
}

// A model folder identical to `model_dir` but with the prompt on every token.
std::string global_prompt_variant(const std::string& model_dir, const std::string& tmp_dir) {
  auto m = load_manifest(model_dir);
  if (!m.ok()) return "";
  m->dit.prompt_scope = PromptScope::kGlobal;
  m->dit.weights = m->resolve(m->dit.weights);
  m->autoencoder.encoder = m->resolve(m->autoencoder.encoder);
  m->autoencoder.decoder = m->resolve(m->autoencoder.decoder);
  m->name += "-global-prompt";
  fs::create_directories(tmp_dir);
  std::ofstream(tmp_dir + "/manifest.json") << manifest_to_json(*m);
  return tmp_dir;
}

struct EditCase {
  at::Tensor crop, mask;
  int target = 0;
  double ratio = 0.0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir = INFILL_SOURCE_DIR "/resources/models/infill-tiny";
  std::string sheet = "model_quality_sheet.png";
  int edits = 208, global_edits = 48, threads = 2;
  uint64_t seed = 2024;
  double guidance = 0.0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--model") model_dir = v;
    else if (a == "--edits") edits = std::stoi(v);
    else if (a == "--global-edits") global_edits = std::stoi(v);
    else if (a == "--sheet") sheet = v;
    else if (a == "--seed") seed = std::stoull(v);
    else if (a == "--guidance") guidance = std::stod(v);
    else if (a == "--threads") threads = std::stoi(v);
    else {
      std::cerr << "Error: unknown option " << a << "\n";
      return 2;
    }
  }
  set_compute_threads(threads);
  c10::InferenceMode guard;
  auto model = load_model(model_dir);
  if (!model.ok()) {
    std::cerr << "Error: " << model.status().message() << "\n";
    return 2;
  }
  if (guidance <= 0.0) guidance = (*model)->manifest.default_guidance;
  auto data = train::load_dataset({});
  if (!data.ok()) {
    std::cerr << "Error: " << data.status().message() << "\n";
    return 2;
  }
  const auto t0 = std::chrono::steady_clock::now();

  // Codec reconstruction on held-out crops.
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  train::CropOptions crop_options;
  crop_options.size = 256;
  crop_options.augment = false;
  const double ae_psnr = train::round_trip_psnr(*(*model)->autoencoder, train::random_crops(data->held_out, 256, crop_options, gen));

  // The edits: held-out crops, masks with ratios in [0.05, 0.4], a random colour word.
  train::MaskOptions mask_options;
  mask_options.size = 256;
  mask_options.min_ratio = 0.05;
  mask_options.max_ratio = 0.4;
  std::vector<EditCase> cases;
  for (int i = 0; i < edits; ++i) {
    EditCase c;
    c.crop = train::random_crops(data->held_out, 1, crop_options, gen)[0];
    c.mask = train::random_mask(mask_options, gen);
    c.ratio = c.mask.mean().item<double>();
    c.target = static_cast<int>(at::randint(train::kColourWords, {1}, gen).item<int64_t>());
    cases.push_back(c);
  }

  auto run = [&](std::shared_ptr<const Model> m, const EditCase& c, int index, CacheMode mode) -> Result<EditOutput> {
    EditPipeline pipeline(m, nullptr);
    INFILL_ASSIGN_OR_RETURN(std::vector<std::byte> png, encode_png(to_u8(c.crop)));
    INFILL_ASSIGN_OR_RETURN(auto tmpl, make_template(*m, png, "held-out crop " + std::to_string(index)));
    EditParams params;
    params.mask = c.mask;
    INFILL_ASSIGN_OR_RETURN(params.prompt, encode_prompt(m->manifest, train::vocabulary()[c.target]));
    params.guidance_scale = guidance;
    params.seed = seed + static_cast<uint64_t>(index);
    params.cache = mode;
    return pipeline.edit(tmpl, params);
  };

  int adherent = 0, identical = 0, done = 0;
  double ssim_sum = 0.0;
  std::map<std::string, std::pair<double, int>> buckets;
  std::vector<std::vector<at::Tensor>> sheet_rows;
  nlohmann::json confusion = nlohmann::json::object();
  for (int i = 0; i < edits; ++i) {
    const EditCase& c = cases[i];
    auto cached = run(*model, c, i, CacheMode::kUse);
    auto full = run(*model, c, i, CacheMode::kOff);
    if (!cached.ok() || !full.ok()) {
      std::cerr << "Error: edit " << i << ": " << (cached.ok() ? full.status() : cached.status()).message() << "\n";
      return 5;
    }
    const at::Tensor cached_rgb = to_rgb_tensor(cached->image), full_rgb = to_rgb_tensor(full->image);
    const at::Tensor template_rgb = to_rgb_tensor(to_u8(c.crop));
    // Bounding box of the mask.
    const at::Tensor rows = c.mask.sum(1).nonzero(), cols = c.mask.sum(0).nonzero();
    const int64_t y0 = rows.min().item<int64_t>(), y1 = rows.max().item<int64_t>() + 1;
    const int64_t x0 = cols.min().item<int64_t>(), x1 = cols.max().item<int64_t>() + 1;
    const double s = train::ssim(cached_rgb.slice(1, y0, y1).slice(2, x0, x1), full_rgb.slice(1, y0, y1).slice(2, x0, x1));
    ssim_sum += s;
    const char* bucket = c.ratio < 0.15 ? "0.05-0.15" : c.ratio < 0.25 ? "0.15-0.25" : "0.25-0.40";
    buckets[bucket].first += s;
    buckets[bucket].second += 1;
    const auto mean = train::masked_mean_colour(cached_rgb, c.mask);
    const int got = train::nearest_colour_word({mean[0], mean[1], mean[2]});
    if (got == c.target) ++adherent;
    const std::string key = train::vocabulary()[c.target];
    if (!confusion.contains(key)) confusion[key] = nlohmann::json::object();
    confusion[key][train::vocabulary()[got]] = confusion[key].value(train::vocabulary()[got], 0) + 1;
    // Unmasked pixels: byte-identical to the template's.
    const at::Tensor keep = (c.mask == 0).unsqueeze(0).expand({3, -1, -1});
    if (at::equal(cached_rgb.masked_select(keep), template_rgb.masked_select(keep)) &&
        at::equal(full_rgb.masked_select(keep), template_rgb.masked_select(keep))) {
      ++identical;
    }
    if (i < 16) {
      const at::Tensor mask_rgb = c.mask.unsqueeze(0).expand({3, -1, -1});
      sheet_rows.push_back({template_rgb, mask_rgb, full_rgb, cached_rgb});
    }
    ++done;
    if ((i + 1) % 16 == 0) std::cerr << "bench_model_quality: " << i + 1 << "/" << edits << " edits\n";
  }

  // The design not taken: prompt on every token, so the cache (made without the prompt) is
  // stale for the unmasked tokens of the full recompute.
  double global_ssim = 0.0;
  int global_done = 0;
  const std::string tmp = (fs::temp_directory_path() / ("infill-global-" + std::to_string(::getpid()))).string();
  if (global_edits > 0) {
    auto global_model = load_model(global_prompt_variant(model_dir, tmp));
    if (!global_model.ok()) {
      std::cerr << "Error: " << global_model.status().message() << "\n";
      return 5;
    }
    for (int i = 0; i < std::min(global_edits, edits); ++i) {
      auto cached = run(*global_model, cases[i], i, CacheMode::kUse);
      auto full = run(*global_model, cases[i], i, CacheMode::kOff);
      if (!cached.ok() || !full.ok()) return 5;
      const at::Tensor rows = cases[i].mask.sum(1).nonzero(), cols = cases[i].mask.sum(0).nonzero();
      const int64_t y0 = rows.min().item<int64_t>(), y1 = rows.max().item<int64_t>() + 1;
      const int64_t x0 = cols.min().item<int64_t>(), x1 = cols.max().item<int64_t>() + 1;
      global_ssim += train::ssim(to_rgb_tensor(cached->image).slice(1, y0, y1).slice(2, x0, x1),
                                 to_rgb_tensor(full->image).slice(1, y0, y1).slice(2, x0, x1));
      ++global_done;
    }
    fs::remove_all(tmp);
  }

  // Contact sheet: 16 rows of template | mask | full | cached at 128 px.
  if (!sheet_rows.empty()) {
    std::vector<at::Tensor> rows;
    for (auto& r : sheet_rows) {
      std::vector<at::Tensor> tiles;
      for (auto& t : r) {
        at::Tensor small = at::adaptive_avg_pool2d(t.unsqueeze(0), {128, 128})[0];
        tiles.push_back(at::constant_pad_nd(small, {2, 2, 2, 2}, 1.0));
      }
      rows.push_back(at::cat(tiles, 2));
    }
    if (auto st = save_image(sheet, to_u8(at::cat(rows, 1))); !st.ok()) {
      std::cerr << "Error: " << st.message() << "\n";
      return 5;
    }
  }

  nlohmann::json by_ratio = nlohmann::json::object();
  for (const auto& [k, v] : buckets) by_ratio[k] = {{"ssim_mean", v.first / v.second}, {"edits", v.second}};
  nlohmann::json out = {
      {"machine", bench::machine_info()},
      {"config", {{"model", (*model)->id}, {"guidance", guidance}, {"steps", (*model)->manifest.sampler.steps},
                  {"sampler", (*model)->manifest.sampler.sampler}, {"crop_px", 256}, {"mask_ratio", {0.05, 0.4}},
                  {"seed", seed}, {"held_out_images", data->held_out.size()}}},
      {"ae_psnr_db", ae_psnr},
      {"prompt_adherence", static_cast<double>(adherent) / done},
      {"prompt_adherence_by_target", confusion},
      {"cached_vs_full_ssim_mean", ssim_sum / done},
      {"cached_vs_full_ssim_by_mask_ratio", by_ratio},
      {"global_prompt_cached_vs_full_ssim_mean", global_done ? global_ssim / global_done : 0.0},
      {"global_prompt_edits", global_done},
      {"unmasked_identical_fraction", static_cast<double>(identical) / done},
      {"edits", done},
      {"contact_sheet", sheet},
      {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
  std::cout << out.dump(2) << std::endl;
  return 0;
}
