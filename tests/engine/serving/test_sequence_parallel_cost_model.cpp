#include "support/catch.h"

#include "serving/sequence_parallel_cost_model.h"

using namespace infill;

TEST_CASE("the sequence-parallel step time splits compute and adds the all-to-alls",
          "[serving][sp_cost]") {
  SequenceParallelCoefficients c;
  c.text_tokens = 10;
  c.fixed_ms = 2;
  c.ms_per_token = 0.01;
  c.ms_per_token_squared = 1e-5;
  c.hidden = 100;
  c.heads = 24;
  c.all_to_alls_per_step = 4;
  c.all_to_all_latency_ms = 0.5;
  c.bytes_per_element = 2;
  c.link_bytes_per_ms = 1000;
  const Result<SequenceParallelCostModel> m = SequenceParallelCostModel::create(c);
  REQUIRE(m.ok());
  const double rows = 1000 + 10;
  const double compute = 0.01 * rows + 1e-5 * rows * rows;
  CHECK(m->step_ms(1000, 1) == Approx(2 + compute));
  CHECK(m->all_to_all_ms(1000, 1) == 0.0);
  // Degree 4: each device sends (rows / 4) x hidden x 2 bytes x 3/4 per all-to-all.
  const double a2a = 4 * (0.5 + 2.0 * (rows / 4) * 100 * 0.75 / 1000);
  CHECK(m->all_to_all_ms(1000, 4) == Approx(a2a));
  CHECK(m->step_ms(1000, 4) == Approx(2 + compute / 4 + a2a));
  CHECK(m->function()(1000, 4) == Approx(m->step_ms(1000, 4)));
}

TEST_CASE("the FLUX.1-dev H100 preset reproduces its calibration and scales as Ulysses does",
          "[serving][sp_cost]") {
  const SequenceParallelCostModel m = SequenceParallelCostModel::flux1_dev_h100();
  CHECK(m.coefficients().heads == 24);
  // Calibrated on xDiT's 6.71 s for 28 steps at 1024px on one H100.
  CHECK(m.step_ms(4096, 1) == Approx(6710.0 / 28.0));
  // A 2048^2 request speeds up at every degree up to 8; a 256^2 one gains little, and its
  // GPU time (degree x step) grows with the degree.
  for (int d : {2, 3, 4, 6, 8}) CHECK(m.step_ms(16384, d) < m.step_ms(16384, d == 2 ? 1 : d - 1));
  CHECK(m.step_ms(16384, 1) / m.step_ms(16384, 8) > 6.0);
  CHECK(m.step_ms(256, 1) / m.step_ms(256, 8) < 3.0);
  CHECK(8 * m.step_ms(256, 8) > 2 * m.step_ms(256, 2));
  const SequenceParallelCostModel klein = SequenceParallelCostModel::flux2_klein_4b_h100();
  CHECK(klein.step_ms(4096, 1) < m.step_ms(4096, 1));
  CHECK(klein.step_ms(4096, 1) > 0.2 * m.step_ms(4096, 1));
}

TEST_CASE("the sequence-parallel cost model refuses coefficients naming the one at fault",
          "[serving][sp_cost]") {
  SequenceParallelCoefficients c = SequenceParallelCostModel::flux1_dev_h100().coefficients();
  REQUIRE(SequenceParallelCostModel::create(c).ok());
  c.ms_per_token = -1;
  Result<SequenceParallelCostModel> m = SequenceParallelCostModel::create(c);
  REQUIRE_FALSE(m.ok());
  CHECK_THAT(m.status().message(), Catch::Contains("ms_per_token is negative"));
  c = SequenceParallelCostModel::flux1_dev_h100().coefficients();
  c.heads = 0;
  m = SequenceParallelCostModel::create(c);
  REQUIRE_FALSE(m.ok());
  CHECK_THAT(m.status().message(), Catch::Contains("heads is not positive"));
  c = SequenceParallelCostModel::flux1_dev_h100().coefficients();
  c.link_bytes_per_ms = 0;
  m = SequenceParallelCostModel::create(c);
  REQUIRE_FALSE(m.ok());
  CHECK_THAT(m.status().message(), Catch::Contains("link_bytes_per_ms"));
}

TEST_CASE("a guided step packed costs twice one sequence's work, split costs one plus an exchange",
          "[serving][sp_cost][guidance]") {
  SequenceParallelCoefficients c;
  c.text_tokens = 10;
  c.fixed_ms = 2;
  c.ms_per_token = 0.01;
  c.ms_per_token_squared = 1e-5;
  c.hidden = 100;
  c.heads = 24;
  c.all_to_alls_per_step = 4;
  c.all_to_all_latency_ms = 0.5;
  c.bytes_per_element = 2;
  c.link_bytes_per_ms = 1000;
  c.prediction_channels = 16;
  const Result<SequenceParallelCostModel> m = SequenceParallelCostModel::create(c);
  REQUIRE(m.ok());
  const double rows = 1000 + 10;
  const double compute = 0.01 * rows + 1e-5 * rows * rows;
  // Packed on one device: one weight read, twice the linear rows, twice one sequence's
  // attention (the halves do not attend to each other: not (2 rows)^2).
  CHECK(m->guided_step_ms(1000, 1, false) == Approx(2 + 2 * compute));
  CHECK(m->guided_step_ms(1000, 1, false) < 2 + 0.01 * 2 * rows + 1e-5 * 4 * rows * rows);
  // Packed on 4: each all-to-all moves twice the rows at one latency.
  const double a2a2 = 4 * (0.5 + 2.0 * (2 * rows / 4) * 100 * 0.75 / 1000);
  CHECK(m->guided_step_ms(1000, 4, false) == Approx(2 + 2 * compute / 4 + a2a2));
  CHECK(m->guided_step_ms(1000, 4, false) == Approx(2 * m->step_ms(1000, 4) - 2 - 4 * 0.5));
  // Split at 4 (8 devices): one sequence's step at 4, plus the predictions exchanged
  // (1000 image tokens x 16 channels x 4 bytes).
  const double exchange = 0.5 + 4.0 * 1000 * 16 / 1000;
  CHECK(m->guidance_exchange_ms(1000) == Approx(exchange));
  CHECK(m->guided_step_ms(1000, 4, true) == Approx(m->step_ms(1000, 4) + exchange));
  CHECK(m->guided_function()(1000, 4, true) == Approx(m->guided_step_ms(1000, 4, true)));
  c.prediction_channels = -1;
  const Result<SequenceParallelCostModel> bad = SequenceParallelCostModel::create(c);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("prediction_channels is negative"));
}

TEST_CASE("on the FLUX.1-dev preset split halves beat packing on as many devices",
          "[serving][sp_cost][guidance]") {
  const SequenceParallelCostModel m = SequenceParallelCostModel::flux1_dev_h100();
  for (int64_t tokens : {256, 1024, 4096, 16384}) {
    for (int d : {1, 2, 4}) {
      INFO(tokens << " tokens, degree " << d);
      CHECK(m.guided_step_ms(tokens, d, true) < m.guided_step_ms(tokens, 2 * d, false));
      CHECK(m.guided_step_ms(tokens, d, false) > m.guided_step_ms(tokens, d, true));
    }
  }
  // At 1024^2 the halves at once on two devices take about half the packed step on one.
  CHECK(m.guided_step_ms(4096, 1, true) / m.guided_step_ms(4096, 1, false) ==
        Approx(0.5).epsilon(0.03));
}
