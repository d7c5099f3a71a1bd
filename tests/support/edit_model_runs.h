#pragma once
// One edit, or one prepare run, driven to its end through the EditModel interface the serving
// worker drives (one session per forward, no scheduler), for tests of a model's behaviour.
#include <memory>

#include "common/status.h"
#include "pipeline/edit_model.h"

namespace infill::test {

/// Runs the edit of `params` on `tmpl` to its last step; `entry` (template-keyed) and
/// `prompt_entry` (prompt-keyed) may be null, as the cache mode wants.
inline Result<EditOutput> edit_to_end(const EditModel& model, std::shared_ptr<const TemplateImage> tmpl,
                                      const EditParams& params, std::shared_ptr<const ActivationEntry> entry,
                                      std::shared_ptr<const ActivationEntry> prompt_entry) {
  INFILL_ASSIGN_OR_RETURN(std::unique_ptr<StepSession> session, model.create_session(tmpl, params, entry, prompt_entry));
  while (!session->done()) {
    StepSession* sessions[] = {session.get()};
    INFILL_RETURN_IF_ERROR(session->apply(model.forward(sessions), session->step() + 1));
  }
  return session->finish();
}

/// Runs a prepare job to its end and returns the activation entry it recorded.
inline std::shared_ptr<const ActivationEntry> prepare_to_end(std::unique_ptr<StepPrepare> run) {
  while (!run->done()) run->run_step();
  return run->entry();
}

}  // namespace infill::test
