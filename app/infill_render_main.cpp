// infill-render: headless edits. For now one edit from flags; job files come with the
// render-farm issue. Prints a JSON summary on stdout; errors go to stderr as "Error: ...".
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "cache/activation_store.h"
#include "model/compute_threads.h"
#include "model/model.h"
#include "model/prompt_encoder.h"
#include "pipeline/edit_pipeline.h"
#include "pipeline/image_io.h"
#include "pipeline/mask.h"
#include "pipeline/template_image.h"

namespace {

constexpr const char* kUsage = R"(usage: infill-render --model DIR --template IMAGE --mask IMAGE --out-dir DIR [options]

Edits IMAGE inside MASK (white = regenerate, black = keep) and writes DIR/before.png,
DIR/mask.png and DIR/after.png (after.<ext> with --format).
Exit codes: 0 done, 2 bad input (options, files, sizes), 5 engine or system failure.

options:
  --prompt TEXT     words from the model's vocabulary (infill-tiny: colours and bright/dark)
  --guidance G      classifier-free guidance scale in [1, 20] (default: the model's)
  --seed N          noise seed of the edit (default 1)
  --steps N         denoising steps (default: the model's)
  --strength S      (0, 1], 1 = regenerate from pure noise (default 1)
  --sampler NAME    euler_rf or ddim (default: the model's)
  --halo N          masked-token halo in tokens (default 1)
  --feather PX      inward feather of the composite in pixels (default 4)
  --no-cache        recompute every token at every step (the baseline)
  --cache-dir DIR   disk tier of the activation cache (default: $XDG_CACHE_HOME/infill/activations)
  --threads N       compute threads (default: all cores)
  --format EXT      png (default), tif or exr for the result
)";

int fail(const std::string& message, int code) {
  std::cerr << "Error: " << message << "\n";
  return code;
}

// Bad input (2) versus a failure of the engine or the system (5).
int exit_code(const infill::Status& status) {
  switch (status.code()) {
    case infill::ErrorCode::kInvalidArgument:
    case infill::ErrorCode::kNotFound:
    case infill::ErrorCode::kOutOfRange:
    case infill::ErrorCode::kCorruptData:  // an undecodable image or mask file
      return 2;
    default:
      return 5;
  }
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> opts;
  const std::map<std::string, bool> known = {
      {"--model", true},  {"--template", true}, {"--mask", true},      {"--out-dir", true}, {"--seed", true},
      {"--steps", true},  {"--strength", true}, {"--sampler", true},   {"--halo", true},    {"--feather", true},
      {"--no-cache", false}, {"--cache-dir", true}, {"--threads", true}, {"--format", true}, {"--help", false},
      {"--prompt", true}, {"--guidance", true}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto it = known.find(arg);
    if (it == known.end()) return fail("unknown option " + arg + "\n" + kUsage, 2);
    if (it->second) {
      if (i + 1 >= argc) return fail(arg + " needs a value", 2);
      opts[arg] = argv[++i];
    } else {
      opts[arg] = "1";
    }
  }
  if (opts.count("--help")) {
    std::cout << kUsage;
    return 0;
  }
  for (const char* required : {"--model", "--template", "--mask", "--out-dir"}) {
    if (!opts.count(required)) return fail(std::string("missing ") + required + "\n" + kUsage, 2);
  }
  auto number = [&](const std::string& key, double fallback, double& out) -> bool {
    if (!opts.count(key)) {
      out = fallback;
      return true;
    }
    char* end = nullptr;
    out = std::strtod(opts[key].c_str(), &end);
    return end != opts[key].c_str() && *end == '\0';
  };
  double seed, steps, strength, halo, feather, threads, guidance;
  if (!number("--guidance", 0, guidance)) return fail("--guidance takes a number", 2);
  if (!number("--seed", 1, seed) || !number("--steps", 0, steps) || !number("--strength", 1, strength) ||
      !number("--halo", 1, halo) || !number("--feather", 4, feather) || !number("--threads", 0, threads)) {
    return fail("--seed, --steps, --strength, --halo, --feather and --threads take numbers", 2);
  }
  infill::set_compute_threads(static_cast<int>(threads));
  const std::string format = opts.count("--format") ? opts["--format"] : "png";
  if (format != "png" && format != "tif" && format != "exr") return fail("--format is " + format + ", expected png, tif or exr", 2);

  const auto t_start = std::chrono::steady_clock::now();
  auto model = infill::load_model(opts["--model"]);
  if (!model.ok()) return fail(model.status().message(), exit_code(model.status()));
  const double load_ms = ms_since(t_start);

  infill::ActivationStoreOptions store_options;
  store_options.ram_budget_bytes = size_t{4} << 30;
  store_options.disk_dir = opts.count("--cache-dir") ? opts["--cache-dir"] : infill::default_cache_dir();
  store_options.disk_budget_bytes = size_t{16} << 30;
  auto store = infill::ActivationStore::open(store_options);
  if (!store.ok()) return fail(store.status().message(), 5);
  infill::EditPipeline pipeline(*model, std::move(*store));

  auto tmpl = infill::load_template(**model, opts["--template"]);
  if (!tmpl.ok()) return fail(tmpl.status().message(), exit_code(tmpl.status()));
  auto mask = infill::load_mask(opts["--mask"], (*tmpl)->width, (*tmpl)->height);
  if (!mask.ok()) return fail(mask.status().message(), exit_code(mask.status()));

  infill::EditParams params;
  params.mask = *mask;
  auto prompt = infill::encode_prompt((*model)->manifest, opts.count("--prompt") ? opts["--prompt"] : "");
  if (!prompt.ok()) return fail(prompt.status().message(), 2);
  params.prompt = *prompt;
  params.guidance_scale = opts.count("--guidance") ? guidance : (*model)->manifest.default_guidance;
  params.seed = static_cast<uint64_t>(seed);
  params.strength = strength;
  params.schedule.steps = static_cast<int>(steps);
  if (opts.count("--sampler")) params.schedule.sampler = opts["--sampler"];
  params.halo_tokens = static_cast<int>(halo);
  params.feather_px = static_cast<float>(feather);
  params.cache = opts.count("--no-cache") ? infill::CacheMode::kOff : infill::CacheMode::kUse;

  double prepare_ms = 0;
  if (params.cache == infill::CacheMode::kUse) {
    const auto t0 = std::chrono::steady_clock::now();
    auto prepared = pipeline.prepare(**tmpl, params.schedule);
    if (!prepared.ok()) return fail(prepared.status().message(), exit_code(prepared.status()));
    prepare_ms = ms_since(t0);
  }
  const auto t_edit = std::chrono::steady_clock::now();
  auto result = pipeline.edit(*tmpl, params);
  if (!result.ok()) return fail(result.status().message(), exit_code(result.status()));
  const double edit_ms = ms_since(t_edit);

  const std::filesystem::path out_dir(opts["--out-dir"]);
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return fail("cannot create " + out_dir.string() + ": " + ec.message(), 5);
  const std::string before = (out_dir / "before.png").string();
  const std::string after = (out_dir / ("after." + format)).string();
  for (const auto& [path, image] : {std::pair<std::string, const infill::PixelImage*>{before, &(*tmpl)->pixels},
                                    {after, &result->image}}) {
    if (auto st = infill::save_image(path, *image); !st.ok()) return fail(st.message(), 5);
  }
  std::filesystem::copy_file(opts["--mask"], out_dir / "mask.png", std::filesystem::copy_options::overwrite_existing, ec);

  nlohmann::json summary = {
      {"model", (*model)->id},
      {"template", (*tmpl)->id},
      {"size", {(*tmpl)->width, (*tmpl)->height}},
      {"masked_tokens", result->masked_tokens},
      {"total_tokens", result->total_tokens},
      {"mask_ratio", result->total_tokens ? double(result->masked_tokens) / result->total_tokens : 0.0},
      {"steps_run", result->steps_run},
      {"prompt", opts.count("--prompt") ? opts["--prompt"] : ""},
      {"guidance", params.guidance_scale},
      {"used_cache", result->used_cache},
      {"load_ms", load_ms},
      {"prepare_ms", prepare_ms},
      {"edit_ms", edit_ms},
      {"before", before},
      {"after", after}};
  std::cout << summary.dump(2) << std::endl;
  return 0;
}
