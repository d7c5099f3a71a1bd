#include "support/catch.h"

#include <cmath>
#include <random>

#include "serving/cost_model.h"

using namespace infill;

namespace {

// Ground truth used to synthesise timings: 3 ms fixed, 2 us/token, 0.4 ms/request, 1e-7 ms/unit.
double truth_ms(double tokens, double batch, double attention) {
  return 3.0 + 0.002 * tokens + 0.4 * batch + 1e-7 * attention;
}

std::vector<StepSample> synth(int n, double noise_frac, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> batch_d(1, 8);
  std::uniform_int_distribution<int> tok_d(16, 1024);
  std::uniform_int_distribution<int> total_d(1024, 8192);  // image tokens per request
  std::normal_distribution<double> noise(0.0, noise_frac);
  std::vector<StepSample> out;
  for (int i = 0; i < n; ++i) {
    const int batch = batch_d(rng);
    double tokens = 0, attention = 0;
    for (int r = 0; r < batch; ++r) {
      const double masked = tok_d(rng);
      tokens += masked;
      attention += masked * total_d(rng);
    }
    const double ms = truth_ms(tokens, batch, attention) * (1.0 + noise(rng));
    out.push_back({tokens, static_cast<double>(batch), attention, ms});
  }
  return out;
}

}  // namespace

TEST_CASE("noise-free samples recover the generating coefficients", "[serving][cost]") {
  auto fit = StepCostModel::fit(synth(40, 0.0, 1));
  REQUIRE(fit.ok());
  const auto& c = fit->coefficients();
  CHECK(c[0] == Approx(3.0).epsilon(1e-4));
  CHECK(c[1] == Approx(0.002).epsilon(1e-4));
  CHECK(c[2] == Approx(0.4).epsilon(1e-4));
  CHECK(c[3] == Approx(1e-7).epsilon(1e-4));
  CHECK(fit->predict_ms(2000, 3, 2000 * 4096.0) ==
        Approx(truth_ms(2000, 3, 2000 * 4096.0)).epsilon(1e-6));
  CHECK(fit->train_samples() == 40);
}

TEST_CASE("held-out evaluation reports R2 and MAPE", "[serving][cost]") {
  auto fit = StepCostModel::fit(synth(200, 0.02, 2));
  REQUIRE(fit.ok());
  auto report = fit->evaluate(synth(100, 0.02, 3));
  REQUIRE(report.ok());
  CHECK(report->train == 200);
  CHECK(report->test == 100);
  // 2% multiplicative noise: MAPE about 1.6% (E|N(0,.02)|), R2 close to 1.
  CHECK(report->mape > 0.5);
  CHECK(report->mape < 3.0);
  CHECK(report->r2 > 0.97);
  CHECK(report->r2 <= 1.0);

  // Hand-computed: a model predicting exactly truth on two points with targets 10% off.
  auto exact = StepCostModel::fit(synth(20, 0.0, 4));
  REQUIRE(exact.ok());
  const double p1 = truth_ms(100, 1, 100 * 4096.0), p2 = truth_ms(900, 2, 900 * 4096.0);
  auto off = exact->evaluate({{100, 1, 100 * 4096.0, p1 * 1.1}, {900, 2, 900 * 4096.0, p2 * 1.1}});
  REQUIRE(off.ok());
  CHECK(off->mape == Approx(100.0 * (0.1 / 1.1)).epsilon(1e-4));
  CHECK_FALSE(exact->evaluate({}).ok());
}

TEST_CASE("a constant batch size is collinear with the intercept but still fits",
          "[serving][cost]") {
  std::vector<StepSample> s;
  for (int t = 100; t <= 1000; t += 100) {
    s.push_back({double(t), 1.0, t * 512.0, truth_ms(t, 1, t * 512.0)});
  }
  auto fit = StepCostModel::fit(s);
  REQUIRE(fit.ok());
  for (const StepSample& x : s) {
    CHECK(fit->predict_ms(x.tokens, x.batch_size, x.attention_work) == Approx(x.ms).epsilon(1e-5));
  }
}

TEST_CASE("fit rejects too few, non-finite and degenerate samples", "[serving][cost]") {
  auto three = StepCostModel::fit(synth(3, 0.0, 5));
  REQUIRE_FALSE(three.ok());
  CHECK(three.status().message().find("at least 4") != std::string::npos);

  auto nan = synth(10, 0.0, 6);
  nan[4].ms = std::nan("");
  auto bad = StepCostModel::fit(nan);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("sample 4") != std::string::npos);

  std::vector<StepSample> flat(6, StepSample{128, 2, 128 * 1024.0, 5.0});
  auto degenerate = StepCostModel::fit(flat);
  REQUIRE_FALSE(degenerate.ok());
  CHECK(degenerate.status().message().find("degenerate") != std::string::npos);
}

TEST_CASE("JSON round-trips coefficients and fingerprint", "[serving][cost]") {
  auto fit = StepCostModel::fit(synth(50, 0.01, 7));
  REQUIRE(fit.ok());
  StepCostModel model = *fit;
  model.set_fingerprint(StepCostModel::make_fingerprint("sd3-medium", 8));
  CHECK(model.fingerprint() == "sd3-medium/threads=8");
  auto loaded = StepCostModel::from_json(model.to_json());
  REQUIRE(loaded.ok());
  CHECK(loaded->fingerprint() == model.fingerprint());
  CHECK(loaded->train_samples() == 50);
  for (int i = 0; i < 4; ++i) CHECK(loaded->coefficients()[i] == model.coefficients()[i]);
  CHECK(loaded->fingerprint() != StepCostModel::make_fingerprint("sd3-medium", 4));
}

TEST_CASE("from_json rejects malformed files naming the field", "[serving][cost]") {
  CHECK(StepCostModel::from_json("not json").status().code() == ErrorCode::kCorruptData);
  CHECK_FALSE(StepCostModel::from_json("[1,2]").ok());
  auto no_fp = StepCostModel::from_json(
      R"({"format":"infill-step-cost","version":1,"coefficients":[1,2,3,4],"train":5})");
  REQUIRE_FALSE(no_fp.ok());
  CHECK(no_fp.status().message().find("fingerprint") != std::string::npos);
  auto short_coef = StepCostModel::from_json(
      R"({"format":"infill-step-cost","version":1,"fingerprint":"x","coefficients":[1,2],"train":5})");
  REQUIRE_FALSE(short_coef.ok());
  CHECK(short_coef.status().message().find("coefficients") != std::string::npos);
  auto wrong_version = StepCostModel::from_json(
      R"({"format":"infill-step-cost","version":2,"fingerprint":"x","coefficients":[1,2,3,4],"train":5})");
  REQUIRE_FALSE(wrong_version.ok());
  CHECK(wrong_version.status().message().find("version") != std::string::npos);
}
