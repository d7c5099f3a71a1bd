#pragma once
/// POST /v1/edits's parameters, checked against the edit-parameter table
/// (protocol/infill_protocol/edit_parameters.h) and read into plain fields: unknown keys,
/// types, ranges, enums, the prompt's length, the class and the one mask source. What needs
/// the engine's state (the model, the template, decoding the mask) comes after, in the
/// service. Torch-free and lock-free: a pure function of the request.

#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_reply.h"
#include "serving/request_state.h"

namespace infill {

struct EditRequestFields {
  std::string template_id;
  std::string prompt;
  std::string model;  ///< "" = the default model
  std::string sampler;
  std::string output_format;  ///< "" or "template" = the template's own (native_file_format)
  RequestClass cls = RequestClass::kInteractive;
  std::optional<double> seed, steps, strength, guidance, deadline_ms, preview_every_steps, supersedes, halo_tokens,
      feather_px;
  /// Exactly one of these holds the mask: encoded bytes (a 'mask' part or mask_png_base64,
  /// decoded) or a rectangle (mask_rect, checked against the template later).
  std::string mask_bytes;
  nlohmann::json mask_rect;  ///< null when the mask is bytes
  /// LoRAs in order: (adapter id, strength); checked against the store in the service.
  std::vector<std::pair<std::string, double>> adapters;
  std::vector<std::string> references;  ///< reference templates' ids, in order
  std::optional<double> adapters_from_step;
};

/// The fields of `params`, or the 400 reply naming the parameter and what was expected.
/// `mask_part` holds the bytes of a multipart 'mask' part ("" when none).
std::variant<EditRequestFields, ApiReply> parse_edit_request(const nlohmann::json& params, std::string mask_part);

}  // namespace infill
