// FLUX.2 over several CPU devices through a real c10d Gloo group (model/device_group.h,
// model/flux2_sequence_parallel.h): the group's all-to-all, a collective that fails or times
// out, the Ulysses forward against the single-device forward (2, 3 and 4 ranks, with and
// without K/V sinks, with a LoRA; masked steps reading cached K/V), and a guided step's
// halves on two ranks against both packed on one. The reference is Flux2Transformer::forward on one device, itself checked against
// upstream's tensors (test_flux2_transformer.cpp). Tolerance: max |diff| / max |reference|
// <= 1e-5, float32.
#include "support/catch.h"
#include "support/cuda_device.h"
#include "support/device_groups.h"
#include "support/temp_dir.h"
#include "support/flux2_requests.h"
#include "support/tiny_flux2.h"

#include <atomic>
#include <cmath>
#include <chrono>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/InferenceMode.h>

#include "model/flux2_sequence_parallel.h"
#include "model/flux2_transformer.h"
#include "model/kv_io.h"
#include "model/lora_adapter.h"

using namespace infill;

namespace {

// klein's 24 heads (at a tiny width), so that 2, 3, 4, 6 and 8 ranks split them.
Flux2Config heads24_config(bool guidance = false) {
  Flux2Config c = test::tiny_flux2_config(32, guidance);
  c.hidden_size = 192;
  c.num_heads = 24;
  c.mlp_hidden = 384;
  c.double_blocks = 2;
  c.single_blocks = 2;
  c.axes_dim = {2, 2, 2, 2};
  return c;
}

double relative(const at::Tensor& got, const at::Tensor& expected) {
  return (got - expected).abs().max().item<double>() / expected.abs().max().item<double>();
}

// A whole-sequence segment: `text` text rows and an h x w image (ids as FLUX.2 gives them).
Flux2Segment whole_segment(const Flux2Config& cfg, int64_t text, int64_t h, int64_t w, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  Flux2Segment s;
  s.txt = at::randn({text, cfg.context_dim}, gen);
  s.txt_ids = at::zeros({text, 4});
  s.txt_ids.select(1, 3).copy_(at::arange(text, at::kFloat));
  s.img = at::randn({h * w, cfg.input_channels()}, gen);
  s.img_ids = at::zeros({h * w, 4});
  s.img_ids.select(1, 1).copy_(at::arange(h * w, at::kFloat).div(w, "floor"));
  s.img_ids.select(1, 2).copy_(at::arange(h * w, at::kFloat).remainder(w));
  s.timestep = 0.7;
  s.guidance = 3.5;
  return s;
}

// Every block's K/V of a sequence, float32 [L, H] per block (a sink that keeps what it gets).
class KeptKv final : public KvSink {
 public:
  KeptKv(int blocks, int64_t tokens, int64_t hidden) {
    for (int b = 0; b < blocks; ++b) {
      k.push_back(at::full({tokens, hidden}, std::nanf("")));
      v.push_back(at::full({tokens, hidden}, std::nanf("")));
    }
  }
  void store(int block, const at::Tensor& keys, const at::Tensor& values) override {
    k[block].copy_(keys);
    v[block].copy_(values);
  }
  void store_rows(int block, const at::Tensor& positions, const at::Tensor& keys, const at::Tensor& values) override {
    k[block].index_copy_(0, positions, keys.to(at::kFloat));
    v[block].index_copy_(0, positions, values.to(at::kFloat));
  }
  std::vector<at::Tensor> k, v;
};

// The template's K/V as a full forward of `r` at time `t` records them (fp16, as the
// activation cache keeps them).
test::MemoryKv recorded_cache(const Flux2Transformer& model, const test::Request& r, double t) {
  test::MemoryKv cache(/*slabs=*/true);
  Flux2Segment record = test::full_segment(r, t, 3.5);
  record.sink = &cache;
  (void)test::forward_one(model, record);
  return cache;
}

// `r` with the image rows `rows` given new content (the sampler's, in an edit).
test::Request with_new_rows(const Flux2Config& cfg, const test::Request& r, const at::Tensor& rows, uint64_t seed) {
  test::Request edit = r;
  edit.img = r.img.clone();
  edit.img.index_copy_(0, rows, at::randn({rows.size(0), cfg.input_channels()}, at::make_generator<at::CPUGeneratorImpl>(seed)));
  return edit;
}

}  // namespace

TEST_CASE("A Gloo device group trades rows among its ranks, uneven counts included", "[model][parallel]") {
  c10::InferenceMode guard;
  auto group = test::cpu_group_or_skip(3);
  REQUIRE(group.size() == 3);
  CHECK(std::string(group[0]->backend()) == "gloo");
  // Rank r sends (r + 1) * (j + 1) rows to rank j, each row holding (r, j, row index).
  std::vector<at::Tensor> received(3);
  const auto errors = test::on_every_rank(3, [&](int r) {
    std::vector<int64_t> send_rows, recv_rows;
    std::vector<at::Tensor> parts;
    for (int j = 0; j < 3; ++j) {
      send_rows.push_back((r + 1) * (j + 1));
      recv_rows.push_back((j + 1) * (r + 1));
      const int64_t n = send_rows.back();
      parts.push_back(at::stack({at::full({n}, double(r)), at::full({n}, double(j)), at::arange(n, at::kDouble)}, 1).to(at::kFloat));
    }
    received[r] = group[r]->all_to_all(at::cat(parts), send_rows, recv_rows);
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r].empty());
    int64_t row = 0;
    for (int from = 0; from < 3; ++from) {
      const int64_t n = (from + 1) * (r + 1);
      const at::Tensor part = received[r].narrow(0, row, n);
      CHECK(at::all(part.select(1, 0) == from).item<bool>());
      CHECK(at::all(part.select(1, 1) == r).item<bool>());
      CHECK(at::equal(part.select(1, 2), at::arange(n, at::kFloat)));
      row += n;
    }
    CHECK(row == received[r].size(0));
    CHECK(group[r]->collectives() == 1);
    CHECK(group[r]->health().ok());
  }
}

TEST_CASE("A collective that fails on one rank times out on the others and takes the group out of use", "[model][parallel]") {
  c10::InferenceMode guard;
  DeviceGroupOptions options;
  options.timeout = std::chrono::milliseconds(1000);
  // Rank 1's second collective fails before it reaches its peers, as a broken link would.
  options.may_run = [](int rank, uint64_t call) { return !(rank == 1 && call == 1); };
  auto group = test::cpu_group_or_skip(2, options);
  auto exchange = [&](int r) {
    const at::Tensor rows = at::full({4, 8}, double(r)).to(at::kFloat);
    (void)group[r]->all_to_all(rows, {2, 2}, {2, 2});
  };
  const auto first = test::on_every_rank(2, exchange);
  CHECK(first[0].empty());
  CHECK(first[1].empty());
  const auto second = test::on_every_rank(2, exchange);
  CHECK_THAT(second[1], Catch::Contains("test seam"));
  CHECK_THAT(second[0], Catch::Contains("rank 0 of 2"));  // gave up waiting: no hang
  for (int r = 0; r < 2; ++r) {
    const Status health = group[r]->health();
    CHECK_FALSE(health.ok());
    CHECK(health.code() == ErrorCode::kUnavailable);
    CHECK_THAT(health.message(), Catch::Contains("out of use"));
  }
  // Out of use: a later call fails on every rank before it reaches its peers. Rank 0 alone
  // calls: a collective would wait for rank 1 and time out instead ("did not complete").
  const auto alone = test::on_every_rank(1, exchange);
  CHECK_THAT(alone[0], Catch::Contains("is out of use"));
  const auto third = test::on_every_rank(2, exchange);
  for (int r = 0; r < 2; ++r) CHECK_THAT(third[r], Catch::Contains("out of use"));
}

TEST_CASE("A device group refuses devices it cannot join", "[model][parallel]") {
  auto mixed = DeviceGroup::create({ComputeDevice{}, ComputeDevice{true, 0}});
  REQUIRE_FALSE(mixed.ok());
  CHECK_THAT(mixed.status().message(), Catch::Contains("cpu,cuda:0"));
  auto twice = DeviceGroup::create({ComputeDevice{true, 0}, ComputeDevice{true, 0}});
  REQUIRE_FALSE(twice.ok());
  CHECK_THAT(twice.status().message(), Catch::Contains("cuda:0 is named twice") || Catch::Contains("no NCCL"));
  CHECK_FALSE(DeviceGroup::create({}).ok());
}

TEST_CASE("Sequence shares split the text and the image rows evenly over the ranks", "[model][parallel]") {
  const auto shares = flux2_sequence_shares(10, 7, 3);
  REQUIRE(shares.size() == 3);
  CHECK(shares[0].text_begin == 0);
  CHECK(shares[0].text_rows == 4);
  CHECK(shares[1].text_begin == 4);
  CHECK(shares[2].text_rows == 3);
  CHECK(shares[0].image_rows == 3);
  CHECK(shares[1].image_begin == 3);
  CHECK(shares[2].image_begin == 5);
  CHECK(shares[2].image_rows == 2);
}

TEST_CASE("The Ulysses FLUX.2 forward over 2, 3 and 4 Gloo ranks equals the forward on one device", "[model][parallel]") {
  c10::InferenceMode guard;
  test::TempDir dir;
  const Flux2Config cfg = heads24_config(/*guidance=*/true);
  const Flux2Transformer model = test::attentive_flux2(cfg, 11, dir.file("t.safetensors"));
  const int64_t text = 7, h = 5, w = 6, L = text + h * w;
  const int depth = cfg.depth();

  Flux2Segment reference_segment = whole_segment(cfg, text, h, w, 3);
  KeptKv reference_kv(depth, L, cfg.hidden_size);
  reference_segment.sink = &reference_kv;
  const at::Tensor expected = model.forward(std::span<Flux2Segment>(&reference_segment, 1));

  for (int ranks : {2, 3, 4}) {
    DYNAMIC_SECTION(ranks << " ranks") {
      auto group = test::cpu_group_or_skip(ranks);
      const bool with_sink = ranks != 3;  // and without: nothing is recorded
      KeptKv kv(depth, L, cfg.hidden_size);
      std::vector<at::Tensor> got(ranks);
      const auto errors = test::on_every_rank(ranks, [&](int r) {
        Flux2Segment whole = whole_segment(cfg, text, h, w, 3);
        if (with_sink) whole.sink = &kv;
        got[r] = flux2_forward_sequence_parallel(model, whole, *group[r]);
      });
      for (int r = 0; r < ranks; ++r) {
        INFO("rank " << r);
        REQUIRE(errors[r].empty());
        REQUIRE(got[r].sizes() == expected.sizes());
        CHECK(relative(got[r], expected) <= 1e-5);
        CHECK(group[r]->collectives() == static_cast<uint64_t>(2 * depth + 1));  // two per attention, one gather
      }
      if (with_sink) {
        for (int b = 0; b < depth; ++b) {
          INFO("block " << b);
          REQUIRE_FALSE(at::isnan(kv.k[b]).any().item<bool>());  // every rank wrote its rows
          CHECK(relative(kv.k[b], reference_kv.k[b]) <= 1e-5);
          CHECK(relative(kv.v[b], reference_kv.v[b]) <= 1e-5);
        }
      }
    }
  }
}

TEST_CASE("A masked step in Ulysses over 2 and 4 Gloo ranks reading cached K/V equals the masked forward on one device", "[model][parallel]") {
  c10::InferenceMode guard;
  test::TempDir dir;
  const Flux2Config cfg = heads24_config(/*guidance=*/true);
  const Flux2Transformer model = test::attentive_flux2(cfg, 15, dir.file("t.safetensors"));
  // klein's editing layout: 6 text rows, a 5 x 6 image, the same grid again as reference rows.
  const test::Request recorded = test::make_request(cfg, 6, 5, 6, /*reference=*/true, 31);
  test::MemoryKv cache = recorded_cache(model, recorded, 0.6);
  REQUIRE(cache.blocks() == static_cast<size_t>(cfg.depth()));
  // The edit: 17 of the 30 image rows masked, their content new (the sampler's), every other
  // row's K/V read from the cache.
  const at::Tensor masked = at::arange(3, 20, at::kLong);
  const test::Request edit = with_new_rows(cfg, recorded, masked, 4);

  for (bool with_text : {true, false}) {  // template-keyed (the text computed) and prompt-keyed
    const at::Tensor text_rows = with_text ? at::arange(6, at::kLong) : at::empty({0}, at::kLong);
    Flux2Segment one = test::masked_segment(edit, text_rows, masked, 0.6, &cache, 3.5);
    const at::Tensor expected = test::forward_one(model, one);
    REQUIRE(expected.size(0) == 17);
    // The cached rows matter: the same rows over a cache of another template differ.
    test::MemoryKv other = recorded_cache(model, test::make_request(cfg, 6, 5, 6, true, 32), 0.6);
    REQUIRE(relative(test::forward_one(model, test::masked_segment(edit, text_rows, masked, 0.6, &other, 3.5)),
                     expected) > 1e-2);
    for (int ranks : {2, 4}) {
      for (bool slabs : {true, false}) {  // the fp16 slabs, and a source that only fetches floats
        INFO((with_text ? "text computed, " : "text cached, ") << ranks << " ranks, " << (slabs ? "slabs" : "fetch"));
        auto group = test::cpu_group_or_skip(ranks);
        std::vector<at::Tensor> got(ranks);
        std::vector<test::MemoryKv> sources(ranks, test::MemoryKv(slabs));  // each rank's own, the same K/V
        for (int b = 0; b < cfg.depth(); ++b) {
          at::Tensor k = at::empty({edit.length(), cfg.hidden_size}), v = at::empty_like(k);
          cache.fetch(b, k, v);
          for (test::MemoryKv& source : sources) source.store(b, k, v);
        }
        const auto errors = test::on_every_rank(ranks, [&](int r) {
          Flux2Segment whole = test::masked_segment(edit, text_rows, masked, 0.6, &sources[r], 3.5);
          got[r] = flux2_forward_sequence_parallel(model, whole, *group[r]);
        });
        for (int r = 0; r < ranks; ++r) {
          INFO("rank " << r);
          REQUIRE(errors[r].empty());
          REQUIRE(got[r].sizes() == expected.sizes());
          CHECK(relative(got[r], expected) <= 1e-5);
          CHECK(group[r]->collectives() == static_cast<uint64_t>(2 * cfg.depth() + 1));
        }
      }
    }
  }
}

TEST_CASE("A sequence-parallel forward applies a segment's LoRA as the single-device forward does", "[model][parallel]") {
  c10::InferenceMode guard;
  test::TempDir dir;
  const Flux2Config cfg = heads24_config();
  const Flux2Transformer model = test::attentive_flux2(cfg, 12, dir.file("t.safetensors"));
  test::write_random_lora(dir.file("lora.safetensors"), cfg, 5, 4);
  auto lora = load_lora(dir.file("lora.safetensors"), cfg, "model");
  REQUIRE(lora.ok());
  Flux2Segment reference_segment = whole_segment(cfg, 5, 4, 4, 8);
  reference_segment.adapters = {{*lora, 0.8}};
  const at::Tensor expected = model.forward(std::span<Flux2Segment>(&reference_segment, 1));
  Flux2Segment plain = whole_segment(cfg, 5, 4, 4, 8);
  REQUIRE(relative(model.forward(std::span<Flux2Segment>(&plain, 1)), expected) > 1e-2);  // the LoRA matters

  auto group = test::cpu_group_or_skip(2);
  std::vector<at::Tensor> got(2);
  const auto errors = test::on_every_rank(2, [&](int r) {
    Flux2Segment whole = whole_segment(cfg, 5, 4, 4, 8);
    whole.adapters = {{*lora, 0.8}};
    got[r] = flux2_forward_sequence_parallel(model, whole, *group[r]);
  });
  for (int r = 0; r < 2; ++r) {
    REQUIRE(errors[r].empty());
    CHECK(relative(got[r], expected) <= 1e-5);
  }
}

TEST_CASE("A guided step's two halves on two Gloo ranks equal both packed on one device", "[model][parallel]") {
  c10::InferenceMode guard;
  test::TempDir dir;
  const Flux2Config cfg = heads24_config(/*guidance=*/true);
  const Flux2Transformer model = test::attentive_flux2(cfg, 13, dir.file("t.safetensors"));
  auto halves = [&] {
    std::vector<Flux2Segment> s{whole_segment(cfg, 6, 4, 5, 21), whole_segment(cfg, 6, 4, 5, 21)};
    s[1].txt = at::zeros_like(s[1].txt);  // the null prompt's rows stand in for the unconditional half
    return s;
  };
  std::vector<Flux2Segment> packed = halves();
  const at::Tensor expected = model.forward(packed);
  auto group = test::cpu_group_or_skip(2);
  std::vector<at::Tensor> got(2);
  const auto errors = test::on_every_rank(2, [&](int r) {
    std::vector<Flux2Segment> segments = halves();
    got[r] = flux2_forward_segment_per_rank(model, segments, *group[r]);
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[r].empty());
    REQUIRE(got[r].sizes() == expected.sizes());
    CHECK(relative(got[r], expected) <= 1e-5);
  }
}

TEST_CASE("A guided step's halves each in Ulysses over two of four Gloo ranks equal both packed on one device", "[model][parallel]") {
  c10::InferenceMode guard;
  test::TempDir dir;
  const Flux2Config cfg = heads24_config(/*guidance=*/true);
  const Flux2Transformer model = test::attentive_flux2(cfg, 16, dir.file("t.safetensors"));
  // A cache of the template for the masked halves (each rank reads its own copy of it).
  const test::Request recorded = test::make_request(cfg, 6, 4, 5, /*reference=*/true, 41);
  test::MemoryKv cache = recorded_cache(model, recorded, 0.5);
  const at::Tensor masked = at::arange(2, 14, at::kLong);
  const test::Request edit = with_new_rows(cfg, recorded, masked, 5);
  test::Request null_edit = edit;
  null_edit.txt = at::zeros_like(edit.txt);  // the null prompt's rows stand in for the unconditional half

  for (bool cached : {false, true}) {
    INFO((cached ? "masked halves reading the cache" : "whole halves"));
    std::vector<test::MemoryKv> sources(4, cache);  // each rank's own (the same K/V)
    auto halves = [&](test::MemoryKv* kv) {
      if (!cached) return std::vector<Flux2Segment>{test::full_segment(edit, 0.5, 3.5), test::full_segment(null_edit, 0.5, 3.5)};
      const at::Tensor text = at::arange(6, at::kLong);
      return std::vector<Flux2Segment>{test::masked_segment(edit, text, masked, 0.5, kv, 3.5),
                                       test::masked_segment(null_edit, text, masked, 0.5, kv, 3.5)};
    };
    std::vector<Flux2Segment> packed = halves(&cache);
    const at::Tensor expected = model.forward(packed);
    auto whole = test::cpu_group_or_skip(4);
    auto first = test::cpu_group_or_skip(2), second = test::cpu_group_or_skip(2);
    std::vector<at::Tensor> got(4);
    const auto errors = test::on_every_rank(4, [&](int r) {
      const std::vector<Flux2Segment> segments = halves(&sources[static_cast<size_t>(r)]);
      SequenceGroup& half = r < 2 ? *first[static_cast<size_t>(r)] : *second[static_cast<size_t>(r - 2)];
      got[static_cast<size_t>(r)] = flux2_forward_halves_sequence_parallel(model, segments, *whole[static_cast<size_t>(r)], half);
    });
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      REQUIRE(errors[static_cast<size_t>(r)].empty());
      REQUIRE(got[static_cast<size_t>(r)].sizes() == expected.sizes());
      CHECK(relative(got[static_cast<size_t>(r)], expected) <= 1e-5);
      CHECK(whole[static_cast<size_t>(r)]->collectives() == 1);  // the trade with its peer
    }
    for (int r = 0; r < 2; ++r) {
      CHECK(first[static_cast<size_t>(r)]->collectives() == static_cast<uint64_t>(2 * cfg.depth() + 1));
      CHECK(second[static_cast<size_t>(r)]->collectives() == static_cast<uint64_t>(2 * cfg.depth() + 1));
    }
  }
}

TEST_CASE("A sequence-parallel forward refuses what it cannot split", "[model][parallel]") {
  c10::InferenceMode guard;
  const Flux2Config cfg = test::tiny_flux2_config();  // 2 heads
  const Flux2Transformer model = Flux2Transformer::random(cfg, 1, at::kFloat);
  auto group = test::cpu_group_or_skip(3);
  Flux2Segment tiny = whole_segment(cfg, 2, 1, 2, 1);  // 2 image rows for 3 ranks
  auto share = flux2_sequence_share(tiny, *group[0]);
  REQUIRE_FALSE(share.ok());
  CHECK_THAT(share.status().message(), Catch::Contains("2 image rows does not split over 3 ranks"));
  Flux2Segment masked = whole_segment(cfg, 2, 2, 2, 1);
  masked.positions = at::arange(6, at::kLong);
  CHECK_FALSE(flux2_sequence_share(masked, *group[0]).ok());  // positions without cached K/V
  test::MemoryKv kv(true);
  Flux2Segment recording = whole_segment(cfg, 2, 2, 3, 1);
  recording.kv = &kv;
  recording.positions = at::arange(8, at::kLong);
  recording.sequence_length = 10;
  recording.sink = &kv;
  auto records = flux2_sequence_share(recording, *group[0]);
  REQUIRE_FALSE(records.ok());
  CHECK_THAT(records.status().message(), Catch::Contains("records no K/V"));
  recording.sink = nullptr;
  recording.positions = at::arange(5, at::kLong);  // 8 rows computed
  auto unplaced = flux2_sequence_share(recording, *group[0]);
  REQUIRE_FALSE(unplaced.ok());
  CHECK_THAT(unplaced.status().message(), Catch::Contains("positions of its 8 computed rows"));
  // 2 heads over 3 ranks: refused before any collective, on every rank alike.
  const auto errors = test::on_every_rank(3, [&](int r) {
    Flux2Segment whole = whole_segment(cfg, 3, 2, 3, 1);
    (void)flux2_forward_sequence_parallel(model, whole, *group[r]);
  });
  for (int r = 0; r < 3; ++r) CHECK_THAT(errors[r], Catch::Contains("2 heads do not split over 3 ranks"));
  CHECK(group[0]->health().ok());
}

TEST_CASE("On one GPU the group of size 1 runs the sequence-parallel forward through NCCL", "[model][parallel][cuda]") {
  const ComputeDevice cuda = test::require_cuda_or_skip();
  c10::InferenceMode guard;
  test::TempDir dir;
  const Flux2Config cfg = heads24_config();
  Flux2Transformer model = test::attentive_flux2(cfg, 14, dir.file("t.safetensors"));
  REQUIRE(model.to_device(cuda, at::kFloat).ok());
  Flux2Segment reference_segment = whole_segment(cfg, 6, 4, 4, 2);
  const at::Tensor expected = model.forward(std::span<Flux2Segment>(&reference_segment, 1));
  auto group = DeviceGroup::create({cuda});
  REQUIRE(group.ok());
  REQUIRE(group->size() == 1);
  CHECK(std::string((*group)[0]->backend()) == "nccl");
  Flux2Segment whole = whole_segment(cfg, 6, 4, 4, 2);
  const at::Tensor got = flux2_forward_sequence_parallel(model, whole, *(*group)[0]);
  CHECK((*group)[0]->collectives() == static_cast<uint64_t>(2 * cfg.depth() + 1));
  CHECK(relative(got, expected) <= 1e-5);
}
