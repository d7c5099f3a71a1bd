// The job journal on a real SQLite file, and an engine that resumes journaled batch edits
// after it was stopped with them in flight.
#include "support/catch.h"

#include <fstream>
#include <future>
#include <thread>

#include "server/job_journal.h"
#include "server_fixture.h"

using namespace infill;
using namespace infill::test;
using nlohmann::json;

namespace {

JournaledEdit edit(uint64_t id, const std::string& client, const std::string& params, const std::string& mask) {
  JournaledEdit e;
  e.id = id;
  e.client = client;
  e.template_id = "t1";
  e.params_json = params;
  e.mask_bytes = mask;
  return e;
}

}  // namespace

TEST_CASE("the job journal keeps edits, results and the id high-water mark across reopening", "[server][journal]") {
  TempDir dir("infill-journal");
  const std::string path = dir.file("state/journal.sqlite");
  {
    auto j = JobJournal::open(path);
    REQUIRE(j.ok());
    REQUIRE((*j)->add_template({"t1", "a.png", std::string("\x89PNG\0bytes", 10)}).ok());
    REQUIRE((*j)->add_template({"t1", "again.png", "other"}).ok());  // once per id
    REQUIRE((*j)->add_edit(edit(7, "alice", R"({"seed":1})", std::string("mask\0bytes", 10))).ok());
    REQUIRE((*j)->add_edit(edit(9, "bob", R"({"seed":2})", "")).ok());
    REQUIRE((*j)->reserve_ids(20).ok());
    REQUIRE((*j)->reserve_ids(12).ok());  // never lowers the mark
    CHECK_FALSE((*j)->add_edit(edit(9, "bob", "{}", "")).ok());  // ids are unique
    REQUIRE((*j)->finish_edit(7, "done", std::string("png\0result", 10), "", "", 1234).ok());
  }
  auto j = JobJournal::open(path);
  REQUIRE(j.ok());
  auto edits = (*j)->edits();
  REQUIRE(edits.ok());
  REQUIRE(edits->size() == 2);
  CHECK((*edits)[0].id == 7);
  CHECK((*edits)[0].final_state == "done");
  CHECK((*edits)[0].result_png == std::string("png\0result", 10));
  CHECK((*edits)[0].mask_bytes == std::string("mask\0bytes", 10));
  CHECK((*edits)[0].finished_unix_ms == 1234);
  CHECK((*edits)[1].final_state.empty());
  CHECK((*edits)[1].client == "bob");
  auto t = (*j)->template_bytes("t1");
  REQUIRE(t.ok());
  CHECK(t->name == "a.png");
  CHECK(t->bytes == std::string("\x89PNG\0bytes", 10));
  CHECK((*j)->template_bytes("t2").status().code() == ErrorCode::kNotFound);
  // Forgetting every edit drops the template; the id mark stays so ids are never reused.
  REQUIRE((*j)->forget_edit(7).ok());
  REQUIRE((*j)->forget_edit(9).ok());
  CHECK_FALSE((*j)->template_bytes("t1").ok());
  auto max_id = (*j)->max_edit_id();
  REQUIRE(max_id.ok());
  CHECK(*max_id == 20);
}

TEST_CASE("a file that is not a journal is refused with its path", "[server][journal]") {
  TempDir dir("infill-journal");
  {
    std::ofstream(dir.file("junk.sqlite")) << "this is not a database, just text that is long enough to be read";
  }
  auto j = JobJournal::open(dir.file("junk.sqlite"));
  REQUIRE_FALSE(j.ok());
  CHECK(j.status().message().find("junk.sqlite") != std::string::npos);
}

TEST_CASE("journaled batch edits stopped in flight are resumed by the next engine", "[server][journal]") {
  c10::InferenceMode guard;
  TempDir dir("infill-resume");
  REQUIRE(write_random_model(dir.file("model"), tiny_serving_dit(), 16, 42).ok());
  ServiceOptions o;
  o.model_path = dir.file("model");
  o.limits = test_limits();
  o.limits.max_queued_per_client = 64;
  o.ram_cache_bytes = 64 << 20;
  o.journal_path = dir.file("state/journal.sqlite");
  const std::string picture = png_string(serving_picture(0));
  const std::string mask_png = png_string(rect_mask_image(64, 48, 8, 8, 24, 16));

  // Submits through the service's own callback API and waits for the reply.
  auto call = [](auto&& start) {
    std::promise<ApiReply> p;
    auto f = p.get_future();
    start([&p](ApiReply r) { p.set_value(std::move(r)); });
    return f.get();
  };
  std::vector<uint64_t> batch, interactive;
  std::string template_id;
  {
    EngineService first(o);
    REQUIRE(first.load().ok());
    ApiReply t = call([&](auto done) { first.create_template(picture, "picture.png", done); });
    REQUIRE(t.status == 201);
    template_id = json::parse(t.body)["id"];
    for (int i = 0; i < 6; ++i) {
      EditSubmission s;
      s.client = "farm";
      s.params = {{"template", template_id}, {"seed", i}, {"steps", 300}, {"class", "batch"}};
      if (i % 2) s.params["mask_rect"] = {16, 8, 16, 16};
      else s.mask_bytes = mask_png;
      ApiReply r = call([&](auto done) { first.submit_edit(s, done); });
      REQUIRE(r.status == 202);
      batch.push_back(json::parse(r.body)["id"].get<uint64_t>());
    }
    EditSubmission live;
    live.client = "editor";
    live.params = {{"template", template_id}, {"mask_rect", {0, 0, 16, 16}}, {"steps", 300}};
    ApiReply r = call([&](auto done) { first.submit_edit(live, done); });
    REQUIRE(r.status == 202);
    interactive.push_back(json::parse(r.body)["id"].get<uint64_t>());
    // The engine stops with the edits queued or running (300 steps each take seconds).
    CHECK(first.live_edits() > 0);
  }
  EngineService second(o);
  REQUIRE(second.load().ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (uint64_t id : batch) {
    INFO("batch edit " << id);
    std::string state;
    while (std::chrono::steady_clock::now() < deadline) {
      ApiReply s = second.edit_status(std::to_string(id), false);
      REQUIRE(s.status == 200);
      state = json::parse(s.body)["state"];
      if (state == "done" || state == "failed" || state == "cancelled") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    CHECK(state == "done");
    ApiReply png = second.edit_status(std::to_string(id), true);
    REQUIRE(png.status == 200);
    auto img = decode_image(bytes_of(png.body), "result", 1 << 20);
    REQUIRE(img.ok());
    CHECK(img->width == 64);
    CHECK(img->height == 48);
  }
  // Interactive edits are not journaled: the new engine does not know them.
  CHECK(second.edit_status(std::to_string(interactive[0]), false).status == 404);
  // New ids continue after the journaled ones.
  EditSubmission next;
  next.params = {{"template", template_id}, {"mask_rect", {0, 0, 16, 16}}, {"steps", 2}};
  ApiReply r = call([&](auto done) { second.submit_edit(next, done); });
  REQUIRE(r.status == 202);
  CHECK(json::parse(r.body)["id"].get<uint64_t>() > interactive[0]);
  json m = json::parse(second.metrics().body);
  CHECK(m["service"]["edits_resumed"].get<int>() >= 1);
}
