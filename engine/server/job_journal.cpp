#include "server/job_journal.h"

#include <sqlite3.h>

#include <filesystem>

#include "server/server_config.h"

namespace infill {
namespace {

// A prepared statement that finalises itself.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  bool ok() const { return rc_ == SQLITE_OK; }
  sqlite3_stmt* get() const { return stmt_; }
  void bind(int i, const std::string& text) { sqlite3_bind_text(stmt_, i, text.data(), int(text.size()), SQLITE_TRANSIENT); }
  void bind_blob(int i, const std::string& bytes) {
    sqlite3_bind_blob(stmt_, i, bytes.data(), int(bytes.size()), SQLITE_TRANSIENT);
  }
  void bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  int step() { return sqlite3_step(stmt_); }
  std::string text(int col) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_blob(stmt_, col));
    return p ? std::string(p, size_t(sqlite3_column_bytes(stmt_, col))) : std::string();
  }
  int64_t integer(int col) const { return sqlite3_column_int64(stmt_, col); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

Status db_error(sqlite3* db, const std::string& what) {
  return io_error("job journal: " + what + ": " + (db ? sqlite3_errmsg(db) : "out of memory"));
}

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS templates (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  bytes BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS edits (
  id INTEGER PRIMARY KEY,
  client TEXT NOT NULL,
  template_id TEXT NOT NULL,
  params TEXT NOT NULL,
  mask BLOB NOT NULL,
  final_state TEXT NOT NULL DEFAULT '',
  result BLOB,
  error_code TEXT NOT NULL DEFAULT '',
  error_message TEXT NOT NULL DEFAULT '',
  finished_unix_ms INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
)sql";

}  // namespace

Result<std::unique_ptr<JobJournal>> JobJournal::open(const std::string& path) {
  if (path.empty()) return invalid_argument("job journal: empty path");
  const std::filesystem::path p(path);
  if (p.has_parent_path()) INFILL_RETURN_IF_ERROR(make_private_dir(p.parent_path().string()));
  std::unique_ptr<JobJournal> j(new JobJournal());
  j->path_ = path;
  if (sqlite3_open_v2(path.c_str(), &j->db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK)
    return db_error(j->db_, "cannot open " + path);
  // Another engine on the same journal waits a little instead of failing at once.
  sqlite3_busy_timeout(j->db_, 5000);
  INFILL_RETURN_IF_ERROR(j->exec("PRAGMA journal_mode=WAL"));
  INFILL_RETURN_IF_ERROR(j->exec("PRAGMA synchronous=NORMAL"));
  INFILL_RETURN_IF_ERROR(j->exec(kSchema));
  // Make sure what is there is our journal, not some other database at this path.
  Statement check(j->db_, "SELECT id, client, template_id, params, mask, final_state, result, error_code, error_message, "
                          "finished_unix_ms FROM edits LIMIT 0");
  if (!check.ok()) return db_error(j->db_, path + " is not an infill job journal");
  return j;
}

JobJournal::~JobJournal() {
  if (db_) sqlite3_close_v2(db_);
}

Status JobJournal::exec(const char* sql) const {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string m = err ? err : "unknown error";
    sqlite3_free(err);
    return io_error("job journal " + path_ + ": " + m);
  }
  return {};
}

Status JobJournal::add_template(const JournaledTemplate& t) {
  std::lock_guard lock(mu_);
  Statement s(db_, "INSERT OR IGNORE INTO templates (id, name, bytes) VALUES (?1, ?2, ?3)");
  if (!s.ok()) return db_error(db_, "prepare add_template");
  s.bind(1, t.id);
  s.bind(2, t.name);
  s.bind_blob(3, t.bytes);
  if (s.step() != SQLITE_DONE) return db_error(db_, "add template " + t.id);
  return {};
}

Status JobJournal::add_edit(const JournaledEdit& e) {
  std::lock_guard lock(mu_);
  Statement s(db_, "INSERT INTO edits (id, client, template_id, params, mask) VALUES (?1, ?2, ?3, ?4, ?5)");
  if (!s.ok()) return db_error(db_, "prepare add_edit");
  s.bind(1, static_cast<int64_t>(e.id));
  s.bind(2, e.client);
  s.bind(3, e.template_id);
  s.bind(4, e.params_json);
  s.bind_blob(5, e.mask_bytes);
  if (s.step() != SQLITE_DONE) return db_error(db_, "add edit " + std::to_string(e.id));
  return {};
}

Status JobJournal::reserve_ids(uint64_t id) {
  std::lock_guard lock(mu_);
  // The high-water mark outlives forgotten edits, so ids are never reused.
  Statement m(db_, "INSERT INTO meta (key, value) VALUES ('max_edit_id', ?1) "
                   "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)");
  if (!m.ok()) return db_error(db_, "prepare reserve_ids");
  m.bind(1, static_cast<int64_t>(id));
  if (m.step() != SQLITE_DONE) return db_error(db_, "reserve ids up to " + std::to_string(id));
  return {};
}

Status JobJournal::finish_edit(uint64_t id, const std::string& state, const std::string& result_png,
                               const std::string& error_code, const std::string& error_message, int64_t finished_unix_ms) {
  std::lock_guard lock(mu_);
  Statement s(db_, "UPDATE edits SET final_state = ?2, result = ?3, error_code = ?4, error_message = ?5, "
                   "finished_unix_ms = ?6 WHERE id = ?1");
  if (!s.ok()) return db_error(db_, "prepare finish_edit");
  s.bind(1, static_cast<int64_t>(id));
  s.bind(2, state);
  s.bind_blob(3, result_png);
  s.bind(4, error_code);
  s.bind(5, error_message);
  s.bind(6, finished_unix_ms);
  if (s.step() != SQLITE_DONE) return db_error(db_, "finish edit " + std::to_string(id));
  return {};
}

Status JobJournal::forget_edit(uint64_t id) {
  std::lock_guard lock(mu_);
  Statement s(db_, "DELETE FROM edits WHERE id = ?1");
  if (!s.ok()) return db_error(db_, "prepare forget_edit");
  s.bind(1, static_cast<int64_t>(id));
  if (s.step() != SQLITE_DONE) return db_error(db_, "forget edit " + std::to_string(id));
  Statement t(db_, "DELETE FROM templates WHERE id NOT IN (SELECT template_id FROM edits)");
  if (!t.ok() || t.step() != SQLITE_DONE) return db_error(db_, "drop unused templates");
  return {};
}

Result<std::vector<JournaledEdit>> JobJournal::edits() const {
  std::lock_guard lock(mu_);
  Statement s(db_, "SELECT id, client, template_id, params, mask, final_state, result, error_code, error_message, "
                   "finished_unix_ms FROM edits ORDER BY id");
  if (!s.ok()) return db_error(db_, "prepare edits");
  std::vector<JournaledEdit> out;
  int rc;
  while ((rc = s.step()) == SQLITE_ROW) {
    JournaledEdit e;
    e.id = static_cast<uint64_t>(s.integer(0));
    e.client = s.text(1);
    e.template_id = s.text(2);
    e.params_json = s.text(3);
    e.mask_bytes = s.text(4);
    e.final_state = s.text(5);
    e.result_png = s.text(6);
    e.error_code = s.text(7);
    e.error_message = s.text(8);
    e.finished_unix_ms = s.integer(9);
    out.push_back(std::move(e));
  }
  if (rc != SQLITE_DONE) return db_error(db_, "read edits");
  return out;
}

Result<JournaledTemplate> JobJournal::template_bytes(const std::string& id) const {
  std::lock_guard lock(mu_);
  Statement s(db_, "SELECT id, name, bytes FROM templates WHERE id = ?1");
  if (!s.ok()) return db_error(db_, "prepare template_bytes");
  s.bind(1, id);
  if (s.step() != SQLITE_ROW) return not_found("job journal " + path_ + " has no template " + id);
  return JournaledTemplate{s.text(0), s.text(1), s.text(2)};
}

Result<uint64_t> JobJournal::max_edit_id() const {
  std::lock_guard lock(mu_);
  Statement s(db_, "SELECT max(coalesce((SELECT value FROM meta WHERE key = 'max_edit_id'), 0), "
                   "coalesce((SELECT max(id) FROM edits), 0))");
  if (!s.ok() || s.step() != SQLITE_ROW) return db_error(db_, "read max_edit_id");
  return static_cast<uint64_t>(s.integer(0));
}

}  // namespace infill
