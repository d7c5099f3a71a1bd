#pragma once
/// Job files of infill-render: parsing, validation and expansion into items.
///
/// A job (docs/job.schema.json, docs/farm.md) lists edits; each edit has one or more seeds and
/// every (edit, seed) pair is one *item*, numbered from 1 in file order, which is what
/// `--items A-B` selects. Relative paths are resolved against the job file's folder.
///
/// Every error names the file, the JSON pointer of the field at fault and what was expected:
/// "jobs/a.json: /edits/2/steps: is -3; expected an integer in 1..1000". Validation that needs
/// the model (prompt words, default steps) happens later, in resolve_items (job_items.h).
/// No torch here: image sizes come from the file headers through OpenImageIO.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace infill::render {

/// A value of an edit and the JSON pointer it came from (the edit or the job's defaults), so
/// later checks can point at the right field.
template <class T>
struct Field {
  T value{};
  std::string pointer;
};

/// A LoRA of an edit ("adapters": [{"file", "strength"}]).
struct JobAdapter {
  Field<std::string> file;  ///< absolute; pointer ".../adapters/<i>/file"
  std::string sha256;       ///< of the file bytes: the engine's adapter id
  Field<double> strength;   ///< default 1; pointer ".../adapters/<i>/strength"
};

/// A reference image of an edit ("references": [path]; FLUX.2 models).
struct JobReference {
  Field<std::string> file;  ///< absolute; pointer ".../references/<i>"
  std::string sha256;       ///< of the file bytes: the engine's template id
};

/// One edit of the job, defaults applied.
struct JobEdit {
  int index = 0;              ///< position in "edits"
  std::string pointer;        ///< "/edits/<index>"
  std::string name;           ///< "name", or the template's file stem
  Field<std::string> template_path;  ///< absolute
  Field<std::string> mask_path;      ///< absolute
  std::string template_sha256;       ///< of the file bytes: the engine's template id
  std::string mask_sha256;
  int width = 0, height = 0;         ///< of the template (and the mask)
  Field<std::string> prompt;         ///< "" = no prompt
  Field<std::vector<uint64_t>> seeds;
  Field<int> steps;                  ///< 0 = the model's default
  Field<double> strength;
  Field<double> guidance;            ///< 0 = the model's default
  Field<std::string> sampler;        ///< "" = the model's default
  Field<int> halo;
  Field<double> feather;
  Field<std::string> output;         ///< pattern, absolute, with {item} {seed} {name}
  Field<std::vector<JobAdapter>> adapters;      ///< applied in order; empty = none
  Field<std::vector<JobReference>> references;  ///< in order; empty = none
};

struct Job {
  std::string path;        ///< the job file as given
  std::string dir;         ///< its folder, absolute: base of relative paths
  std::string model;       ///< "model" (absolute path) or ""
  double deadline_s = 0;   ///< 0 = none
  std::vector<JobEdit> edits;
  /// Items in order: items[k] is item k + 1.
  struct Item {
    int number = 0;      ///< from 1
    int edit = 0;        ///< index into edits
    uint64_t seed = 0;
    std::string output;  ///< the expanded output path
  };
  std::vector<Item> items;
};

/// "FILE: POINTER: WHAT; expected EXPECTED" as an invalid_argument Status (the root pointer
/// is written as "/").
Status job_error(const std::string& file, const std::string& pointer, const std::string& what,
                 const std::string& expected);

/// Reads, validates and expands a job file: JSON syntax, the schema (types, ranges, unknown
/// keys), output patterns and collisions, that the template and mask files exist and decode
/// and that their sizes match, that LoRA files exist and are safetensors files and that
/// reference images exist, decode and have a size a reference may have (check_reference_size,
/// from the header; whether the model takes them is the backend's check: load_job_inputs in
/// job_items.h). Errors: job_error(...) (invalid_argument) for all of these.
Result<Job> load_job(const std::string& path);
/// As load_job, for a job given as text (tests); `path` names it in errors and its folder is
/// the base of relative paths.
Result<Job> parse_job(const std::string& text, const std::string& path);

/// Highest accepted values (the schema's maxima).
constexpr int kMaxSteps = 1000;
constexpr int kMaxItems = 1000000;

}  // namespace infill::render
