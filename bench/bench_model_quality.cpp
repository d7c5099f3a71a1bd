// bench_model_quality: quality of the bundled models, the new one (infill-tiny 2, FLUX.2
// architecture, free text) and the old one (infill-tiny, DiT, single colour words) in the same
// run, on the same edits, through the engine's EditModel interface (the code the worker runs).
// Edits: 256 px crops with random masks (ratio 0.05-0.4) and a random colour word, from the
// held-out split of the training data and from photos of a Debian package never used for
// training (ukui-wallpapers). The new model is prompted with held-out phrasings ("the hole
// should be blue", "blue, please", ...); the old one with the bare word. Prints one JSON
// document with, per model and per image source:
//   codec_psnr_db(_outside)  codec round trip of 256 px crops (held-out; outside photos)
//   prompt_adherence         share of edits whose region's mean colour is nearest to the asked
//                            colour word's reference colour, per cache mode
//   blockiness_8 / _16       mean |gradient| on 8 (16) px boundaries over the same inside the
//                            blocks, on the decoded region (mask's box) of the edits; and of
//                            the templates' same boxes for reference
//   cached_vs_full_ssim      SSIM over the mask's box between a cached edit and the full
//                            recompute, same seed (old: cached; new: template_keyed, prompt_keyed
//                            with the entry of a first stroke, the left half of the mask, as live
//                            painting makes it; prompt_keyed_same_mask with the entry of a stroke
//                            on the whole mask, the like-for-like control of the stroke's effect;
//                            prompt_keyed_template_trajectory with the entry of the template's own
//                            trajectory, the baseline)
//   unmasked_identical       share of edits whose pixels outside the mask equal the template's
//   reference_tokens         (new model) what klein-style reference tokens cost at 256 px: one
//                            full forward with and without them (medians of 7) and the cache
//                            entry's bytes per edit with and without
// and writes a contact sheet (template | mask | old | new template-keyed | new prompt-keyed).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "common/blas_kernel.h"
#include "machine_info.h"
#include "model/compute_threads.h"
#include "model/model.h"
#include "pipeline/edit_model.h"
#include "pipeline/flux2_edit_model.h"
#include "pipeline/flux2_sequence.h"
#include "pipeline/image_io.h"
#include "pipeline/load_edit_model.h"
#include "tools/train/captions.h"
#include "tools/train/colour_words.h"
#include "tools/train/image_metrics.h"
#include "tools/train/patch_pca_fit.h"
#include "tools/train/random_masks.h"
#include "tools/train/trainer.h"
#include "tools/train/wallpaper_dataset.h"

using namespace infill;

namespace {

PixelImage to_u8(const at::Tensor& rgb) {  // [3, H, W] in [0, 1]
  at::Tensor hwc = (rgb.clamp(0, 1) * 255.0).round().to(at::kByte).permute({1, 2, 0}).contiguous();
  PixelImage img = PixelImage::allocate(static_cast<int>(rgb.size(2)), static_cast<int>(rgb.size(1)), 3, PixelFormat::kU8);
  std::memcpy(img.data.data(), hwc.data_ptr(), img.data.size());
  return img;
}

struct EditCase {
  std::string source;  // "held_out" or "outside"
  at::Tensor crop, mask;
  int target = 0;
  double ratio = 0.0;
  std::string caption;  // a held-out phrasing of the target word, for the new model
};

struct ModelUnderTest {
  std::string label;  // "new" or "old"
  std::string dir;
  LoadedEditModel loaded;
  std::shared_ptr<const LatentCodec> codec;
  bool free_text = false;
};

// Sums of one (model, source, mode) cell.
struct Tally {
  int edits = 0, adherent = 0, identical = 0;
  double ssim = 0.0, block8 = 0.0, block16 = 0.0;
  int ssim_edits = 0;
  std::map<std::string, std::map<std::string, int>> confusion;
  // Each edit whose colour missed: which prompt, asked and read colour, the region's mean;
  // the phrasings that fail tell the recipe what to train on next.
  nlohmann::json misses = nlohmann::json::array();
};

// The mask's bounding box grown to multiples of 16 px (so that block boundaries line up).
std::array<int64_t, 4> aligned_box(const at::Tensor& mask) {
  const at::Tensor rows = mask.sum(1).nonzero(), cols = mask.sum(0).nonzero();
  const int64_t h = mask.size(0), w = mask.size(1);
  int64_t y0 = rows.min().item<int64_t>() / 16 * 16, y1 = std::min(h, (rows.max().item<int64_t>() + 16) / 16 * 16);
  int64_t x0 = cols.min().item<int64_t>() / 16 * 16, x1 = std::min(w, (cols.max().item<int64_t>() + 16) / 16 * 16);
  return {y0, y1, x0, x1};
}

// The mask's pixels left of its box's middle column: a first stroke that the whole mask grows.
at::Tensor left_half(const at::Tensor& mask) {
  const at::Tensor cols = mask.sum(0).nonzero();
  const int64_t middle = (cols.min().item<int64_t>() + cols.max().item<int64_t>() + 1) / 2;
  at::Tensor half = mask.clone();
  half.narrow(1, middle, mask.size(1) - middle).zero_();
  return half;
}

at::Tensor box_of(const at::Tensor& rgb, const std::array<int64_t, 4>& b) {
  return rgb.slice(1, b[0], b[1]).slice(2, b[2], b[3]);
}

// One full forward of `grid` x `grid` image tokens (plus as many reference tokens when
// `reference`) and `text_rows` text rows, random inputs: the cost of the sequence, not its output.
double full_forward_ms(const Flux2Transformer& transformer, int64_t text_rows, int64_t grid, bool reference) {
  const Flux2Config& cfg = transformer.config();
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(3);
  Flux2Segment s;
  s.txt = at::randn({text_rows, cfg.context_dim}, gen);
  s.txt_ids = flux2_text_ids(text_rows);
  const at::Tensor image_ids = flux2_grid_ids(grid, grid, 0);
  s.img_ids = reference ? at::cat({image_ids, flux2_grid_ids(grid, grid, kFlux2ReferenceTime)}) : image_ids;
  s.img = at::randn({s.img_ids.size(0), cfg.input_channels()}, gen);
  s.timestep = 0.5;
  const auto t = std::chrono::steady_clock::now();
  transformer.forward(std::span<Flux2Segment>(&s, 1));
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

nlohmann::json reference_token_cost(const Flux2EditModel& model) {
  const Flux2Transformer& transformer = *model.parts().transformer;
  const Flux2Config& cfg = transformer.config();
  auto empty = model.parts().text->encode("");  // the text rows every prompt fills: max_sequence_length
  const int64_t text_rows = empty.ok() ? (*empty)->rows.size(0) : 0, grid = 256 / model.token_pixels();
  nlohmann::json out = {{"crop_px", 256}, {"text_rows", text_rows}, {"image_tokens", grid * grid}, {"repeats", 7}};
  double with_ms = 0.0, without_ms = 0.0;
  for (const bool reference : {true, false}) {
    std::vector<double> times;
    full_forward_ms(transformer, text_rows, grid, reference);  // warm-up
    for (int i = 0; i < 7; ++i) times.push_back(full_forward_ms(transformer, text_rows, grid, reference));
    std::sort(times.begin(), times.end());
    (reference ? with_ms : without_ms) = times[times.size() / 2];
  }
  // An entry: steps x blocks x (K, V) x tokens x hidden fp16.
  const auto entry_bytes = [&](int64_t tokens) {
    return int64_t{model.info().default_steps} * cfg.depth() * 2 * tokens * cfg.hidden_size * 2;
  };
  out["full_forward_ms"] = {{"with_reference", with_ms}, {"without_reference", without_ms}, {"ratio", with_ms / without_ms}};
  out["template_keyed_entry_bytes"] = {{"with_reference", entry_bytes(text_rows + 2 * grid * grid)},
                                       {"without_reference", entry_bytes(text_rows + grid * grid)}};
  return out;
}

Result<EditOutput> run_edit(const EditModel& model, const std::shared_ptr<const TemplateImage>& tmpl, const EditParams& params,
                            std::shared_ptr<const ActivationEntry> entry, std::shared_ptr<const ActivationEntry> prompt_entry) {
  INFILL_ASSIGN_OR_RETURN(std::unique_ptr<StepSession> session,
                          model.create_session(tmpl, params, std::move(entry), std::move(prompt_entry)));
  while (!session->done()) {
    StepSession* sessions[] = {session.get()};
    INFILL_RETURN_IF_ERROR(session->apply(model.forward(sessions), session->step() + 1));
  }
  return session->finish();
}

std::shared_ptr<const ActivationEntry> run_prepare(std::unique_ptr<StepPrepare> prepare) {
  while (!prepare->done()) prepare->run_step();
  return prepare->entry();
}

// Image files of an installed Debian package (dpkg's list), or an error naming it.
Result<std::vector<std::string>> package_images(const std::string& package) {
  std::vector<std::string> files;
  FILE* p = ::popen(("dpkg -L " + package + " 2>/dev/null").c_str(), "r");
  if (p == nullptr) return io_error("cannot run dpkg -L " + package);
  char line[4096];
  while (std::fgets(line, sizeof line, p) != nullptr) {
    std::string f(line);
    while (!f.empty() && (f.back() == '\n' || f.back() == '\r')) f.pop_back();
    for (const char* ext : {".jpg", ".png", ".webp"}) {
      if (f.size() > 4 && f.compare(f.size() - std::strlen(ext), std::strlen(ext), ext) == 0) files.push_back(f);
    }
  }
  ::pclose(p);
  if (files.empty()) return not_found("package " + package + " is not installed or holds no images (scripts/setup.sh installs it)");
  return files;
}

nlohmann::json tally_json(const Tally& t) {
  nlohmann::json j = {{"edits", t.edits},
                      {"prompt_adherence", t.edits ? static_cast<double>(t.adherent) / t.edits : 0.0},
                      {"unmasked_identical", t.edits ? static_cast<double>(t.identical) / t.edits : 0.0},
                      {"blockiness_8", t.edits ? t.block8 / t.edits : 0.0},
                      {"blockiness_16", t.edits ? t.block16 / t.edits : 0.0},
                      {"confusion", t.confusion},
                      {"misses", t.misses}};
  if (t.ssim_edits > 0) j["cached_vs_full_ssim"] = t.ssim / t.ssim_edits;
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  infill::select_blas_kernel();  // first: before any GEMM (common/blas_kernel.h)
  std::string new_dir = INFILL_SOURCE_DIR "/resources/models/infill-tiny-2";
  std::string old_dir = INFILL_SOURCE_DIR "/resources/models/infill-tiny";
  std::string sheet = "model_quality_sheet.png", outside_package = "ukui-wallpapers";
  int edits = 96, outside_edits = 32, threads = 2;
  std::string phrasings = "held_out";
  double guidance = 0.0;  // 0: each model's default
  uint64_t seed = 2024;
  const char* usage =
      "usage: bench_model_quality [--model DIR] [--old-model DIR] [--edits N] [--outside-edits N]\n"
      "         [--outside-package NAME] [--sheet PNG] [--seed N] [--threads N] [--phrasings held_out|training]\n"
      "         [--guidance X]\n"
      "Edits held-out and outside pictures with the new model (default: the bundled infill-tiny-2) and the old\n"
      "one (infill-tiny, single-word prompts) in the same run and prints JSON: codec PSNR, blockiness at 8 and 16\n"
      "px, prompt adherence, unmasked pixels identical, cached against full recompute (SSIM) per cache mode.\n";
  // A flag's number, or exit 2 naming the flag and what was expected (not std::stoi's exception).
  auto number = [&](const std::string& flag, const std::string& text, double min) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || *end != '\0' || !(v >= min)) {
      std::cerr << "Error: " << flag << " is \"" << text << "\", expected a number >= " << min << "\n" << usage;
      std::exit(2);
    }
    return v;
  };
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << usage;
      return 0;
    }
    if (i + 1 >= argc) {
      std::cerr << "Error: " << a << " needs a value\n" << usage;
      return 2;
    }
    const std::string v = argv[i + 1];
    if (a == "--model") new_dir = v;
    else if (a == "--old-model") old_dir = v;
    else if (a == "--edits") edits = static_cast<int>(number(a, v, 1));
    else if (a == "--outside-edits") outside_edits = static_cast<int>(number(a, v, 0));
    else if (a == "--outside-package") outside_package = v;
    else if (a == "--sheet") sheet = v;
    else if (a == "--seed") seed = static_cast<uint64_t>(number(a, v, 0));
    else if (a == "--threads") threads = static_cast<int>(number(a, v, 1));
    else if (a == "--phrasings") phrasings = v;
    else if (a == "--guidance") guidance = number(a, v, 0);
    else {
      std::cerr << "Error: unknown option " << a << "\n" << usage;
      return 2;
    }
  }
  if (phrasings != "held_out" && phrasings != "training") {
    std::cerr << "Error: --phrasings is \"" << phrasings << "\", expected held_out or training\n";
    return 2;
  }
  const train::CaptionSplit split = phrasings == "training" ? train::CaptionSplit::kTraining : train::CaptionSplit::kHeldOut;
  set_compute_threads(threads);
  c10::InferenceMode guard;

  std::vector<ModelUnderTest> models;
  for (const auto& [label, dir] : {std::pair{std::string("new"), new_dir}, std::pair{std::string("old"), old_dir}}) {
    auto loaded = load_edit_model(dir);
    if (!loaded.ok()) {
      std::cerr << "Error: " << label << " model: " << loaded.status().message() << "\n";
      return 2;
    }
    ModelUnderTest m{label, dir, *loaded, nullptr, loaded->model->info().free_text};
    if (loaded->dit) {
      m.codec = loaded->dit->autoencoder;
    } else {
      m.codec = static_cast<const Flux2EditModel&>(*loaded->model).parts().codec;
    }
    models.push_back(std::move(m));
  }
  auto data = train::load_dataset({});
  if (!data.ok()) {
    std::cerr << "Error: " << data.status().message() << "\n";
    return 2;
  }
  std::vector<train::SourceImage> outside;
  if (outside_edits > 0) {
    auto files = package_images(outside_package);
    if (!files.ok()) {
      std::cerr << "Error: " << files.status().message() << "\n";
      return 2;
    }
    for (const std::string& f : *files) {
      auto image = train::load_source_image(f, outside_package);
      if (image.ok()) outside.push_back(std::move(*image));
    }
    if (outside.empty()) {
      std::cerr << "Error: no usable image in package " << outside_package << "\n";
      return 2;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();

  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  train::CropOptions crop_options;
  crop_options.size = 256;
  crop_options.augment = false;
  const at::Tensor psnr_crops = train::random_crops(data->held_out, 128, crop_options, gen);
  const at::Tensor outside_psnr_crops = outside.empty() ? at::Tensor() : train::random_crops(outside, 64, crop_options, gen);

  train::MaskOptions mask_options;
  mask_options.size = 256;
  mask_options.min_ratio = 0.05;
  mask_options.max_ratio = 0.4;
  std::vector<EditCase> cases;
  auto add_cases = [&](const std::vector<train::SourceImage>& images, const std::string& source, int n) {
    for (int i = 0; i < n; ++i) {
      EditCase c;
      c.source = source;
      c.crop = train::random_crops(images, 1, crop_options, gen)[0];
      c.mask = train::random_mask(mask_options, gen);
      c.ratio = c.mask.mean().item<double>();
      c.target = static_cast<int>(at::randint(train::kColourWords, {1}, gen).item<int64_t>());
      c.caption = train::make_caption({c.target}, split,
                                      static_cast<uint64_t>(at::randint(0, int64_t{1} << 62, {1}, gen).item<int64_t>()));
      cases.push_back(std::move(c));
    }
  };
  add_cases(data->held_out, "held_out", edits);
  if (outside_edits > 0) add_cases(outside, "outside", outside_edits);

  nlohmann::json report = nlohmann::json::object();
  std::map<std::string, std::map<std::string, Tally>> tallies;  // [model/source][mode]
  std::map<std::string, Tally> template_blockiness;                // [source]
  std::vector<std::vector<at::Tensor>> sheet_rows(std::min<size_t>(16, cases.size()));
  for (size_t i = 0; i < sheet_rows.size(); ++i) {
    sheet_rows[i] = {cases[i].crop, cases[i].mask.unsqueeze(0).expand({3, -1, -1})};
  }
  for (const EditCase& c : cases) {
    const at::Tensor template_rgb = to_rgb_tensor(to_u8(c.crop));
    const auto box = aligned_box(c.mask);
    Tally& tb = template_blockiness[c.source];
    tb.block8 += train::blockiness(box_of(template_rgb, box), 8);
    tb.block16 += train::blockiness(box_of(template_rgb, box), 16);
    ++tb.edits;
  }

  for (const ModelUnderTest& m : models) {
    const EditModel& model = *m.loaded.model;
    const double psnr = train::round_trip_psnr(*m.codec, psnr_crops);
    report[m.label]["model"] = model.info().id;
    report[m.label]["folder"] = m.dir;
    report[m.label]["family"] = model.info().family;
    report[m.label]["steps"] = model.info().default_steps;
    report[m.label]["guidance"] = guidance > 0.0 ? guidance : model.info().default_guidance;
    report[m.label]["codec_psnr_db"] = psnr;
    if (m.free_text) report[m.label]["reference_tokens"] = reference_token_cost(static_cast<const Flux2EditModel&>(model));
    if (outside_psnr_crops.defined()) report[m.label]["codec_psnr_db_outside"] = train::round_trip_psnr(*m.codec, outside_psnr_crops);
    const auto tm = std::chrono::steady_clock::now();
    for (size_t i = 0; i < cases.size(); ++i) {
      const EditCase& c = cases[i];
      auto png = encode_png(to_u8(c.crop));
      if (!png.ok()) return 5;
      auto tmpl = model.make_template(*png, c.source + " crop " + std::to_string(i));
      if (!tmpl.ok()) {
        std::cerr << "Error: " << tmpl.status().message() << "\n";
        return 5;
      }
      EditParams params;
      params.mask = c.mask;
      if (auto s = model.set_prompt(params, m.free_text ? c.caption : train::vocabulary()[c.target]); !s.ok()) {
        std::cerr << "Error: " << s.message() << "\n";
        return 5;
      }
      params.guidance_scale = guidance > 0.0 ? guidance : model.info().default_guidance;
      params.seed = seed + i;
      // Cached modes: the old model's one entry; the new model's template-keyed (the first
      // stroke's) and prompt-keyed (later strokes') entries.
      auto prepare = model.create_prepare(*tmpl, params);
      if (!prepare.ok()) {
        std::cerr << "Error: " << prepare.status().message() << "\n";
        return 5;
      }
      const auto entry = run_prepare(std::move(*prepare));
      std::vector<std::pair<std::string, std::pair<std::shared_ptr<const ActivationEntry>, std::shared_ptr<const ActivationEntry>>>>
          modes = {{"full", {nullptr, nullptr}}};
      if (m.free_text) {
        // Live painting: the prompt-keyed entry is recorded from the first stroke (here the
        // left half of the mask's box), which this edit (the whole mask) grows; and, as the
        // baseline, from the template's trajectory, as before strokes were recorded.
        EditParams first_stroke = params;
        first_stroke.mask = left_half(c.mask);
        auto stroke_prepare = model.create_prompt_prepare(*tmpl, first_stroke);
        auto same_mask_prepare = model.create_prompt_prepare(*tmpl, params);
        EditParams no_stroke = params;
        no_stroke.mask = at::Tensor();
        auto template_prepare = model.create_prompt_prepare(*tmpl, no_stroke);
        for (const auto* made : {&stroke_prepare, &same_mask_prepare, &template_prepare}) {
          if (!made->ok()) {
            std::cerr << "Error: " << made->status().message() << "\n";
            return 5;
          }
        }
        modes.push_back({"template_keyed", {entry, nullptr}});
        modes.push_back({"prompt_keyed", {entry, run_prepare(std::move(*stroke_prepare))}});
        modes.push_back({"prompt_keyed_same_mask", {entry, run_prepare(std::move(*same_mask_prepare))}});
        modes.push_back({"prompt_keyed_template_trajectory", {entry, run_prepare(std::move(*template_prepare))}});
      } else {
        modes.push_back({"cached", {entry, nullptr}});
      }
      at::Tensor full_rgb;
      const at::Tensor template_rgb = to_rgb_tensor(to_u8(c.crop));
      const auto box = aligned_box(c.mask);
      for (const auto& [mode, entries] : modes) {
        EditParams p = params;
        p.cache = mode == "full" ? CacheMode::kOff : CacheMode::kUse;
        auto out = run_edit(model, *tmpl, p, entries.first, entries.second);
        if (!out.ok()) {
          std::cerr << "Error: " << m.label << " edit " << i << " (" << mode << "): " << out.status().message() << "\n";
          return 5;
        }
        const at::Tensor rgb = to_rgb_tensor(out->image);
        Tally& t = tallies[m.label + "/" + c.source][mode];
        ++t.edits;
        const auto mean = train::masked_mean_colour(rgb, c.mask);
        const int got = train::nearest_colour_word({mean[0], mean[1], mean[2]});
        if (got == c.target) {
          ++t.adherent;
        } else {
          t.misses.push_back({{"edit", i},
                              {"prompt", m.free_text ? c.caption : train::vocabulary()[c.target]},
                              {"asked", train::vocabulary()[c.target]},
                              {"got", train::vocabulary()[got]},
                              {"mean_rgb", {mean[0], mean[1], mean[2]}}});
        }
        ++t.confusion[train::vocabulary()[c.target]][train::vocabulary()[got]];
        const at::Tensor keep = (c.mask == 0).unsqueeze(0).expand({3, -1, -1});
        if (at::equal(rgb.masked_select(keep), template_rgb.masked_select(keep))) ++t.identical;
        t.block8 += train::blockiness(box_of(rgb, box), 8);
        t.block16 += train::blockiness(box_of(rgb, box), 16);
        if (mode == "full") {
          full_rgb = rgb;
        } else {
          t.ssim += train::ssim(box_of(rgb, box), box_of(full_rgb, box));
          ++t.ssim_edits;
        }
        if (i < sheet_rows.size() && mode != "full" && mode != "prompt_keyed_template_trajectory" &&
            mode != "prompt_keyed_same_mask")
          sheet_rows[i].push_back(rgb);
      }
      if ((i + 1) % 16 == 0) std::cerr << "bench_model_quality: " << m.label << " " << i + 1 << "/" << cases.size() << " edits\n";
    }
    report[m.label]["seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - tm).count();
  }

  for (const auto& [key, modes] : tallies) {
    const std::string label = key.substr(0, key.find('/')), source = key.substr(key.find('/') + 1);
    for (const auto& [mode, t] : modes) report[label]["by_source"][source][mode] = tally_json(t);
  }
  for (const auto& [source, t] : template_blockiness) {
    report["templates"][source] = {{"edits", t.edits}, {"blockiness_8", t.block8 / t.edits}, {"blockiness_16", t.block16 / t.edits}};
  }

  // Contact sheet: template | mask | old cached | new template-keyed | new prompt-keyed.
  if (!sheet_rows.empty()) {
    std::vector<at::Tensor> rows;
    for (auto& r : sheet_rows) {
      std::vector<at::Tensor> tiles;
      // Columns as pushed: template, mask, new template_keyed, new prompt_keyed, old cached.
      const std::vector<size_t> order = r.size() == 5 ? std::vector<size_t>{0, 1, 4, 2, 3} : std::vector<size_t>{};
      for (size_t k = 0; k < r.size(); ++k) {
        const at::Tensor& t = r[order.empty() ? k : order[k]];
        tiles.push_back(at::constant_pad_nd(t, {2, 2, 2, 2}, 1.0));
      }
      rows.push_back(at::cat(tiles, 2));
    }
    if (auto st = save_image(sheet, to_u8(at::cat(rows, 1))); !st.ok()) {
      std::cerr << "Error: " << st.message() << "\n";
      return 5;
    }
  }
  nlohmann::json out = {{"machine", bench::machine_info()},
                        {"config",
                         {{"crop_px", 256},
                          {"mask_ratio", {0.05, 0.4}},
                          {"seed", seed},
                          {"held_out_images", data->held_out.size()},
                          {"held_out_edits", edits},
                          {"outside_package", outside_package},
                          {"outside_images", outside.size()},
                          {"outside_edits", outside_edits},
                          {"new_prompts", phrasings + " phrasings of the colour word (tools/train/captions.h)"},
                          {"old_prompts", "the colour word"}}},
                        {"models", report},
                        {"contact_sheet", sheet},
                        {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
  std::cout << out.dump(2) << std::endl;
  return 0;
}
