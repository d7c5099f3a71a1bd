// End-to-end edits on a small random-weight model written to disk and loaded back.

#include "support/catch.h"
#include <fstream>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include "model/model.h"
#include "pipeline/edit_pipeline.h"
#include "pipeline/image_io.h"
#include "support/damage_files.h"
#include "support/temp_dir.h"
#include "support/tiny_dit.h"

using namespace infill;

namespace {

DitConfig tiny_dit() { return test::tiny_inpainting_dit(); }

// A 72x40 RGB picture: not a multiple of the 16-pixel model grid, so padding is exercised.
PixelImage test_picture() {
  PixelImage img = PixelImage::allocate(72, 40, 3, PixelFormat::kU8);
  auto* p = reinterpret_cast<uint8_t*>(img.data.data());
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x)
      for (int c = 0; c < 3; ++c) p[(y * img.width + x) * 3 + c] = static_cast<uint8_t>((x * 3 + y * 5 + c * 70) % 256);
  return img;
}

struct Fixture {
  c10::InferenceMode guard;
  test::TempDir dir{"infill-pipeline"};
  std::shared_ptr<const Model> model;
  std::shared_ptr<const TemplateImage> tmpl;
  std::unique_ptr<EditPipeline> pipeline;

  Fixture() {
    REQUIRE(write_random_model(dir.file("model"), tiny_dit(), 16, 42).ok());
    auto loaded = load_model(dir.file("model"));
    REQUIRE(loaded.ok());
    model = *loaded;
    auto png = encode_png(test_picture());
    REQUIRE(png.ok());
    auto t = make_template(*model, *png, "picture.png");
    REQUIRE(t.ok());
    tmpl = *t;
    ActivationStoreOptions options;
    options.ram_budget_bytes = 64 << 20;
    auto store = ActivationStore::open(options);
    REQUIRE(store.ok());
    pipeline = std::make_unique<EditPipeline>(model, std::move(*store));
  }

  EditParams params(const at::Tensor& mask, CacheMode cache) const {
    EditParams p;
    p.mask = mask;
    p.seed = 9;
    p.schedule.steps = 4;
    p.cache = cache;
    return p;
  }
};

bool same_bytes(const PixelImage& a, const PixelImage& b) {
  return a.width == b.width && a.height == b.height && a.channels == b.channels && a.format == b.format &&
         a.data == b.data;
}

}  // namespace

TEST_CASE("an empty mask returns the template's pixels bit for bit", "[pipeline][edit]") {
  Fixture f;
  for (CacheMode mode : {CacheMode::kUse, CacheMode::kOff}) {
    auto r = f.pipeline->edit(f.tmpl, f.params(at::zeros({40, 72}), mode));
    REQUIRE(r.ok());
    CHECK(r->steps_run == 0);
    CHECK(r->masked_tokens == 0);
    CHECK(same_bytes(r->image, f.tmpl->pixels));
  }
}

TEST_CASE("with every token masked the mask-aware edit equals the full recompute", "[pipeline][edit]") {
  Fixture f;
  auto cached = f.pipeline->edit(f.tmpl, f.params(at::ones({40, 72}), CacheMode::kUse));
  auto full = f.pipeline->edit(f.tmpl, f.params(at::ones({40, 72}), CacheMode::kOff));
  REQUIRE(cached.ok());
  REQUIRE(full.ok());
  CHECK(cached->masked_tokens == cached->total_tokens);
  CHECK(cached->used_cache);
  CHECK(cached->steps_run == 4);
  // Float tolerance: both paths run the same kernels on the same rows, so at most a rounding
  // difference of one 8-bit level may appear.
  at::Tensor a = to_rgb_tensor(cached->image), b = to_rgb_tensor(full->image);
  CHECK((a - b).abs().max().item<double>() <= 1.0 / 255 + 1e-6);
  // A full regeneration changes the picture.
  CHECK((a - to_rgb_tensor(f.tmpl->pixels)).abs().mean().item<double>() > 0.01);
}

TEST_CASE("patch_rows gathers the same rows as patchifying the whole grid", "[pipeline][edit]") {
  c10::InferenceMode guard;
  test::TempDir dir{"infill-patch-rows"};
  DitConfig cfg = tiny_dit();
  REQUIRE(write_random_model(dir.file("model"), cfg, 8, 3).ok());
  auto model = load_model(dir.file("model"));
  REQUIRE(model.ok());
  const Dit& dit = (*model)->dit;
  const int64_t p = cfg.patch_size, h = 6 * p, w = 10 * p;
  const at::Tensor input = at::randn({cfg.in_channels(), h, w});
  const at::Tensor all_rows = dit.patchify(input);
  // Scattered token ids, out of order, with a repeat and both corners.
  const at::Tensor ids = at::tensor(std::vector<int64_t>{59, 0, 13, 13, 40, 9, 50}, at::kLong);
  CHECK(at::equal(patch_rows(input, p, ids), all_rows.index_select(0, ids)));
  // Any channel count, and a non-contiguous view (the mask channel is a slice).
  const at::Tensor slice = input.narrow(0, 1, 2);
  CHECK(at::equal(patch_rows(slice, p, ids).view({ids.size(0), 2, p, p}),
                  all_rows.index_select(0, ids).view({ids.size(0), cfg.in_channels(), p, p}).narrow(1, 1, 2)));
}

TEST_CASE("pixels outside the mask are bit-identical, inside they change", "[pipeline][edit]") {
  Fixture f;
  at::Tensor mask = at::zeros({40, 72});
  mask.narrow(0, 10, 16).narrow(1, 20, 24).fill_(1.0);
  for (CacheMode mode : {CacheMode::kUse, CacheMode::kOff}) {
    auto r = f.pipeline->edit(f.tmpl, f.params(mask, mode));
    REQUIRE(r.ok());
    REQUIRE(r->image.data.size() == f.tmpl->pixels.data.size());
    const auto* out = reinterpret_cast<const uint8_t*>(r->image.data.data());
    const auto* in = reinterpret_cast<const uint8_t*>(f.tmpl->pixels.data.data());
    int64_t outside_changed = 0, inside_changed = 0;
    for (int y = 0; y < 40; ++y)
      for (int x = 0; x < 72; ++x)
        for (int c = 0; c < 3; ++c) {
          const size_t i = (y * 72 + x) * 3 + c;
          const bool inside = mask[y][x].item<float>() > 0;
          (inside ? inside_changed : outside_changed) += out[i] != in[i];
        }
    CHECK(outside_changed == 0);
    CHECK(inside_changed > 100);
    CHECK(r->masked_tokens < r->total_tokens);
  }
}

TEST_CASE("edits are deterministic given a seed", "[pipeline][edit]") {
  Fixture f;
  at::Tensor mask = at::zeros({40, 72});
  mask.narrow(0, 0, 20).narrow(1, 0, 30).fill_(1.0);
  auto a = f.pipeline->edit(f.tmpl, f.params(mask, CacheMode::kUse));
  auto b = f.pipeline->edit(f.tmpl, f.params(mask, CacheMode::kUse));
  EditParams other = f.params(mask, CacheMode::kUse);
  other.seed = 10;
  auto c = f.pipeline->edit(f.tmpl, other);
  REQUIRE((a.ok() && b.ok() && c.ok()));
  CHECK(same_bytes(a->image, b->image));
  CHECK_FALSE(same_bytes(a->image, c->image));
}

TEST_CASE("prepare stores one entry per template and schedule and reuses it", "[pipeline][cache]") {
  Fixture f;
  ScheduleSpec s;
  s.steps = 3;
  auto first = f.pipeline->prepare(*f.tmpl, s);
  auto second = f.pipeline->prepare(*f.tmpl, s);
  REQUIRE((first.ok() && second.ok()));
  CHECK(first->get() == second->get());
  CHECK((*first)->layout().steps == 3);
  CHECK((*first)->layout().blocks == 2);
  CHECK((*first)->layout().tokens == (80 / 16) * (48 / 16));
  s.template_seed = 1;
  auto third = f.pipeline->prepare(*f.tmpl, s);
  REQUIRE(third.ok());
  CHECK(third->get() != first->get());
}

TEST_CASE("bad edit input gets a clear error", "[pipeline][edit]") {
  Fixture f;
  SECTION("mask size differs from the template") {
    auto r = f.pipeline->edit(f.tmpl, f.params(at::ones({40, 71}), CacheMode::kUse));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(r.status().message(), Catch::Contains("mask is 71x40, template is 72x40"));
  }
  SECTION("strength outside (0, 1]") {
    EditParams p = f.params(at::ones({40, 72}), CacheMode::kOff);
    p.strength = 1.5;
    auto r = f.pipeline->edit(f.tmpl, p);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("strength"));
  }
  SECTION("unknown sampler") {
    EditParams p = f.params(at::ones({40, 72}), CacheMode::kOff);
    p.schedule.sampler = "heun";
    auto r = f.pipeline->edit(f.tmpl, p);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("heun"));
  }
  SECTION("prompt vector of the wrong length") {
    EditParams p = f.params(at::ones({40, 72}), CacheMode::kOff);
    p.prompt = at::ones({3});
    auto r = f.pipeline->edit(f.tmpl, p);
    REQUIRE_FALSE(r.ok());
    CHECK_THAT(r.status().message(), Catch::Contains("expects 8"));
  }
  SECTION("image above the configured maximum") {
    std::ifstream in(f.dir.file("model/manifest.json"));
    nlohmann::json j = nlohmann::json::parse(in);
    j["max_image_pixels"] = 1000;
    std::ofstream(f.dir.file("model/manifest.json")) << j.dump();
    auto small = load_model(f.dir.file("model"));
    REQUIRE(small.ok());
    auto png = encode_png(test_picture());
    auto t = make_template(**small, *png, "picture.png");
    REQUIRE_FALSE(t.ok());
    CHECK_THAT(t.status().message(), Catch::Contains("2880"));
  }
}

namespace {

Result<EditOutput> run_session(const Fixture& f, const EditParams& params, CacheSource source) {
  auto session = EditSession::create(f.model, f.tmpl, params, std::move(source));
  if (!session.ok()) return session.status();
  while (!(*session)->done()) {
    INFILL_RETURN_IF_ERROR((*session)->apply(f.model->dit.forward((*session)->segments())));
  }
  return (*session)->finish();
}

}  // namespace

TEST_CASE("K/V streamed from the disk tier give the same edit as the RAM entry", "[pipeline][cache]") {
  c10::InferenceMode guard;
  Fixture f;
  test::TempDir cache_dir("infill-stream");
  ActivationStoreOptions options;
  options.ram_budget_bytes = 1;  // every entry goes straight to disk
  options.disk_dir = cache_dir.path();
  auto store = ActivationStore::open(options);
  REQUIRE(store.ok());
  std::shared_ptr<ActivationStore> disk_store = std::move(*store);

  // One 16x16 patch plus a one-token halo: 4 of the 15 tokens, so the cache is really read.
  at::Tensor mask = at::zeros({40, 72});
  mask.narrow(0, 2, 10).narrow(1, 2, 10).fill_(1.0);
  EditParams params = f.params(mask, CacheMode::kUse);
  auto entry = f.pipeline->prepare(*f.tmpl, params.schedule);
  REQUIRE(entry.ok());
  const ActivationKey key = make_cache_key(*f.model, *f.tmpl, params.schedule);
  REQUIRE(disk_store->put(key, *entry).ok());
  REQUIRE(disk_store->tier_of(key) == Tier::kDisk);

  auto from_ram = run_session(f, params, CacheSource{*entry, nullptr, 0});
  auto streamed = run_session(f, params, CacheSource{nullptr, std::make_shared<StreamedKvSource>(disk_store, key, (*entry)->layout()), 0});
  REQUIRE((from_ram.ok() && streamed.ok()));
  CHECK(same_bytes(from_ram->image, streamed->image));

  SECTION("recomputing every block is the full recompute") {
    auto all_recomputed = run_session(
        f, params, CacheSource{nullptr, std::make_shared<StreamedKvSource>(disk_store, key, (*entry)->layout()), 2});
    auto full = f.pipeline->edit(f.tmpl, f.params(mask, CacheMode::kOff));
    REQUIRE((all_recomputed.ok() && full.ok()));
    CHECK(same_bytes(all_recomputed->image, full->image));
  }
  SECTION("a damaged file fails the edit instead of using bad data") {
    const int damaged = test::flip_byte_near_end_of_files(cache_dir.path());
    REQUIRE(damaged == 1);
    auto broken = run_session(
        f, params, CacheSource{nullptr, std::make_shared<StreamedKvSource>(disk_store, key, (*entry)->layout()), 0});
    REQUIRE_FALSE(broken.ok());
  }
}

TEST_CASE("classifier-free guidance: two segments sharing the cached K/V, combined as null + g (prompt - null)",
          "[pipeline][edit][guidance]") {
  c10::InferenceMode guard;
  Fixture f;
  at::Tensor mask = at::zeros({f.tmpl->height, f.tmpl->width});
  mask.narrow(0, 8, 20).narrow(1, 20, 30).fill_(1.0);
  EditParams p = f.params(mask, CacheMode::kUse);
  auto entry = f.pipeline->prepare(*f.tmpl, p.schedule);
  REQUIRE(entry.ok());
  auto make = [&](const at::Tensor& prompt, double guidance) {
    EditParams q = p;
    q.prompt = prompt;
    q.guidance_scale = guidance;
    CacheSource source;
    source.entry = *entry;
    auto s = EditSession::create(f.model, f.tmpl, q, source);
    REQUIRE(s.ok());
    return std::move(*s);
  };
  const at::Tensor prompt = at::zeros({8});
  prompt[2] = 1.0f;
  auto guided = make(prompt, 3.0);
  auto prompted = make(prompt, 1.0);
  auto unprompted = make(at::Tensor(), 1.0);
  REQUIRE(guided->guided());
  REQUIRE_FALSE(prompted->guided());

  for (int step = 0; step < 2; ++step) {
    auto segs = guided->segments();
    REQUIRE(segs.size() == 2);
    const at::Tensor rows = f.model->dit.forward(segs);
    REQUIRE(rows.size(0) == guided->prediction_rows());
    const int64_t m = guided->tokens().count();
    // Each half equals the same request run alone with that prompt.
    const at::Tensor with_prompt = f.model->dit.forward(prompted->segments());
    const at::Tensor without = f.model->dit.forward(unprompted->segments());
    CHECK((rows.narrow(0, 0, m) - with_prompt).abs().max().item<double>() < 1e-5);
    CHECK((rows.narrow(0, m, m) - without).abs().max().item<double>() < 1e-5);
    REQUIRE(guided->apply(rows).ok());
    // The unguided session given the combined prediction lands on the same latent.
    REQUIRE(prompted->apply(without + (with_prompt - without) * 3.0).ok());
    REQUIRE(unprompted->apply(without).ok());
    CHECK((guided->predicted_latent() - prompted->predicted_latent()).abs().max().item<double>() < 1e-5);
  }
  auto bad = make(prompt, 1.0);
  CHECK_FALSE(bad->apply(at::zeros({1, 4})).ok());
  EditParams q = p;
  q.guidance_scale = 0.5;
  CHECK_FALSE(EditSession::create(f.model, f.tmpl, q, CacheSource{*entry, nullptr, 0}).ok());
}

TEST_CASE("dropping steps: the session jumps levels, reports them, and keeps unmasked pixels", "[pipeline][edit]") {
  c10::InferenceMode guard;
  Fixture f;
  at::Tensor mask = at::zeros({f.tmpl->height, f.tmpl->width});
  mask.narrow(0, 4, 24).narrow(1, 8, 40).fill_(1.0);
  EditParams p = f.params(mask, CacheMode::kUse);
  p.schedule.steps = 6;
  auto entry = f.pipeline->prepare(*f.tmpl, p.schedule);
  REQUIRE(entry.ok());
  auto session = EditSession::create(f.model, f.tmpl, p, CacheSource{*entry, nullptr, 0});
  REQUIRE(session.ok());
  auto& s = **session;
  CHECK_FALSE(s.apply(f.model->dit.forward(s.segments()), 0).ok());  // must move forward
  REQUIRE(s.apply(f.model->dit.forward(s.segments()), 2).ok());      // 0 -> 2: one dropped
  CHECK(s.step() == 2);
  CHECK_FALSE(s.apply(f.model->dit.forward(s.segments()), 7).ok());  // past the end
  REQUIRE(s.apply(f.model->dit.forward(s.segments()), 5).ok());      // 2 -> 5: two dropped
  REQUIRE(s.apply(f.model->dit.forward(s.segments())).ok());
  REQUIRE(s.done());
  CHECK(s.steps_dropped() == 3);
  auto out = s.finish();
  REQUIRE(out.ok());
  CHECK(out->steps_run == 3);
  CHECK(out->steps_dropped == 3);
  const at::Tensor before = to_rgb_tensor(f.tmpl->pixels), after = to_rgb_tensor(out->image);
  const at::Tensor keep = (mask == 0).unsqueeze(0).expand_as(before);
  CHECK(at::equal(before.masked_select(keep), after.masked_select(keep)));
}
