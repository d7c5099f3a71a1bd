#pragma once
/// The uploaded templates: each decoded and encoded by the default model at upload, by another
/// model lazily on the first edit that names it; LRU beyond the limit. It also counts the
/// edits waiting on each template (its "preparing" state) and remembers which templates the
/// job journal holds.
///
/// Torch-free header. Threading: every method is safe from any thread; encoding runs on the
/// caller's thread (the service pool) outside the registry's mutex.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "server/api_reply.h"
#include "server/job_journal.h"

namespace infill {

class ModelRegistry;
struct TemplateImage;

class TemplateRegistry {
 public:
  /// `models` must outlive the registry. `keep_bytes`: keep each uploaded file (a journal
  /// records it; another model encodes it); always on when several models are loaded.
  TemplateRegistry(const ModelRegistry& models, int max_templates, int64_t max_image_pixels, bool keep_bytes);

  /// Decodes and encodes an upload: 201 with the template's JSON, 200 for one already known
  /// (same id), or the error naming the upload.
  ApiReply upload(const std::string& bytes, const std::string& name);
  /// `GET /v1/templates/{id}`.
  ApiReply status(std::string_view id) const;
  /// The template as model `slot` sees it, or the reply that says why not (404 unknown).
  std::variant<std::shared_ptr<const TemplateImage>, ApiReply> for_model(const std::string& id, size_t slot);

  /// An edit on `id` was accepted. With `journal_first`, the template's file when the journal
  /// does not hold it yet (the caller journals it with the edit, then calls journaled()).
  std::optional<JournaledTemplate> edit_waiting(const std::string& id, bool journal_first);
  /// An edit on `id` ran its first step (`prepared`) or ended or was withdrawn before one.
  void edit_stopped_waiting(const std::string& id, bool prepared);
  /// The journal holds the file of `id` (a resumed or journaled edit's template).
  void journaled(const std::string& id);
  /// The file of `id` when the journal does not hold it yet (a journaled edit's reference
  /// image, which is read when the edit is submitted and so is never waited for).
  std::optional<JournaledTemplate> unjournaled_file(const std::string& id) const;
  bool contains(const std::string& id) const;

  size_t size() const;
  uint64_t created() const;

 private:
  struct Record {
    std::shared_ptr<const TemplateImage> tmpl;  // encoded by the default model
    // Encoded by another model, keyed by its id: made on the first edit that names the model,
    // dropped with the template.
    std::map<std::string, std::shared_ptr<const TemplateImage>> other_models;
    std::string name;
    double last_used_ms = 0;
    int waiting = 0;        // edits on it that have not run a step yet
    bool prepared = false;  // an edit on it ran a step (its prepare job finished)
    std::shared_ptr<const std::string> bytes;  // the uploaded file, with keep_bytes
    bool journaled = false;
  };
  double now_ms() const;
  nlohmann::json json_locked(const Record& t) const;

  const ModelRegistry& models_;
  const int max_templates_;
  const int64_t max_image_pixels_;
  const bool keep_bytes_;
  mutable std::mutex mu_;  // guards everything below; never held while decoding or encoding
  std::map<std::string, Record> templates_;
  uint64_t created_ = 0;
  std::chrono::steady_clock::time_point epoch_ = std::chrono::steady_clock::now();
};

}  // namespace infill
