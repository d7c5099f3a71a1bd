// The device team's planner (serving/team_planner.h): the round planner deciding which ranks
// a rank's whole-sequence step runs on, from the ranks' states, deadlines and predicted
// step times, round after round.
#include "support/catch.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "serving/team_planner.h"

using namespace infill;

namespace {

using S = TeamRankState;

// klein-like: 24 heads, 25 attention layers, a step of 100 ms on one device of which 5 do not
// shrink with the degree, over a link cheap enough that more devices are always faster.
TeamAsk ask_of(uint64_t id, double deadline_ms, int steps_left) {
  TeamAsk a;
  a.id = id;
  a.tokens = 4096;
  a.steps_left = steps_left;
  a.deadline_ms = deadline_ms;
  a.heads = 24;
  a.single_ms = 100;
  a.fixed_ms = 5;
  a.hidden = 3072;
  a.attention_layers = 25;
  a.prediction_channels = 128;
  return a;
}

TeamPlannerOptions four_ranks() {
  TeamPlannerOptions o;
  o.ranks = 4;
  o.round_ms = 50;
  o.link = TeamLink{0.001, 1e9, 2};
  return o;
}

}  // namespace

TEST_CASE("a step takes the free ranks, skipping one that serves edits of its own", "[serving][team_planner]") {
  TeamPlanner planner(four_ranks());
  const constexpr double kNever = std::numeric_limits<double>::infinity();
  std::vector<S> states{S::kBusy, S::kFree, S::kFree, S::kFree};
  TeamDecision d = planner.decide(0, ask_of(1, kNever, 10), 0.0, states);
  CHECK(d.ranks == std::vector<int>{0, 1, 2, 3});
  CHECK(d.degree == 4);
  CHECK_FALSE(d.split);
  CHECK(d.new_round);
  CHECK(d.predicted_ms < planner.predict_ms(ask_of(1, kNever, 10), 1, false));

  // Rank 2 serves masked edits: not given. Three ranks at degree 3 (24 heads split in 3), not
  // in an aligned run: {0, 1, 3}.
  TeamPlanner other(four_ranks());
  states = {S::kBusy, S::kFree, S::kBusy, S::kFree};
  d = other.decide(0, ask_of(1, kNever, 10), 0.0, states);
  CHECK(d.ranks == std::vector<int>{0, 1, 3});
  CHECK(d.degree == 3);

  // Heads that 3 does not divide: degree 2, the nearest free rank.
  TeamAsk sixteen = ask_of(2, kNever, 10);
  sixteen.heads = 16;
  TeamPlanner third(four_ranks());
  d = third.decide(0, sixteen, 0.0, states);
  CHECK(d.degree == 2);
  CHECK(d.ranks == std::vector<int>{0, 1});
}

TEST_CASE("an urgent request gets the ranks a slack one held once its step ends and waits for it where that is sooner",
          "[serving][team_planner]") {
  const constexpr double kNever = std::numeric_limits<double>::infinity();
  for (const bool await_ranks : {false, true}) {
    INFO("await_ranks " << await_ranks);
    TeamPlannerOptions o = four_ranks();
    o.await_ranks = await_ranks;
    TeamPlanner planner(o);
    // Rank 0 prepares a template nobody waits for (no deadline); rank 1 holds an edit that
    // needs two devices or more for its deadline: 10 steps of 100 ms alone, 52.5 at degree 2.
    const TeamAsk slack = ask_of(1, kNever, 10);
    const TeamAsk urgent = ask_of(2, 600.0, 10);

    // t = 0: the slack request asks first; rank 1 is busy (its edit is not yet a contender).
    TeamDecision s = planner.decide(0, slack, 0.0, std::vector<S>{S::kBusy, S::kBusy, S::kFree, S::kFree});
    CHECK(s.ranks == std::vector<int>{0, 2, 3});
    CHECK(s.degree == 3);
    const double slack_ends = s.predicted_ms;  // about 37 ms

    // t = 1: the urgent one asks while the slack step runs on 0, 2 and 3. The new plan shrinks
    // the slack request to its own rank and gives the urgent one 1, 2 and 3, but 2 and 3 are
    // in the slack step still.
    TeamDecision u = planner.decide(1, urgent, 1.0, std::vector<S>{S::kEngaged, S::kBusy, S::kEngaged, S::kEngaged});
    CHECK(u.new_round);
    CHECK(u.ranks == std::vector<int>{1});
    if (!await_ranks) {
      // Never waiting: it runs alone this step (100 ms, ending at 101).
      CHECK(u.hold_ms == 0);
      CHECK(planner.metrics().short_of_plan == 1);
      CHECK(planner.metrics().awaited == 0);
    } else {
      // Waiting until the slack step's predicted end (36 ms) and then running on 1, 2 and 3
      // (37 ms) ends its step at 74, not 101: held, its own rank kept, until then.
      REQUIRE(slack_ends + planner.predict_ms(urgent, 3, false) < 1.0 + planner.predict_ms(urgent, 1, false));
      CHECK(u.awaits);
      CHECK(u.hold_ms == Approx(slack_ends - 1.0));
      CHECK(u.awaited == std::vector<int>{1, 2, 3});
      CHECK(planner.metrics().awaited == 1);
      CHECK(planner.metrics().short_of_plan == 0);
      CHECK(planner.metrics().held == 0);
    }

    // t = 37: the slack step ended; within the round the plan holds: it runs alone now.
    s = planner.decide(0, slack, 37.0, std::vector<S>{S::kBusy, S::kBusy, S::kFree, S::kFree});
    CHECK_FALSE(s.new_round);
    CHECK(s.ranks == std::vector<int>{0});

    TeamAsk later = urgent;
    if (await_ranks) {
      // t = 38: the urgent one asks again (the team woke it): its planned ranks are free, the
      // round holds, it runs on all three.
      u = planner.decide(1, urgent, 38.0, std::vector<S>{S::kBusy, S::kBusy, S::kFree, S::kFree});
      CHECK_FALSE(u.new_round);
      CHECK(u.ranks == std::vector<int>{1, 2, 3});
      CHECK(u.degree == 3);
      CHECK(u.hold_ms == 0);
    }
    // t = 101: the urgent one's next step, a new round: 2 and 3 free.
    later.steps_left = await_ranks ? 8 : 9;
    u = planner.decide(1, later, 101.0, std::vector<S>{S::kBusy, S::kBusy, S::kFree, S::kFree});
    CHECK(u.new_round);
    CHECK(u.ranks == std::vector<int>{1, 2, 3});
    CHECK(u.degree == 3);
    CHECK(planner.metrics().rounds == 3);
    CHECK(planner.metrics().by_degree.at(3) == (await_ranks ? 3 : 2));
  }
}

TEST_CASE("a wait for planned ranks needs to know when they come free", "[serving][team_planner]") {
  const constexpr double kNever = std::numeric_limits<double>::infinity();
  TeamPlanner planner(four_ranks());
  // As above: the slack request steps on 0, 2 and 3; the urgent one, planned on 1, 2 and 3,
  // waits for that step's predicted end.
  TeamDecision s = planner.decide(0, ask_of(1, kNever, 10), 0.0, std::vector<S>{S::kBusy, S::kBusy, S::kFree, S::kFree});
  REQUIRE(s.ranks == std::vector<int>{0, 2, 3});
  TeamDecision u = planner.decide(1, ask_of(2, 600.0, 10), 1.0, std::vector<S>{S::kEngaged, S::kBusy, S::kEngaged, S::kEngaged});
  REQUIRE(u.awaits);
  // t = 45: past that end the slack step is still running (slower than predicted): when its
  // ranks free is not known, so the urgent one runs on what is free now and waits no more.
  u = planner.decide(1, ask_of(2, 600.0, 10), 45.0, std::vector<S>{S::kEngaged, S::kBusy, S::kEngaged, S::kEngaged});
  CHECK(s.predicted_ms < 45.0);
  CHECK_FALSE(u.awaits);
  CHECK(u.hold_ms == 0);
  CHECK(u.ranks == std::vector<int>{1});
  CHECK(planner.metrics().short_of_plan == 1);
  CHECK(planner.metrics().awaited == 1);
  // A wait never names a rank that serves masked edits (nobody knows when it frees): such a
  // rank is left out of the plan.
  TeamPlanner other(four_ranks());
  s = other.decide(0, ask_of(1, kNever, 10), 0.0, std::vector<S>{S::kBusy, S::kBusy, S::kFree, S::kBusy});
  REQUIRE(s.ranks == std::vector<int>{0, 2});
  u = other.decide(1, ask_of(2, 600.0, 10), 1.0, std::vector<S>{S::kEngaged, S::kBusy, S::kEngaged, S::kBusy});
  for (int r : u.awaited) CHECK(r != 3);
  for (int r : u.ranks) CHECK(r != 3);
}

TEST_CASE("measured parallel steps correct the predictions", "[serving][team_planner]") {
  const constexpr double kNever = std::numeric_limits<double>::infinity();
  const std::vector<S> states{S::kBusy, S::kFree, S::kBusy, S::kBusy};
  for (const bool learn : {true, false}) {
    TeamPlannerOptions o = four_ranks();
    o.learn = learn;
    o.round_ms = 1;  // every ask plans anew
    TeamPlanner planner(o);
    const TeamAsk a = ask_of(1, kNever, 10);
    TeamDecision d = planner.decide(0, a, 0.0, states);
    REQUIRE(d.degree == 2);
    // The steps at degree 2 take four times the prediction (two "devices" sharing cores).
    for (int step = 0; step < 3; ++step) planner.stepped(d, 4 * d.predicted_ms);
    d = planner.decide(0, a, 10.0, states);
    INFO("learn " << learn);
    if (learn) {
      CHECK(planner.metrics().correction.at("d2") == Approx(4.0).epsilon(0.01));
      CHECK(d.ranks == std::vector<int>{0});  // slower than alone now
    } else {
      CHECK(planner.metrics().correction.empty());
      CHECK(d.ranks == std::vector<int>{0, 1});
    }
  }
}

TEST_CASE("a guided step's halves split over two free ranks, and a step that cannot share runs alone",
          "[serving][team_planner]") {
  TeamPlanner planner(four_ranks());
  TeamAsk guided = ask_of(5, std::numeric_limits<double>::infinity(), 4);
  guided.heads = 0;  // a masked step: no sequence parallel, but its halves may split
  guided.guided = true;
  guided.may_split = true;
  guided.single_ms = 195;  // both halves packed: 2 x 100 - 5
  TeamDecision d = planner.decide(2, guided, 0.0, std::vector<S>{S::kBusy, S::kBusy, S::kBusy, S::kFree});
  CHECK(d.split);
  CHECK(d.degree == 1);
  CHECK(d.ranks == std::vector<int>{2, 3});
  CHECK(d.predicted_ms == Approx(planner.predict_ms(guided, 1, true)));
  CHECK(d.predicted_ms < 0.6 * guided.single_ms);
  CHECK(planner.metrics().split == 1);

  TeamAsk lone = guided;
  lone.id = 6;
  lone.may_split = false;
  d = planner.decide(0, lone, 0.0, std::vector<S>{S::kBusy, S::kFree, S::kFree, S::kFree});
  CHECK(d.ranks == std::vector<int>{0});
  CHECK_FALSE(d.split);
  CHECK(d.predicted_ms == Approx(lone.single_ms));
}

TEST_CASE("a guided step on four free ranks splits its halves each over two where that is fastest",
          "[serving][team_planner]") {
  // Two heads (the degree is at most 2): packed, the step runs at degree 2 at best; split,
  // each half runs at degree 2 on two ranks of its own, at once.
  TeamPlanner planner(four_ranks());
  TeamAsk guided = ask_of(7, std::numeric_limits<double>::infinity(), 4);
  guided.heads = 2;
  guided.guided = true;
  guided.may_split = true;
  guided.single_ms = 195;
  const double packed = planner.predict_ms(guided, 2, false), halves = planner.predict_ms(guided, 2, true);
  REQUIRE(halves < packed);
  REQUIRE(halves < planner.predict_ms(guided, 1, true));
  TeamDecision d = planner.decide(1, guided, 0.0, std::vector<S>{S::kFree, S::kBusy, S::kFree, S::kFree});
  CHECK(d.split);
  CHECK(d.degree == 2);
  CHECK(d.ranks == std::vector<int>{0, 1, 2, 3});
  CHECK(d.predicted_ms == Approx(halves));
  CHECK(planner.metrics().by_degree.at(2) == 1);

  // The next step finds rank 3 busy (its worker took an edit of its own): a new plan over the
  // three free ranks, two of them (the asker's among them), split one per rank or packed at
  // degree 2, whichever is predicted faster.
  d = planner.decide(1, guided, 1.0, std::vector<S>{S::kFree, S::kBusy, S::kFree, S::kBusy});
  CHECK(d.new_round);
  CHECK(d.ranks.size() == 2);
  CHECK(std::find(d.ranks.begin(), d.ranks.end(), 1) != d.ranks.end());
  CHECK(std::find(d.ranks.begin(), d.ranks.end(), 3) == d.ranks.end());
  CHECK(d.predicted_ms == Approx(std::min(planner.predict_ms(guided, 1, true), packed)));
}

TEST_CASE("a slack request yields its rank a round to an urgent one and is held back", "[serving][team_planner]") {
  const constexpr double kNever = std::numeric_limits<double>::infinity();
  for (const bool yield : {true, false}) {
    INFO("yield " << yield);
    TeamPlannerOptions o = four_ranks();
    o.ranks = 2;
    o.yield = yield;
    TeamPlanner planner(o);
    // Rank 0 steps a request nobody waits for; rank 1 gets an edit that needs both ranks for
    // its deadline (10 steps of 100 ms alone, about 53 at degree 2).
    const TeamAsk slack = ask_of(1, kNever, 10);
    TeamAsk urgent = ask_of(2, 600.0, 10);
    TeamDecision s = planner.decide(0, slack, 0.0, std::vector<S>{S::kBusy, S::kBusy});
    CHECK(s.ranks == std::vector<int>{0});
    CHECK(s.hold_ms == 0);

    // t = 1: the urgent one's plan has the slack one wait (it finishes alone from the next
    // round all the same) and takes both ranks; rank 0 is still in its step: alone for now.
    TeamDecision u = planner.decide(1, urgent, 1.0, std::vector<S>{S::kBusy, S::kBusy});
    CHECK(u.new_round);
    CHECK(u.ranks == std::vector<int>{1});
    CHECK(u.hold_ms == 0);
    // Waiting for rank 0's step (its predicted end at 100) and then running on both would end
    // this step later than running alone now: no wait.
    CHECK(planner.metrics().awaited == 0);

    // t = 37: the slack one asks again within the round.
    TeamAsk slack_later = slack;
    slack_later.steps_left = 9;
    s = planner.decide(0, slack_later, 37.0, std::vector<S>{S::kBusy, S::kBusy});
    CHECK_FALSE(s.new_round);
    if (!yield) {
      // Never yielding, it keeps its rank and the urgent one never gets it.
      CHECK(s.hold_ms == 0);
      CHECK(s.ranks == std::vector<int>{0});
      CHECK(planner.metrics().held == 0);
      continue;
    }
    CHECK(s.hold_ms == Approx(1.0 + o.round_ms - 37.0));  // to the round's end
    CHECK(planner.metrics().held == 1);

    // t = 38: rank 0 holds its step back (kYielding): the urgent one's next step takes it.
    urgent.steps_left = 9;
    u = planner.decide(1, urgent, 38.0, std::vector<S>{S::kYielding, S::kBusy});
    CHECK_FALSE(u.new_round);
    CHECK(u.ranks == std::vector<int>{0, 1});
    CHECK(u.degree == 2);
    CHECK(u.hold_ms == 0);

    // After the round the slack one asks again: still a contender, planned anew; while the
    // urgent one needs both ranks it keeps waiting.
    s = planner.decide(0, slack_later, 52.0, std::vector<S>{S::kBusy, S::kEngaged});
    CHECK(s.new_round);
    CHECK(s.hold_ms > 0);
    CHECK(planner.metrics().held == 2);
    // Once the urgent one is gone (its rank free), the slack one takes both.
    s = planner.decide(0, slack_later, 700.0, std::vector<S>{S::kBusy, S::kFree});
    CHECK(s.hold_ms == 0);
    CHECK(s.ranks == std::vector<int>{0, 1});
  }
}
