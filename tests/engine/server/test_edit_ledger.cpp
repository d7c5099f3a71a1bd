// The edit ledger on its own (no engine, no model): ids and their reservation, the per-client
// and engine-wide limits, superseding across models, progress and ends, status replies, and
// results dropped by TTL and by the cap (journaled ones reported to be forgotten).
#include "support/catch.h"

#include <thread>

#include "server/edit_ledger.h"
#include "server/service_metrics.h"

using namespace infill;
using nlohmann::json;

namespace {

EditAdmission admission(const std::string& client, size_t slot = 0) {
  EditAdmission a;
  a.client = client;
  a.template_id = "t1";
  a.model_id = slot == 0 ? "m0" : "m1";
  a.slot = slot;
  return a;
}

uint64_t admitted_id(std::variant<AdmittedEdit, ApiReply> r) {
  const AdmittedEdit* a = std::get_if<AdmittedEdit>(&r);
  INFO((std::holds_alternative<ApiReply>(r) ? std::get<ApiReply>(r).body : std::string()));
  REQUIRE(a != nullptr);
  return a->id;
}

ApiReply refusal(std::variant<AdmittedEdit, ApiReply> r) {
  REQUIRE(std::holds_alternative<ApiReply>(r));
  return std::get<ApiReply>(r);
}

EditOutcome ended(uint64_t id, RequestState state, std::string png = {}) {
  EditOutcome o;
  o.id = id;
  o.state = state;
  o.result_file = std::move(png);
  o.result_media_type = "image/png";
  o.metrics = {{"steps_run", 3}};
  if (state != RequestState::kDone) o.status = Status(ErrorCode::kCancelled, "edit cancelled");
  return o;
}

}  // namespace

TEST_CASE("edit ledger: ids in order, limits per client and engine, withdraw gives the slot back", "[server][ledger]") {
  ServerLimits limits;
  limits.max_queued_per_client = 2;
  limits.max_live_edits = 3;
  EditLedger ledger(limits, false, {});
  CHECK(admitted_id(ledger.admit(admission("a"))) == 1);
  CHECK(admitted_id(ledger.admit(admission("a"))) == 2);
  ApiReply busy = refusal(ledger.admit(admission("a")));
  CHECK(busy.status == 429);
  CHECK(busy.body.find("client a has 2 edits in flight, the limit is 2") != std::string::npos);
  CHECK(admitted_id(ledger.admit(admission("b"))) == 3);
  ApiReply full = refusal(ledger.admit(admission("c")));
  CHECK(full.status == 429);
  CHECK(full.body.find("engine_busy") != std::string::npos);
  CHECK(ledger.live_count() == 3);
  ledger.withdraw(3);
  CHECK(ledger.live_count() == 2);
  CHECK(ledger.status(3, false).status == 404);
  CHECK(admitted_id(ledger.admit(admission("c"))) == 4);  // ids are never handed out twice
  // A resumed edit keeps its id and passes the limits.
  EditAdmission resumed = admission("a");
  resumed.replay_id = 77;
  CHECK(admitted_id(ledger.admit(resumed)) == 77);
  ServiceMetrics m;
  ledger.collect(m);
  CHECK(m.live_edits == 4);
  CHECK(m.edits_rejected == 2);
}

TEST_CASE("edit ledger: with reserved ids, none is handed out past the reservation", "[server][ledger]") {
  EditLedger ledger(ServerLimits{}, true, {});
  ledger.ids_start_after(41);
  const uint64_t want = ledger.id_reservation_needed();
  CHECK(want == 42 + 1000);
  ApiReply unreserved = refusal(ledger.admit(admission("a")));
  CHECK(unreserved.status == 503);
  ledger.ids_reserved(want);
  CHECK(ledger.id_reservation_needed() == 0);
  CHECK(admitted_id(ledger.admit(admission("a"))) == 42);
}

TEST_CASE("edit ledger: progress, end, status and result, an edit ends once", "[server][ledger]") {
  EditLedger ledger(ServerLimits{}, false, {});
  const uint64_t id = admitted_id(ledger.admit(admission("a")));
  auto first = ledger.progress(id, 1, 3);
  REQUIRE(first);
  CHECK(first->first_step);
  CHECK(first->client == "a");
  auto second = ledger.progress(id, 2, 3);
  REQUIRE(second);
  CHECK_FALSE(second->first_step);
  json running = json::parse(ledger.status(id, false).body);
  CHECK(running["state"] == "running");
  CHECK(running["steps_done"] == 2);
  CHECK(ledger.status(id, true).status == 409);
  CHECK(std::holds_alternative<size_t>(ledger.cancel_target(id)));
  REQUIRE(ledger.complete(ended(id, RequestState::kDone, "PNG")));
  CHECK_FALSE(ledger.progress(id, 3, 3));  // after the end: ignored
  (void)ledger.complete(ended(id, RequestState::kCancelled));  // a second end does not count
  json done = json::parse(ledger.status(id, false).body);
  CHECK(done["state"] == "done");
  CHECK(done["steps_done"] == 3);
  CHECK(done["result"] == "/v1/edits/1/result");
  ApiReply png = ledger.status(id, true);
  CHECK(png.content_type == "image/png");
  CHECK(png.body == "PNG");
  ApiReply finished = std::get<ApiReply>(ledger.cancel_target(id));
  CHECK(finished.status == 409);
  CHECK(ledger.live_count() == 0);
  ServiceMetrics m;
  ledger.collect(m);
  CHECK(m.edits_finished.at("done") == 1);
  CHECK(m.edits_finished.count("cancelled") == 0);
}

TEST_CASE("edit ledger: an edit supersedes its client's edit of any model, never another client's",
          "[server][ledger]") {
  EditLedger ledger(ServerLimits{}, false, {});
  const uint64_t old = admitted_id(ledger.admit(admission("a", 0)));
  EditAdmission same_model = admission("a", 0);
  same_model.supersedes = old;
  auto a = std::get<AdmittedEdit>(ledger.admit(same_model));
  CHECK(a.supersedes == old);  // the runtime replaces it
  EditAdmission other_model = admission("a", 1);
  other_model.supersedes = old;
  auto b = std::get<AdmittedEdit>(ledger.admit(other_model));
  CHECK(b.supersedes == old);  // the one runtime serves both models
  EditAdmission thief = admission("z", 1);
  thief.supersedes = old;
  ApiReply refused = refusal(ledger.admit(thief));
  CHECK(refused.status == 400);
  CHECK(refused.body.find("supersedes names edit 1 of client a, expected one of client z") != std::string::npos);
}

TEST_CASE("edit ledger: results past the cap or the TTL are dropped, journaled ones forgotten", "[server][ledger]") {
  ServerLimits limits;
  limits.max_results = 2;
  std::vector<uint64_t> forgotten;
  EditLedger ledger(limits, false, [&](uint64_t id) { forgotten.push_back(id); });
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    EditAdmission a = admission("a");
    a.journaled = i != 1;
    ids.push_back(admitted_id(ledger.admit(a)));
    REQUIRE(ledger.complete(ended(ids.back(), RequestState::kDone, "PNG")));
  }
  // The next look drops the oldest result beyond the cap (journaled: forgotten).
  CHECK(ledger.status(ids[0], false).status == 404);
  CHECK(forgotten == std::vector<uint64_t>{ids[0]});
  CHECK(ledger.status(ids[1], false).status == 200);
  // A result restored from the journal that is already older than the TTL goes at once.
  EditRecord old;
  old.id = 500;
  old.client = "a";
  old.state = RequestState::kDone;
  old.journaled = true;
  ledger.restore(old, limits.result_ttl_ms + 1000);
  CHECK(ledger.status(500, false).status == 404);
  CHECK(forgotten.back() == 500);
  // A younger one is kept, as a result: not live, not cancellable.
  old.id = 501;
  ledger.restore(old, 1000);
  CHECK(ledger.status(501, false).status == 200);
  CHECK(std::get<ApiReply>(ledger.cancel_target(501)).status == 409);
  CHECK(ledger.live_count() == 0);
  CHECK(ledger.live().empty());
}
