#pragma once
/// The durable record of accepted `batch` edits: an SQLite database in WAL mode that the
/// engine writes before it answers 202, and reads back at start so that an engine killed with
/// SIGKILL resumes every batch edit it had accepted. Finished edits keep their result (or
/// error) until the client fetched it or it expired.
///
/// Durability: WAL with synchronous=NORMAL survives the process being killed at any point
/// (the committed transactions are in the WAL file); a power loss may lose the last commits
/// but never corrupts the database.
///
/// Threading: every method is safe from any thread (one connection, serialised by a mutex).
/// Torch-free on purpose.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

struct sqlite3;

namespace infill {

/// One journaled edit as submitted (the mask as encoded bytes, the rest as the JSON params).
struct JournaledEdit {
  uint64_t id = 0;
  std::string client;
  std::string template_id;
  std::string params_json;
  std::string mask_bytes;
  /// "" while it has not finished; otherwise done, failed or cancelled.
  std::string final_state;
  std::string result_png;        ///< done only
  std::string error_code;        ///< failed / cancelled only
  std::string error_message;
  int64_t finished_unix_ms = 0;  ///< wall clock: survives restarts, unlike steady time
};

struct JournaledTemplate {
  std::string id;
  std::string name;
  std::string bytes;  ///< the uploaded file, exactly
};

class JobJournal {
 public:
  /// Opens (creating when absent, with its parent folder, 0700) the journal at `path`.
  static Result<std::unique_ptr<JobJournal>> open(const std::string& path);
  ~JobJournal();
  JobJournal(const JobJournal&) = delete;
  JobJournal& operator=(const JobJournal&) = delete;

  const std::string& path() const { return path_; }

  /// Stores a template's bytes once (a second call with the same id changes nothing).
  Status add_template(const JournaledTemplate& t);
  /// Records an accepted edit; returns once it is committed.
  Status add_edit(const JournaledEdit& e);
  /// Records how an edit ended (and its result PNG when done).
  Status finish_edit(uint64_t id, const std::string& state, const std::string& result_png, const std::string& error_code,
                     const std::string& error_message, int64_t finished_unix_ms);
  /// Forgets an edit (its result was fetched for good or expired); drops templates no edit uses.
  Status forget_edit(uint64_t id);

  /// Every journaled edit, oldest first.
  Result<std::vector<JournaledEdit>> edits() const;
  Result<JournaledTemplate> template_bytes(const std::string& id) const;
  /// Raises the id high-water mark to `id`, so that ids handed out before a crash (journaled
  /// or not) are never reused by the next engine.
  Status reserve_ids(uint64_t id);
  /// The id high-water mark (0 when none): new ids continue after it.
  Result<uint64_t> max_edit_id() const;

 private:
  JobJournal() = default;
  Status exec(const char* sql) const;

  std::string path_;
  mutable std::mutex mu_;
  sqlite3* db_ = nullptr;
};

}  // namespace infill
