#include "pipeline/adapter_load.h"

namespace infill {

AdapterLoad::AdapterLoad(std::vector<std::pair<std::string, double>> uses) : key_(adapter_set_key(uses)) {}

void AdapterLoad::finish(Result<AdapterSet> set) {
  std::lock_guard lock(mu_);
  if (!result_) result_.emplace(std::move(set));
}

bool AdapterLoad::ready() const {
  std::lock_guard lock(mu_);
  return result_.has_value();
}

Status AdapterLoad::failure() const {
  std::lock_guard lock(mu_);
  return result_ && !result_->ok() ? result_->status() : Status();
}

Result<AdapterSet> AdapterLoad::result() const {
  std::lock_guard lock(mu_);
  if (!result_) return Status(ErrorCode::kUnavailable, "the adapters " + key_ + " are still being read");
  return *result_;
}

}  // namespace infill
