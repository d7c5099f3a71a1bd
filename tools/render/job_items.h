#pragma once
/// Job items resolved against the engine's model: model defaults filled in, prompts checked
/// against the model's vocabulary, and the job hash of each item.
///
/// The job hash is the SHA-256 of a canonical JSON description of everything that decides an
/// output's pixels: the hash format ("infill-job-hash/1"), the model id (weights), the SHA-256
/// of the template file's bytes and of the mask file's bytes, the prompt (words normalised to
/// single spaces), seed, steps, strength, guidance, sampler, halo and feather, and when an edit
/// has them, its LoRAs (each file's SHA-256 and strength, in order) and reference images (each
/// file's SHA-256, in order): a job without them hashes as before they existed. It leaves out
/// the output path, the item number, the name, and whether the activation cache is used (the
/// cache is an execution strategy meant to give the same image, not an edit parameter).

#include <string>
#include <vector>

#include "common/status.h"
#include "job_file.h"
#include "render_backend.h"

namespace infill::render {

struct ResolvedItem {
  int number = 0;             ///< from 1
  const JobEdit* edit = nullptr;
  RenderEdit render;          ///< id = number
  std::string output;
  std::string canonical;      ///< the hashed JSON (stored next to the hash in the PNG)
  std::string hash;           ///< 64 hex digits
};

/// Resolves every item of `job` (not only a range: an error anywhere in the job fails every
/// chunk of it the same way). Errors: job_error naming the prompt field for a word outside
/// the vocabulary or a prompt given to a model without one, or the template field of a
/// template larger than the model takes.
Result<std::vector<ResolvedItem>> resolve_items(const Job& job, const BackendInfo& info);

/// Makes every LoRA and reference image the job names ready on `backend` (load_adapter,
/// load_reference; once per file), the whole job and not only a range, before any item runs.
/// Errors: job_error naming the first field whose file the engine refused, with what was
/// expected (kBadInput in `failure`); or the backend's own error when the engine went away.
Status load_job_inputs(const Job& job, RenderBackend& backend, RenderFailure& failure);

/// PNG tEXt keywords of the hash and its canonical JSON.
inline constexpr const char* kHashKeyword = "infill:job-hash";
inline constexpr const char* kCanonicalKeyword = "infill:job";

}  // namespace infill::render
