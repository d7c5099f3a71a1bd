#pragma once
/// A request to the serving runtime and the result it ends with.
///
/// A ServingRequest is moved into the runtime on submit; its callbacks are invoked on the
/// runtime's task pool, never on a step loop, and must not block for long.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/status.h"
#include "pipeline/edit_session.h"
#include "pipeline/image_io.h"
#include "serving/request_state.h"
#include "serving/serving_metrics.h"

namespace infill {

class EditModel;

/// Reported after every step a request runs.
struct RequestProgress {
  uint64_t id = 0;
  int steps_done = 0;   ///< steps run so far
  int steps_total = 0;  ///< steps it will run (lower than requested after a reduction)
};

/// How a request ended: exactly one per request, delivered through on_complete.
struct RequestResult {
  uint64_t id = 0;
  RequestState state = RequestState::kFailed;  ///< done, failed, cancelled or expired
  Status status;                 ///< ok for done; otherwise why (names the stage / input)
  EditOutput output;             ///< done only
  /// done only, when ServingRequest::encode_result: the result file in `result_format`.
  std::vector<std::byte> result_file;
  ImageFileFormat result_format = ImageFileFormat::kPng;
  RequestMetrics metrics;
  std::vector<RequestLifecycle::Entry> history;  ///< every transition, ms since runtime start
};

struct ServingRequest {
  uint64_t id = 0;          ///< unique among live requests, non-zero
  /// The model that runs the edit, one the runtime serves; null = the runtime's first model.
  std::shared_ptr<const EditModel> model;
  uint64_t client_id = 0;   ///< who sent it; supersede only works within one client
  /// Non-zero: this request replaces that older request of the same client, which is
  /// cancelled at its next step boundary.
  uint64_t supersedes = 0;
  /// The template, decoded; or leave null and give the encoded file in template_bytes
  /// (decoded on the task pool).
  std::shared_ptr<const TemplateImage> tmpl;
  std::vector<std::byte> template_bytes;
  /// Mask, prompt, guidance, seed, strength, steps (params.schedule.steps), cache mode.
  EditParams params;
  RequestClass cls = RequestClass::kInteractive;
  /// Relative to submission; default_deadline_ms(cls) when absent.
  std::optional<double> deadline_ms;
  /// End as expired instead of finishing late once the deadline has passed.
  bool expire_at_deadline = false;
  /// Encode the result on the task pool (RequestResult::result_file): as `result_format`, or
  /// in the template's own format (native_file_format) when that is empty.
  bool encode_result = true;
  std::optional<ImageFileFormat> result_format;
  /// 0 = no previews; k = a preview every k steps.
  int preview_every_steps = 0;
  std::function<void(const RequestProgress&)> on_progress;
  /// Decoded predicted image of the masked region's box: [3, h, w] float in [0, 1].
  std::function<void(uint64_t id, int steps_done, const at::Tensor& rgb)> on_preview;
  /// Called exactly once with the terminal result.
  std::function<void(const RequestResult&)> on_complete;
  /// Several devices, each with its own instance of the model (GPUs): called by the runtime's
  /// submit, on the submitting thread, once it routed the request to a device whose instance
  /// is not `model`, with that instance; re-binds what `params` hold for one instance (LoRAs
  /// resolved on its device). An error refuses the submit. Null: nothing to re-bind.
  std::function<Status(EditParams& params, const std::shared_ptr<const EditModel>& model)> rebind;
};

}  // namespace infill
