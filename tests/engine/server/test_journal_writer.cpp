// The journal's writer thread: writes run in order, a commit callback follows its write,
// run() waits, and the destructor finishes what is queued; a write blocked on the disk holds
// no HTTP request (the io thread never waits for it).
#include <atomic>
#include <future>

#include "server/journal_writer.h"
#include "server_fixture.h"

using namespace infill;
using namespace infill::test;

TEST_CASE("journal writer: writes run in order, callbacks after their write, the destructor drains", "[server][journal]") {
  TempDir dir("infill-jw");
  auto journal = JobJournal::open(dir.file("journal.sqlite"));
  REQUIRE(journal.ok());
  std::vector<int> order;
  std::mutex mu;
  {
    JournalWriter writer(**journal);
    for (int i = 1; i <= 50; ++i) {
      writer.post(
          [i](JobJournal& j) { return j.reserve_ids(uint64_t(i) * 10); },
          [i, &order, &mu](Status st) {
            REQUIRE(st.ok());
            std::lock_guard lock(mu);
            order.push_back(i);
          });
    }
    // run() waits for its own write, which comes after the fifty.
    REQUIRE(writer.run([](JobJournal& j) { return j.reserve_ids(777); }).ok());
    {
      std::lock_guard lock(mu);
      CHECK(order.size() == 50);
    }
    for (int i = 0; i < 20; ++i) writer.post([](JobJournal& j) { return j.reserve_ids(900); });
  }  // the destructor ran the twenty
  std::vector<int> expected(50);
  for (int i = 0; i < 50; ++i) expected[i] = i + 1;
  CHECK(order == expected);
  auto max = (*journal)->max_edit_id();
  REQUIRE(max.ok());
  CHECK(*max == 900);
  // A failing write reports through its callback.
  JournalWriter writer(**journal);
  CHECK(writer.run([](JobJournal&) { return io_error("disk full"); }).message() == "disk full");
}

TEST_CASE("a journal write blocked on the disk holds no HTTP request, the batch edit's 202 waits for its commit",
          "[server][journal]") {
  ServerFixture f(true, test_limits(), false, {}, {},
                  [](ServiceOptions& o) { o.journal_path = o.model_path + "/../journal.sqlite"; });
  const std::string tmpl = f.upload();
  // A batch edit: its 202 comes once the journal committed it.
  Response first = request(f.unix_ep, "POST", "/v1/edits",
                           R"({"template":")" + tmpl + R"(","mask_rect":[8,8,16,16],"steps":2,"class":"batch"})",
                           {"Content-Type: application/json"});
  INFO(first.body);
  REQUIRE(first.status == 202);
  // Hold the journal's thread as a slow disk would.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> holding;
  f.service->journal_writer_for_test().post([&holding, released](JobJournal&) {
    holding.set_value();
    released.wait();
    return Status();
  });
  holding.get_future().wait();
  // Meanwhile status, metrics, models and health answer at once: none waits on the journal.
  const uint64_t id = first.json()["id"].get<uint64_t>();
  CHECK(request(f.unix_ep, "GET", "/v1/edits/" + std::to_string(id)).status == 200);
  // At least the held write; the first edit's own state writes may queue behind it too, as it
  // runs on (how far it got depends on the machine's speed).
  {
    const std::string metrics = request(f.unix_ep, "GET", "/metrics").body;
    const std::string name = "\ninfill_journal_pending_writes ";
    const size_t at = metrics.find(name);
    REQUIRE(at != std::string::npos);
    CHECK(std::stoi(metrics.substr(at + name.size())) >= 1);
  }
  CHECK(request(f.unix_ep, "GET", "/health").status == 200);
  // A second batch edit is not answered while its record cannot commit ...
  auto second = std::async(std::launch::async, [&] {
    return request(f.unix_ep, "POST", "/v1/edits",
                   R"({"template":")" + tmpl + R"(","mask_rect":[8,8,16,16],"steps":2,"class":"batch","seed":2})",
                   {"Content-Type: application/json"});
  });
  CHECK(second.wait_for(std::chrono::milliseconds(300)) == std::future_status::timeout);
  CHECK(request(f.unix_ep, "GET", "/health").status == 200);  // the io thread is free meanwhile
  // ... and is, once the disk is back.
  release.set_value();
  Response r = second.get();
  INFO(r.body);
  CHECK(r.status == 202);
}
