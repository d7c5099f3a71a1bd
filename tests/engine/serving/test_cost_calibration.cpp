#include "support/catch.h"

#include <cmath>
#include <filesystem>

#include "serving/cost_calibration.h"
#include "serving_fixture.h"

using namespace infill;
using infill::test::ServingFixture;

TEST_CASE("calibration fits step latency on the real model and persists it", "[serving][calibration]") {
  ServingFixture f(1);
  CalibrationOptions o;
  o.latent_width = 16;
  o.latent_height = 16;
  o.points = 16;
  o.repeats = 2;
  o.cache_path = f.dir.file("cost.json");
  o.disk_dir = f.dir.file("disk");
  auto c = load_or_calibrate(*f.model, o);
  REQUIRE(c.ok());
  CHECK_FALSE(c->loaded);
  CHECK(c->train.size() + c->test.size() == 16);
  CHECK(c->held_out.test == c->test.size());
  CHECK(std::isfinite(c->held_out.r2));
  CHECK(std::isfinite(c->held_out.mape));
  CHECK(c->full_step_ms > 0);
  CHECK(c->tiers.ram_ms_per_block >= 0);
  CHECK(c->tiers.disk_ms_per_block >= c->tiers.ram_ms_per_block);
  CHECK(c->model.fingerprint() == calibration_fingerprint(*f.model, o));
  REQUIRE(std::filesystem::exists(o.cache_path));

  // Same model and threads: read back, no timing.
  auto again = load_or_calibrate(*f.model, o);
  REQUIRE(again.ok());
  CHECK(again->loaded);
  CHECK(again->model.coefficients() == c->model.coefficients());
  CHECK(again->held_out.r2 == c->held_out.r2);

  // A different thread count invalidates the file: calibrated afresh and rewritten.
  o.threads = 2;
  auto refreshed = load_or_calibrate(*f.model, o);
  REQUIRE(refreshed.ok());
  CHECK_FALSE(refreshed->loaded);
  CHECK(refreshed->model.fingerprint() == calibration_fingerprint(*f.model, o));
}

TEST_CASE("calibration rejects a grid that is not a multiple of the patch", "[serving][calibration]") {
  ServingFixture f(1);
  CalibrationOptions o;
  o.latent_width = 15;
  auto c = calibrate_step_cost(*f.model, o);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().message().find("15x48") != std::string::npos);
}
