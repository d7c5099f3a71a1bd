#include "serving/sequence_parallel_cost_model.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <string>

namespace infill {
namespace {

Status require(bool ok, const char* field, const char* expected) {
  if (ok) return Status::success();
  return invalid_argument(std::string("sequence-parallel cost model: ") + field + " is " +
                          expected);
}

// What both H100 presets share: the compute rate calibrated on xDiT's FLUX.1-dev figure and
// the all-to-all of an NVLink H100 (see flux1_dev_h100 in the header).
constexpr double kH100StepAt4096Ms = 6710.0 / 28.0;  // xDiT: 1024px, 28 steps, 6.71 s
constexpr double kH100FixedMs = 8.0;                 // FLUX.1-dev's weights read once a step
constexpr int64_t kTextTokens = 512;
constexpr double kFlux1FlopPerRow = 2.0 * 6.45e9;  // 19 double (one stream) + 38 single
constexpr double kFlux1FlopPerRowPair = 4.0 * 3072.0 * 57.0;

double h100_flop_per_ms() {
  const double rows = 4096.0 + double(kTextTokens);
  const double flop = kFlux1FlopPerRow * rows + kFlux1FlopPerRowPair * rows * rows;
  return flop / (kH100StepAt4096Ms - kH100FixedMs);
}

SequenceParallelCoefficients h100_coefficients(double flop_per_row, double flop_per_row_pair,
                                               double fixed_ms, int blocks,
                                               int64_t prediction_channels) {
  SequenceParallelCoefficients c;
  c.text_tokens = kTextTokens;
  c.fixed_ms = fixed_ms;
  c.ms_per_token = flop_per_row / h100_flop_per_ms();
  c.ms_per_token_squared = flop_per_row_pair / h100_flop_per_ms();
  c.hidden = 3072;
  c.heads = 24;
  c.all_to_alls_per_step = 4 * blocks;
  c.all_to_all_latency_ms = 0.020;
  c.bytes_per_element = 2.0;
  c.link_bytes_per_ms = 200e9 / 1000.0;
  c.prediction_channels = prediction_channels;
  return c;
}

}  // namespace

Result<SequenceParallelCostModel> SequenceParallelCostModel::create(
    const SequenceParallelCoefficients& c) {
  const auto finite_nonneg = [](double v) { return std::isfinite(v) && v >= 0; };
  INFILL_RETURN_IF_ERROR(require(c.text_tokens >= 0, "text_tokens", "negative, expected >= 0"));
  INFILL_RETURN_IF_ERROR(require(finite_nonneg(c.fixed_ms), "fixed_ms", "negative or not finite"));
  INFILL_RETURN_IF_ERROR(
      require(finite_nonneg(c.ms_per_token), "ms_per_token", "negative or not finite"));
  INFILL_RETURN_IF_ERROR(require(finite_nonneg(c.ms_per_token_squared), "ms_per_token_squared",
                                 "negative or not finite"));
  INFILL_RETURN_IF_ERROR(require(c.hidden > 0, "hidden", "not positive"));
  INFILL_RETURN_IF_ERROR(require(c.heads > 0, "heads", "not positive"));
  INFILL_RETURN_IF_ERROR(require(c.all_to_alls_per_step >= 0, "all_to_alls_per_step", "negative"));
  INFILL_RETURN_IF_ERROR(require(finite_nonneg(c.all_to_all_latency_ms), "all_to_all_latency_ms",
                                 "negative or not finite"));
  INFILL_RETURN_IF_ERROR(
      require(finite_nonneg(c.bytes_per_element), "bytes_per_element", "negative or not finite"));
  INFILL_RETURN_IF_ERROR(require(std::isfinite(c.link_bytes_per_ms) && c.link_bytes_per_ms > 0,
                                 "link_bytes_per_ms", "not positive"));
  INFILL_RETURN_IF_ERROR(
      require(c.prediction_channels >= 0, "prediction_channels", "negative, expected >= 0"));
  INFILL_RETURN_IF_ERROR(require(c.fixed_ms + c.ms_per_token + c.ms_per_token_squared > 0,
                                 "fixed_ms + ms_per_token + ms_per_token_squared",
                                 "0 (a step would take no time)"));
  return SequenceParallelCostModel(c);
}

SequenceParallelCostModel SequenceParallelCostModel::flux1_dev_h100() {
  return SequenceParallelCostModel(
      h100_coefficients(kFlux1FlopPerRow, kFlux1FlopPerRowPair, kH100FixedMs, 19 + 38, 64));
}

SequenceParallelCostModel SequenceParallelCostModel::flux2_klein_4b_h100() {
  // Per stream of a double block and per single block: QKV 3 x 3072^2, projection 3072^2,
  // SwiGLU 3072 x 2 x 9216 in and 9216 x 3072 out: 122.7M weights; 5 + 20 blocks.
  const double per_block = 4.0 * 3072.0 * 3072.0 + 3.0 * 3072.0 * 9216.0;
  // 7.8 GB of bf16 weights at 3.35 TB/s (2.3 ms) plus launches.
  return SequenceParallelCostModel(
      h100_coefficients(2.0 * 25.0 * per_block, 4.0 * 3072.0 * 25.0, 3.0, 5 + 20, 128));
}

double SequenceParallelCostModel::all_to_all_ms(int64_t tokens, int degree) const {
  assert(degree >= 1);
  if (degree <= 1) return 0.0;
  const double rows = double(tokens + c_.text_tokens);
  const double d = double(degree);
  const double bytes = c_.bytes_per_element * (rows / d) * double(c_.hidden) * (d - 1.0) / d;
  return double(c_.all_to_alls_per_step) *
         (c_.all_to_all_latency_ms + bytes / c_.link_bytes_per_ms);
}

double SequenceParallelCostModel::step_ms(int64_t tokens, int degree) const {
  assert(degree >= 1);
  const double rows = double(tokens + c_.text_tokens);
  const double compute = c_.ms_per_token * rows + c_.ms_per_token_squared * rows * rows;
  return c_.fixed_ms + compute / double(std::max(1, degree)) + all_to_all_ms(tokens, degree);
}

double SequenceParallelCostModel::guidance_exchange_ms(int64_t tokens) const {
  return c_.all_to_all_latency_ms +
         4.0 * double(tokens) * double(c_.prediction_channels) / c_.link_bytes_per_ms;
}

double SequenceParallelCostModel::guided_step_ms(int64_t tokens, int degree, bool split) const {
  assert(degree >= 1);
  if (split) return step_ms(tokens, degree) + guidance_exchange_ms(tokens);
  // Two sequences in one forward: twice the rows through the linear layers, twice one
  // sequence's attention (the halves do not attend to each other), one weight read, and
  // all-to-alls of twice the rows at one latency each.
  const double rows = double(tokens + c_.text_tokens);
  const double compute = c_.ms_per_token * rows + c_.ms_per_token_squared * rows * rows;
  const double d = double(std::max(1, degree));
  double a2a = 0;
  if (degree > 1) {
    const double bytes =
        c_.bytes_per_element * (2.0 * rows / d) * double(c_.hidden) * (d - 1.0) / d;
    a2a =
        double(c_.all_to_alls_per_step) * (c_.all_to_all_latency_ms + bytes / c_.link_bytes_per_ms);
  }
  return c_.fixed_ms + 2.0 * compute / d + a2a;
}

StepMsFunction SequenceParallelCostModel::function() const {
  return [model = *this](int64_t tokens, int degree) { return model.step_ms(tokens, degree); };
}

GuidedStepMsFunction SequenceParallelCostModel::guided_function() const {
  return [model = *this](int64_t tokens, int degree, bool split) {
    return model.guided_step_ms(tokens, degree, split);
  };
}

}  // namespace infill
