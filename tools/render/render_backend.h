#pragma once
/// Where infill-render's edits run: an engine embedded in the process (embedded_backend.h)
/// or a running infill-engine reached through the client SDK. The job runner only sees this
/// interface. Torch-free.
///
/// Threading: submit() and cancel() are called from the runner's thread; the callbacks of
/// RenderEvents may run on any thread, must not block, and on_complete runs exactly once per
/// accepted submit, after every on_progress of that edit.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace infill::render {

/// What the runner needs to know about the engine's model.
struct BackendInfo {
  std::string model_id;          ///< identifies the weights; part of every job hash
  std::string where;             ///< "embedded", "unix:/run/...", "http://host:port"
  int default_steps = 0;
  std::string default_sampler;
  double default_guidance = 1.0;
  /// Largest template the model takes, in pixels; 0 = not known.
  int64_t max_image_pixels = 0;
  /// The prompt words the model knows; nullopt when it takes no prompt.
  std::optional<std::vector<std::string>> vocabulary;
  /// The model reads free text (a text encoder): prompts are sent as written, unchecked.
  bool free_text = false;
};

/// A LoRA of an edit: its file (made ready with RenderBackend::load_adapter) and strength.
struct RenderAdapter {
  std::string path, sha256;
  double strength = 1.0;
};

/// A reference image of an edit (made ready with RenderBackend::load_reference).
struct RenderReference {
  std::string path, sha256;
};

/// One edit, fully resolved (no model defaults left).
struct RenderEdit {
  uint64_t id = 0;  ///< unique within a run, non-zero
  std::string template_path, template_sha256;
  std::string mask_path;
  std::string prompt;
  uint64_t seed = 0;
  int steps = 0;
  double strength = 1.0;
  double guidance = 1.0;
  std::string sampler;
  int halo = 1;
  double feather = 4.0;
  bool use_cache = true;  ///< false: recompute every token at every step (the baseline)
  /// The result's file format: "png", "tiff" or "exr" (from the output's extension).
  std::string output_format = "png";
  std::vector<RenderAdapter> adapters;      ///< in order; empty = none
  std::vector<RenderReference> references;  ///< in order; empty = none
};

/// How an edit failed, which decides the exit code.
enum class RenderFailure {
  kBadInput = 1,  ///< the engine rejected the edit's input (exit 2)
  kEngine = 2,    ///< unreachable, refused, or the model could not be loaded (exit 3)
  kDeadline = 3,  ///< expired at a deadline (exit 4)
  kInternal = 4,  ///< anything else (exit 5)
  kCancelled = 5, ///< cancel() took effect
};

struct RenderOutcome {
  uint64_t id = 0;
  Status status;                  ///< ok, or what failed (names the input)
  RenderFailure failure = RenderFailure::kInternal;  ///< when !status.ok()
  std::vector<std::byte> file;    ///< the result file in the edit's output_format, when ok
  int steps_run = 0;
  bool used_cache = false;
};

struct RenderEvents {
  std::function<void(uint64_t id, int steps_done, int steps_total)> on_progress;
  std::function<void(RenderOutcome)> on_complete;
};

class RenderBackend {
 public:
  virtual ~RenderBackend() = default;
  virtual const BackendInfo& info() const = 0;
  /// Makes the LoRA file at `path` ready for the engine's model, once per path, before any
  /// edit naming it is submitted: the embedded engine reads it for its model, a remote one
  /// receives it (POST /v1/adapters) and checks it the same way. Errors name the file and what
  /// the model could not take (another model's LoRA, a damaged file, a model without
  /// adapters); `failure` says why (kBadInput: the file; kEngine: the engine went away).
  /// The default refuses: a backend without adapters.
  virtual Status load_adapter(const std::string& path, RenderFailure& failure) {
    failure = RenderFailure::kBadInput;
    return Status(ErrorCode::kUnimplemented, "engine " + info().where + " takes no LoRA adapters; " + path + " was not read");
  }
  /// The same for a reference image (POST /v1/templates on a remote engine).
  virtual Status load_reference(const std::string& path, RenderFailure& failure) {
    failure = RenderFailure::kBadInput;
    return Status(ErrorCode::kUnimplemented, "engine " + info().where + " takes no reference images; " + path + " was not read");
  }
  /// Starts an edit. An error means it was not started and on_complete will not be called;
  /// `failure` then says why.
  virtual Status submit(const RenderEdit& edit, RenderEvents events, RenderFailure& failure) = 0;
  /// Asks a started edit to stop; it then completes (usually as kCancelled) soon.
  virtual void cancel(uint64_t id) = 0;
};

}  // namespace infill::render
