#include "serving/live_cost_model.h"

#include <vector>

namespace infill {

LiveCostModel::LiveCostModel(std::shared_ptr<const StepCostModel> initial) : current_(std::move(initial)) {
  report_.coefficients = current_->coefficients();
}

std::shared_ptr<const StepCostModel> LiveCostModel::current() const {
  std::lock_guard lock(mu_);
  return current_;
}

LiveCostModel::Report LiveCostModel::report() const {
  std::lock_guard lock(mu_);
  return report_;
}

void LiveCostModel::add(const StepSample& sample) {
  if (!(sample.ms > 0)) return;
  window_.push_back(sample);
  if (window_.size() > kWindow) window_.pop_front();
  {
    std::lock_guard lock(mu_);
    report_.samples += 1;
  }
  if (++since_refit_ >= kRefitEvery) {
    since_refit_ = 0;
    refit();
  }
}

void LiveCostModel::refit() {
  const std::vector<StepSample> samples(window_.begin(), window_.end());
  const std::shared_ptr<const StepCostModel> in_use = current();
  const auto old_report = in_use->evaluate(samples);
  auto fitted = StepCostModel::fit(samples);
  if (!fitted.ok() || !old_report.ok()) return;  // too little variety yet: keep what we have
  // A fit that predicts no time for a step it saw would let the scheduler pack anything.
  for (const StepSample& s : samples)
    if (!(fitted->predict_ms(s.tokens, s.batch_size, s.attention_work) > 0)) return;
  const auto new_report = fitted->evaluate(samples);
  std::lock_guard lock(mu_);
  report_.mape = old_report->mape;
  if (!new_report.ok() || new_report->mape >= old_report->mape) return;
  fitted->set_fingerprint(in_use->fingerprint());
  current_ = std::make_shared<const StepCostModel>(std::move(*fitted));
  report_.coefficients = current_->coefficients();
  report_.mape = new_report->mape;
  report_.refits_adopted += 1;
}

}  // namespace infill
