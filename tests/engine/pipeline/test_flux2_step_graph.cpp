// A masked FLUX.2 round run as recorded pieces over row buckets (model/flux2_step_graph.h,
// issue 39): padded rows must equal unpadded ones (the eager forward of the same segments), a
// graph must follow its inputs from one replay to the next, and rounds it cannot hold are
// refused by name. On the CPU a "replay" runs the piece again (model/work_capture.h), which
// checks the pieces and what they read; the [cuda] cases replay real CUDA graphs.
#include "support/catch.h"
#include "support/cuda_device.h"
#include "support/random_image.h"
#include "support/temp_dir.h"
#include "support/tiny_flux2.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "model/float8_linear.h"
#include "model/flux2_graph_cache.h"
#include "model/flux2_step_graph.h"
#include "model/flux2_transformer.h"
#include "model/lora_adapter.h"
#include "pipeline/flux2_edit_session.h"
#include "pipeline/flux2_prepare_run.h"

using namespace infill;

namespace {

struct Edits {
  std::shared_ptr<const Flux2Transformer> model;
  std::shared_ptr<const LatentCodec> codec = test::flux2_patch_codec();
  std::shared_ptr<const TemplateImage> tmpl;
  at::Tensor prompt, other_prompt, null_prompt;
  std::shared_ptr<const ActivationEntry> prompt_keyed, template_keyed;

  explicit Edits(std::shared_ptr<const Flux2Transformer> m) : model(std::move(m)) {
    const int context = model->config().context_dim;
    auto png = encode_png(test::random_image(128, 96, 3, PixelFormat::kF32, 5, 0.0f, 1.0f));  // 8 x 6 tokens
    REQUIRE(png.ok());
    auto made = make_template(*codec, codec->factor(), 0.0, 1.0, int64_t{1} << 24, *png, "template.png");
    REQUIRE(made.ok());
    tmpl = *made;
    prompt = at::randn({5, context});
    other_prompt = at::randn({5, context});
    null_prompt = at::randn({5, context});
    prompt_keyed = entry(prompt);
    template_keyed = entry(at::zeros({5, context}));
  }

  std::shared_ptr<const ActivationEntry> entry(const at::Tensor& text) const {
    auto run = Flux2PrepareRun::create(model, tmpl, text, 3, 0, 1.0);
    REQUIRE(run.ok());
    while (!(*run)->done()) (*run)->run_step();
    return (*run)->entry();
  }

  // An edit of the w x h token box at (x, y), in `mode`.
  std::unique_ptr<Flux2EditSession> session(int x, int y, int w, int h, Flux2CacheMode mode, uint64_t seed = 3,
                                            double guidance = 1.0, AdapterSet adapters = {}) const {
    Flux2EditParams params;
    params.mask = at::zeros({96, 128}, at::kFloat);
    params.mask.narrow(0, 16 * y, 16 * h).narrow(1, 16 * x, 16 * w).fill_(1.0);
    params.prompt = prompt;
    params.steps = 3;
    params.seed = seed;
    params.halo_tokens = 0;
    params.guidance = guidance;
    if (guidance > 1.0) params.null_prompt = null_prompt;
    params.adapters = std::move(adapters);
    Flux2Cache cache;
    if (mode == Flux2CacheMode::kPromptKeyed) cache.prompt_keyed = prompt_keyed;
    cache.template_keyed = template_keyed;  // the template-keyed mode's entry, the null half's under guidance
    auto made = Flux2EditSession::create(model, codec, tmpl, params, cache);
    REQUIRE(made.ok());
    REQUIRE((*made)->mode() == mode);
    return std::move(*made);
  }
};

// The small random transformer every CPU case edits with (float32).
std::shared_ptr<const Flux2Transformer> tiny_model() {
  return std::make_shared<const Flux2Transformer>(Flux2Transformer::random(test::tiny_flux2_config(32), 7, at::kFloat));
}

double relative_difference(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.to(at::kCPU, at::kFloat), y = b.to(at::kCPU, at::kFloat);
  return (x - y).abs().max().item<double>() / (1e-12 + y.abs().max().item<double>());
}

std::vector<Flux2Segment> round_of(std::initializer_list<Flux2EditSession*> sessions) {
  std::vector<Flux2Segment> round;
  for (Flux2EditSession* s : sessions) {
    for (const Flux2Segment& seg : s->segments()) round.push_back(seg);
  }
  return round;
}

// Steps `sessions` to their end through one graph per round shape, checking every round against
// the eager forward; returns the largest relative difference seen.
double run_through_graphs(const Flux2Transformer& model, std::initializer_list<Flux2EditSession*> sessions) {
  double worst = 0;
  std::vector<std::unique_ptr<Flux2StepGraph>> graphs;
  while (!(*sessions.begin())->done()) {
    std::vector<Flux2Segment> round = round_of(sessions);
    REQUIRE(flux2_graph_refusal(round, model.config()).empty());
    const Flux2GraphKey key = flux2_graph_key(round);
    auto graph = std::find_if(graphs.begin(), graphs.end(), [&](const auto& g) { return g->key() == key; });
    if (graph == graphs.end()) {
      graphs.push_back(std::make_unique<Flux2StepGraph>(model, key, make_work_capture(model.device())));
      graph = graphs.end() - 1;
    }
    const at::Tensor replayed = (*graph)->run(round);
    const at::Tensor eager = model.forward_on_device(round);
    REQUIRE(replayed.sizes() == eager.sizes());
    worst = std::max(worst, relative_difference(replayed, eager));
    int64_t offset = 0;
    for (Flux2EditSession* s : sessions) {
      const int64_t rows = s->prediction_rows();
      REQUIRE(s->apply(replayed.narrow(0, offset, rows)).ok());
      offset += rows;
    }
  }
  return worst;
}

// Random LoRAs A (rank 4) and B (rank 8) on every linear layer of `cfg` (embedders and
// modulation too), written to `dir` and read back.
std::pair<std::shared_ptr<const LoraAdapter>, std::shared_ptr<const LoraAdapter>> two_loras(const Flux2Config& cfg,
                                                                                            test::TempDir& dir) {
  test::write_random_lora(dir.file("a.safetensors"), cfg, 5, 4);
  test::write_random_lora(dir.file("b.safetensors"), cfg, 6, 8);
  auto a = load_lora(dir.file("a.safetensors"), cfg, "tiny");
  auto b = load_lora(dir.file("b.safetensors"), cfg, "tiny");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  return {*a, *b};
}

}  // namespace

TEST_CASE("Rows are padded to the smallest bucket that holds them, and none above the largest", "[step-graph]") {
  CHECK(flux2_row_bucket(1) == 64);
  CHECK(flux2_row_bucket(64) == 64);
  CHECK(flux2_row_bucket(65) == 128);
  CHECK(flux2_row_bucket(300) == 384);
  CHECK(flux2_row_bucket(1024) == 1024);
  CHECK(flux2_row_bucket(1025) == 0);
  const auto buckets = flux2_row_buckets();
  CHECK(std::is_sorted(buckets.begin(), buckets.end()));
}

TEST_CASE("A padded masked round through the recorded pieces equals the eager forward, in both cache modes, guided and packed",
          "[step-graph]") {
  c10::InferenceMode guard;
  Edits edits(tiny_model());
  const Flux2Transformer& model = *edits.model;
  // float32 on the CPU; the pieces run the same operations on more rows (the padding), which
  // may change a GEMM's blocking but not what a row sums.
  constexpr double kTolerance = 1e-5;
  SECTION("prompt-keyed, one edit") {
    auto a = edits.session(1, 1, 3, 2, Flux2CacheMode::kPromptKeyed);
    CHECK(run_through_graphs(model, {a.get()}) <= kTolerance);
  }
  SECTION("template-keyed: text rows computed too") {
    auto a = edits.session(2, 0, 2, 3, Flux2CacheMode::kTemplateKeyed);
    CHECK(run_through_graphs(model, {a.get()}) <= kTolerance);
  }
  SECTION("guided: two segments per edit") {
    auto a = edits.session(0, 2, 4, 2, Flux2CacheMode::kPromptKeyed, 3, 3.0);
    CHECK(run_through_graphs(model, {a.get()}) <= kTolerance);
  }
  SECTION("two edits of different sizes and modes packed in one round") {
    auto a = edits.session(0, 0, 2, 2, Flux2CacheMode::kPromptKeyed, 3);
    auto b = edits.session(3, 1, 5, 4, Flux2CacheMode::kTemplateKeyed, 4);
    CHECK(run_through_graphs(model, {a.get(), b.get()}) <= kTolerance);
  }
}

TEST_CASE("LoRA edits through the recorded pieces equal the eager forward, each set and strength a graph of its own",
          "[step-graph][lora]") {
  c10::InferenceMode guard;
  Edits edits(tiny_model());
  const Flux2Transformer& model = *edits.model;
  const Flux2Config& cfg = model.config();
  test::TempDir dir;
  const auto [a, b] = two_loras(cfg, dir);
  const AdapterSet just_a = {{a, 1.0}}, a_and_b = {{a, 0.5}, {b, -0.7}};
  constexpr double kTolerance = 1e-5;  // float32 on the CPU, as for the rounds without adapters

  SECTION("one edit with a LoRA, prompt-keyed and template-keyed") {
    auto one = edits.session(1, 1, 3, 2, Flux2CacheMode::kPromptKeyed, 3, 1.0, just_a);
    CHECK(run_through_graphs(model, {one.get()}) <= kTolerance);
    auto text = edits.session(2, 0, 2, 3, Flux2CacheMode::kTemplateKeyed, 3, 1.0, a_and_b);
    CHECK(run_through_graphs(model, {text.get()}) <= kTolerance);
  }
  SECTION("a packed round of segments with different sets: none, A, A + B at other strengths; guided") {
    auto none = edits.session(0, 0, 2, 2, Flux2CacheMode::kPromptKeyed, 3);
    auto with_a = edits.session(3, 1, 5, 4, Flux2CacheMode::kTemplateKeyed, 4, 1.0, just_a);
    auto with_ab = edits.session(0, 2, 4, 2, Flux2CacheMode::kPromptKeyed, 5, 3.0, a_and_b);
    CHECK(run_through_graphs(model, {none.get(), with_a.get(), with_ab.get()}) <= kTolerance);
  }
  SECTION("the set and its strengths are in the key, and the graph applies them") {
    auto plain = edits.session(1, 1, 3, 2, Flux2CacheMode::kPromptKeyed);
    auto adapted = edits.session(1, 1, 3, 2, Flux2CacheMode::kPromptKeyed, 3, 1.0, just_a);
    auto stronger = edits.session(1, 1, 3, 2, Flux2CacheMode::kPromptKeyed, 3, 1.0, {{a, 2.0}});
    std::vector<Flux2Segment> round_plain = round_of({plain.get()}), round_adapted = round_of({adapted.get()}),
                              round_stronger = round_of({stronger.get()});
    const Flux2GraphKey key = flux2_graph_key(round_adapted);
    CHECK_FALSE(key == flux2_graph_key(round_plain));
    CHECK_FALSE(key == flux2_graph_key(round_stronger));
    CHECK(key.segments[0].adapters == adapter_set_key(just_a));
    // The key's text names the adapters by their ids' first 8 digits (appended piece by piece:
    // GCC 12 warns, falsely, on "@" + a string temporary).
    const std::string a8 = a->id.substr(0, 8), b8 = b->id.substr(0, 8);
    std::string one_text = flux2_graph_key(round_plain).text();
    one_text += '@';
    one_text += a8;
    CHECK(key.text() == one_text);
    auto two = edits.session(1, 1, 3, 2, Flux2CacheMode::kPromptKeyed, 3, 1.0, a_and_b);
    std::string two_text = one_text;
    two_text += '+';
    two_text += b8;
    CHECK(flux2_graph_key(round_of({two.get()})).text() == two_text);
    Flux2StepGraph graph(model, key, make_work_capture(model.device()));
    const at::Tensor first = graph.run(round_adapted);
    CHECK(graph.bytes() > Flux2StepGraph(model, flux2_graph_key(round_plain), make_work_capture(model.device())).bytes());
    // The LoRA changes the prediction: the graph did not drop it.
    CHECK(relative_difference(first, model.forward_on_device(round_plain)) > 1e-3);
    CHECK(relative_difference(first, model.forward_on_device(round_adapted)) <= kTolerance);
    CHECK(relative_difference(graph.run(round_adapted), first) <= kTolerance);  // a replay, the same
  }
}

TEST_CASE("A step graph follows its inputs from one run to the next: other rows, prompt, noise and level",
          "[step-graph]") {
  c10::InferenceMode guard;
  Edits edits(tiny_model());
  const Flux2Transformer& model = *edits.model;
  auto a = edits.session(1, 1, 3, 2, Flux2CacheMode::kPromptKeyed, 3);
  auto b = edits.session(4, 2, 2, 4, Flux2CacheMode::kPromptKeyed, 9);  // 8 rows, not 6: the same bucket
  std::vector<Flux2Segment> round_a = round_of({a.get()}), round_b = round_of({b.get()});
  REQUIRE(flux2_graph_key(round_a) == flux2_graph_key(round_b));
  Flux2StepGraph graph(model, flux2_graph_key(round_a), make_work_capture(model.device()));
  CHECK_FALSE(graph.recorded());
  const at::Tensor first = graph.run(round_a);
  CHECK(graph.recorded());
  const at::Tensor second = graph.run(round_b);
  CHECK(second.size(0) == 8);
  CHECK(relative_difference(second, model.forward_on_device(round_b)) <= 1e-5);
  // a, one level on: its rows, timestep and noise moved.
  REQUIRE(a->apply(first).ok());
  std::vector<Flux2Segment> later = round_of({a.get()});
  const at::Tensor third = graph.run(later);
  CHECK(relative_difference(third, model.forward_on_device(later)) <= 1e-5);
  CHECK(relative_difference(third, first) > 1e-3);
}

TEST_CASE("Rounds a step graph cannot hold are refused, naming the segment and why", "[step-graph]") {
  c10::InferenceMode guard;
  Edits edits(tiny_model());
  const Flux2Config& cfg = edits.model->config();
  auto cached = edits.session(1, 1, 3, 2, Flux2CacheMode::kPromptKeyed);
  std::vector<Flux2Segment> round = round_of({cached.get()});
  CHECK(flux2_graph_refusal(round, cfg).empty());
  std::vector<Flux2Segment> whole = round;
  whole[0].kv = nullptr;
  CHECK(flux2_graph_refusal(whole, cfg) == "segment 0: computes every position");
  std::vector<Flux2Segment> with_adapter = round;  // adapters are part of the key, not refused
  with_adapter[0].adapters.push_back(AdapterUse{std::make_shared<LoraAdapter>(), 1.0});
  CHECK(flux2_graph_refusal(with_adapter, cfg).empty());
  std::vector<Flux2Segment> bare = round;
  bare[0].rope_cos = at::Tensor();
  CHECK(flux2_graph_refusal(bare, cfg) == "segment 0: has no tables on the device");
  CHECK(flux2_graph_refusal({}, cfg) == "no segments");
}

namespace {

// The fault seam of a recording that runs out of device memory.
class FailingCapture : public WorkCapture {
 public:
  std::unique_ptr<CapturedWork> capture(const std::function<void()>&) override {
    TORCH_CHECK(false, "CUDA out of memory. Tried to allocate 20.00 MiB");
  }
  int64_t bytes() const override { return 0; }
  std::string kind() const override { return "failing"; }
};

}  // namespace

TEST_CASE("The graph cache records a shape once, replays it after, and evicts the least recently used within its budget",
          "[step-graph]") {
  c10::InferenceMode guard;
  Edits edits(tiny_model());
  const Flux2Transformer& model = *edits.model;
  auto a = edits.session(1, 1, 3, 2, Flux2CacheMode::kPromptKeyed, 3);
  auto b = edits.session(1, 1, 3, 2, Flux2CacheMode::kTemplateKeyed, 3);  // text rows too: another shape
  std::vector<Flux2Segment> round_a = round_of({a.get()}), round_b = round_of({b.get()});
  const int64_t bytes_a = Flux2StepGraph(model, flux2_graph_key(round_a), make_work_capture(model.device())).bytes();
  const int64_t bytes_b = Flux2StepGraph(model, flux2_graph_key(round_b), make_work_capture(model.device())).bytes();
  REQUIRE(bytes_a > 0);
  Flux2GraphCache cache(model, std::max(bytes_a, bytes_b) + std::min(bytes_a, bytes_b) / 2);  // one fits, not two
  const at::Tensor first = cache.run(round_a);
  REQUIRE(first.defined());
  CHECK(relative_difference(first, model.forward_on_device(round_a)) <= 1e-5);
  CHECK(cache.run(round_a).defined());
  StepGraphStats stats = cache.stats();
  CHECK(stats.recorded == 1);
  CHECK(stats.replayed == 1);
  CHECK(stats.graphs == 1);
  CHECK(stats.bytes == bytes_a);
  REQUIRE(cache.run(round_b).defined());
  stats = cache.stats();
  CHECK(stats.recorded == 2);
  CHECK(stats.evicted == 1);  // a made room for b
  CHECK(stats.graphs == 1);
  CHECK(stats.bytes == bytes_b);
  CHECK(stats.bytes <= stats.budget_bytes);
  REQUIRE(cache.run(round_a).defined());  // recorded again
  CHECK(cache.stats().recorded == 3);
  // A round no graph takes (every position computed) is left to the caller.
  std::vector<Flux2Segment> whole = round_a;
  whole[0].kv = nullptr;
  CHECK_FALSE(cache.run(whole).defined());
  CHECK(cache.stats().eager_rounds == 1);
}

TEST_CASE("The graph cache drops the graphs of an adapter nothing else holds and frees it while graphs of held adapters stay",
          "[step-graph][lora]") {
  c10::InferenceMode guard;
  Edits edits(tiny_model());
  const Flux2Transformer& model = *edits.model;
  const Flux2Config& cfg = model.config();
  test::TempDir dir;
  auto [a, b] = two_loras(cfg, dir);
  const std::weak_ptr<const LoraAdapter> weak_a = a, weak_b = b;
  Flux2GraphCache cache(model, int64_t{1} << 30);
  auto plain = edits.session(1, 1, 3, 2, Flux2CacheMode::kPromptKeyed);
  std::vector<Flux2Segment> round_plain = round_of({plain.get()});
  {
    // Three graphs: A alone; A with B in another segment (the same adapter in two graphs); none.
    auto with_a = edits.session(1, 1, 3, 2, Flux2CacheMode::kPromptKeyed, 3, 1.0, {{a, 1.0}});
    auto with_b = edits.session(0, 0, 2, 2, Flux2CacheMode::kPromptKeyed, 4, 1.0, {{b, 0.5}});
    std::vector<Flux2Segment> round_a = round_of({with_a.get()}), round_ab = round_of({with_a.get(), with_b.get()});
    REQUIRE(cache.run(round_a).defined());
    REQUIRE(cache.run(round_ab).defined());
    REQUIRE(cache.run(round_plain).defined());
    REQUIRE(cache.stats().graphs == 3);
    // Held by the sessions and by this test: nothing goes.
    CHECK(cache.drop_released_adapters() == 0);
    b.reset();  // deleted, but an edit still runs with it
    CHECK(cache.drop_released_adapters() == 0);
  }
  // No edit holds B now; A is still held (as the adapter store holds it until a delete).
  REQUIRE_FALSE(weak_b.expired());
  CHECK(cache.drop_released_adapters() == 1);  // the graph of A and B
  CHECK(weak_b.expired());
  REQUIRE_FALSE(weak_a.expired());
  StepGraphStats stats = cache.stats();
  CHECK(stats.graphs == 2);
  CHECK(stats.evicted == 1);
  const int64_t bytes_two = stats.bytes;
  // A let go too: the next round (a replay of the plain graph) drops A's graph before it runs.
  a.reset();
  REQUIRE_FALSE(weak_a.expired());
  const at::Tensor replayed = cache.run(round_plain);
  REQUIRE(replayed.defined());
  CHECK(relative_difference(replayed, model.forward_on_device(round_plain)) <= 1e-5);
  CHECK(weak_a.expired());
  stats = cache.stats();
  CHECK(stats.graphs == 1);
  CHECK(stats.evicted == 2);
  CHECK(stats.replayed == 1);
  CHECK(stats.bytes < bytes_two);
  CHECK(cache.drop_released_adapters() == 0);
}

TEST_CASE("A recording that runs out of device memory leaves the round to the eager step, says so, and is not retried",
          "[step-graph]") {
  c10::InferenceMode guard;
  Edits edits(tiny_model());
  const Flux2Transformer& model = *edits.model;
  int captures = 0;
  Flux2GraphCache cache(model, int64_t{1} << 30, [&captures] {
    ++captures;
    return std::make_unique<FailingCapture>();
  });
  auto a = edits.session(1, 1, 3, 2, Flux2CacheMode::kPromptKeyed, 3);
  std::vector<Flux2Segment> round = round_of({a.get()});
  CHECK_FALSE(cache.run(round).defined());
  StepGraphStats stats = cache.stats();
  CHECK(stats.failed_recordings == 1);
  CHECK(stats.eager_rounds == 1);
  CHECK(stats.graphs == 0);
  CHECK(stats.last_failure.find("out of memory") != std::string::npos);
  CHECK(stats.last_failure.find(flux2_graph_key(round).text()) == 0);
  // The edit goes on eagerly, and the shape is not recorded again.
  REQUIRE(a->apply(model.forward_on_device(round)).ok());
  std::vector<Flux2Segment> next = round_of({a.get()});
  CHECK_FALSE(cache.run(next).defined());
  CHECK(cache.stats().failed_recordings == 1);
  CHECK(cache.stats().eager_rounds == 2);
  CHECK(captures == 1);
}

TEST_CASE("CUDA graphs of a padded masked round replay equal to the eager step and follow their inputs",
          "[step-graph][cuda]") {
  const ComputeDevice cuda = test::require_cuda_or_skip();
  c10::InferenceMode guard;
  // float32, bf16, bf16 with FP8 block weights (where the GPU multiplies FP8), and bf16 and
  // float32 with the fused norm kernels (recorded like libtorch's: they run on the current stream).
  for (const int variant : {0, 1, 2, 3, 4}) {
    const at::ScalarType dtype = variant == 0 || variant == 4 ? at::kFloat : at::kBFloat16;
    auto model = std::make_shared<Flux2Transformer>(Flux2Transformer::random(test::tiny_flux2_config(32), 7, at::kFloat));
    REQUIRE(model->to_device(cuda, dtype).ok());
    if (variant == 2) {
      if (!float8_compute_status(cuda).ok()) continue;
      auto float8 = model->with_float8_weights();
      REQUIRE(float8.ok());
      model = std::make_shared<Flux2Transformer>(std::move(*float8));
      REQUIRE(model->float8_layers() > 0);
    }
    if (variant >= 3) {
      auto fused = model->with_fused_norms();
      REQUIRE(fused.ok());
      model = std::make_shared<Flux2Transformer>(std::move(*fused));
      REQUIRE(model->fused_norms());
    }
    INFO("variant " << variant);
    Edits edits(model);
    auto a = edits.session(1, 1, 3, 2, Flux2CacheMode::kPromptKeyed, 3);
    auto b = edits.session(0, 0, 5, 4, Flux2CacheMode::kTemplateKeyed, 4);
    // float32: the GPU's sums in another order; bf16: one rounding of the activations per
    // operation, where the eager step rounds the same way (the same kernels, recorded).
    const double tolerance = dtype == at::kFloat ? 1e-4 : 2e-2;
    CHECK(run_through_graphs(*model, {a.get(), b.get()}) <= tolerance);
    auto c = edits.session(1, 1, 3, 2, Flux2CacheMode::kPromptKeyed, 3);
    auto d = edits.session(4, 2, 2, 4, Flux2CacheMode::kPromptKeyed, 9);
    std::vector<Flux2Segment> round_c = round_of({c.get()}), round_d = round_of({d.get()});
    Flux2StepGraph graph(*model, flux2_graph_key(round_c), make_work_capture(model->device()));
    const at::Tensor first = graph.run(round_c);
    const at::Tensor second = graph.run(round_d);
    CHECK(relative_difference(second, model->forward_on_device(round_d)) <= tolerance);
    CHECK(relative_difference(first, model->forward_on_device(round_c)) <= tolerance);
    CHECK(graph.bytes() > 0);
  }
}
