// Sample bisection: delta debugging finds the culprit rows within the replay budget, on a
// predicate and end to end on real crash bundles with every experiment in a child process.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "crashcap/investigate/bisect.hpp"
#include "crashcap/investigate/replays.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace crashcap;

namespace {
bool has(const std::vector<int64_t>& rows, int64_t r) { return std::find(rows.begin(), rows.end(), r) != rows.end(); }
}  // namespace

TEST_CASE("one culprit row is found in at most 2*ceil(log2 B)+3 replays wherever it is", "[investigate][bisect]") {
  for (int64_t batch : {1, 2, 3, 5, 8, 13, 32, 100}) {
    int bound = 2 * static_cast<int>(std::ceil(std::log2(std::max<int64_t>(batch, 2)))) + 3;
    CHECK(investigate::singleRowBound(batch) == bound);
    for (int64_t culprit = 0; culprit < batch; ++culprit) {
      auto b = investigate::searchRows(batch, [&](const std::vector<int64_t>& rows) {
        return investigate::Trial{has(rows, culprit), "", 0, ""};
      });
      INFO("batch " << batch << " culprit " << culprit);
      CHECK(b.reproduced);
      CHECK(b.rows == std::vector<int64_t>{culprit});
      CHECK(b.otherSets.empty());
      CHECK(!b.restFails);
      CHECK(b.replays <= bound);
    }
  }
}

TEST_CASE("rows that fail only together are all kept, and a batch that passes is not bisected", "[investigate][bisect]") {
  auto b = investigate::searchRows(32, [](const std::vector<int64_t>& rows) {
    const bool fails = has(rows, 3) && has(rows, 17);
    return investigate::Trial{fails, "", 0, "", !fails};
  });
  CHECK(b.rows == std::vector<int64_t>{3, 17});
  CHECK(b.triggers.empty());  // each is needed alike: the batch passes without either
  auto none = investigate::searchRows(16, [](const std::vector<int64_t>&) { return investigate::Trial{false, "", 0, ""}; });
  CHECK(!none.reproduced);
  CHECK(none.replays == 1);
}

TEST_CASE("a row that triggers the failure but cannot fail alone (a batch norm needs two rows) is told from the row "
          "that only lets the step run",
          "[investigate][bisect]") {
  // Row 5 holds the bad label; a set of one row fails another way (not the failure), so the
  // smallest failing set has two rows, and only row 5's absence makes the whole batch pass.
  auto b = investigate::searchRows(16, [](const std::vector<int64_t>& rows) {
    const bool fails = has(rows, 5) && rows.size() >= 2;
    return investigate::Trial{fails, "", 0, "", !fails && rows.size() >= 2};
  });
  REQUIRE(b.rows.size() == 2);
  CHECK(has(b.rows, 5));
  CHECK(b.triggers == std::vector<int64_t>{5});
  // A replay without a row that does not run to a clean end (a timeout, another error) is no
  // evidence that the row triggers anything: no triggers then.
  auto unclear = investigate::searchRows(16, [](const std::vector<int64_t>& rows) {
    return investigate::Trial{has(rows, 5) && rows.size() >= 2, "", 0, "", false};
  });
  CHECK(unclear.rows == b.rows);
  CHECK(unclear.triggers.empty());
  investigate::SampleBisection s;
  s.rows = b.rows;
  s.triggers = b.triggers;
  CHECK(s.culprits() == std::vector<int64_t>{5});
}

TEST_CASE("rows that each fail on their own are all found: the batch without the first set still fails",
          "[investigate][bisect]") {
  // One sample drawn twice (rows 9 and 15), or two corrupt samples: any set holding one fails.
  auto twice = investigate::searchRows(16, [](const std::vector<int64_t>& rows) {
    const bool fails = has(rows, 9) || has(rows, 15);
    return investigate::Trial{fails, "", 0, "", !fails};
  });
  CHECK(twice.rows.size() == 1);
  REQUIRE(twice.otherSets.size() == 1);
  CHECK(!twice.restFails);
  investigate::SampleBisection s;
  s.rows = twice.rows;
  s.otherSets = twice.otherSets;
  CHECK(s.culprits() == std::vector<int64_t>{9, 15});
  // More than kOtherSets + 1 rows failing alone: the search stops, and says the rest still fails.
  auto many = investigate::searchRows(32, [](const std::vector<int64_t>& rows) {
    bool fails = false;
    for (int64_t r : {1, 6, 11, 20, 27, 30}) fails = fails || has(rows, r);
    return investigate::Trial{fails, "", 0, "", !fails};
  });
  CHECK(many.otherSets.size() == investigate::kOtherSets);
  CHECK(many.restFails);
  // A set that needs a second row to run (a batch norm), beside an independent culprit: both found.
  auto mixed = investigate::searchRows(16, [](const std::vector<int64_t>& rows) {
    const bool fails = (has(rows, 5) && rows.size() >= 2) || has(rows, 12);
    return investigate::Trial{fails, "", 0, "", !fails};
  });
  s = {};
  s.rows = mixed.rows;
  s.triggers = mixed.triggers;
  s.otherSets = mixed.otherSets;
  CHECK(has(s.culprits(), 5));
  CHECK(has(s.culprits(), 12));
  CHECK(!mixed.restFails);
}

TEST_CASE("a batch no part of which can run (every part fails one other way) stops the search and says so",
          "[investigate][bisect]") {
  // A recurrent hidden state carried from the previous batch: any cut fails with a shape error
  // that names the part's size. Only the whole batch fails as recorded.
  auto b = investigate::searchRows(64, [](const std::vector<int64_t>& rows) {
    investigate::Trial t;
    t.fails = rows.size() == 64;
    if (!t.fails)
      t.otherFailure = "RuntimeError: Expected hidden size (1, " + std::to_string(rows.size()) + ", 16), got [1, 64, 16]";
    return t;
  });
  CHECK(b.reproduced);
  CHECK(b.cutsFail == "RuntimeError: Expected hidden size (1, 32, 16), got [1, 64, 16]");
  CHECK(b.replays == 1 + investigate::kCutsFailTrials + 1);  // the whole batch, the parts, the batch less a row
  CHECK(b.rows.size() == 64);
  CHECK(b.triggers.empty());

  // Parts that fail other ways with different errors are a search as before: rows 0 and 15 fail
  // only together, so every half and quarter fails another way, but not with one error.
  auto mixed = investigate::searchRows(16, [](const std::vector<int64_t>& rows) {
    investigate::Trial t;
    t.fails = has(rows, 0) && has(rows, 15);
    if (!t.fails) t.otherFailure = has(rows, 0) ? "ValueError: one" : "KeyError: two";
    return t;
  });
  CHECK(mixed.cutsFail.empty());
  CHECK(mixed.rows == std::vector<int64_t>{0, 15});

  // A step that needs more rows than a quarter of the batch (a top-k over 40 of 64 rows): the
  // halves and quarters fail one other way, the batch less a row fails as recorded, and the
  // search goes on from there to the culprit.
  auto topk = investigate::searchRows(64, [](const std::vector<int64_t>& rows) {
    investigate::Trial t;
    if (rows.size() < 40)
      t.otherFailure = "RuntimeError: selected index k out of range";
    else
      t.fails = has(rows, 50);
    return t;
  });
  CHECK(topk.cutsFail.empty());
  CHECK(has(topk.rows, 50));
  CHECK(topk.rows.size() < 64);
}

TEST_CASE("culprit rows are named by the dataset index the row order matched them to, and a row it left open by none",
          "[investigate][bisect]") {
  // A matched order answers without the bundle's index tensor, which holds the sampler's order.
  replayer::RowOrder order{"reordered", {14, 9, 3}, ""};
  CHECK(investigate::datasetIndices("not-read.ccap", 4, {2, 0}, order) == std::vector<int64_t>{3, 14});
  CHECK_FALSE(investigate::datasetIndices("not-read.ccap", 4, {3}, order));  // no such row
  order = replayer::RowOrder{"partial", {14, -1, 3}, "row 1 matches several of the samples"};
  CHECK(investigate::datasetIndices("not-read.ccap", 4, {2}, order) == std::vector<int64_t>{3});
  CHECK_FALSE(investigate::datasetIndices("not-read.ccap", 4, {1, 2}, order));
}

TEST_CASE("a replay from an earlier keyframe replaces one that departed only when it runs that step as recorded",
          "[investigate][bisect]") {
  auto step = [](int64_t s, bool bitwise) {
    replayer::StepReplay r;
    r.step = s;
    r.recorded = true;
    r.bitwise = bitwise;
    return r;
  };
  replayer::ReplayResult newer;
  newer.keyframe = 60;
  newer.divergedAt = 60;
  replayer::ReplayResult earlier;
  earlier.keyframe = 0;
  for (int64_t s = 0; s <= 70; ++s) earlier.steps.push_back(step(s, true));
  CHECK(investigate::runsFurther(earlier, newer));
  // Nondeterminism departs from any keyframe: from the earlier one, no later than from the newer.
  earlier.divergedAt = 60;
  CHECK_FALSE(investigate::runsFurther(earlier, newer));
  earlier.divergedAt = 12;
  CHECK_FALSE(investigate::runsFurther(earlier, newer));
  earlier.divergedAt = 65;  // later, but departing too: nothing says the newer keyframe was the cause
  CHECK_FALSE(investigate::runsFurther(earlier, newer));
  earlier.divergedAt.reset();
  earlier.steps[60].bitwise = false;  // a step without a verdict of its own still has to match
  CHECK_FALSE(investigate::runsFurther(earlier, newer));
  earlier.steps.resize(50);  // it never reached the step
  CHECK_FALSE(investigate::runsFurther(earlier, newer));
  newer.divergedAt.reset();  // the newer one did not depart: nothing to replace
  CHECK_FALSE(investigate::runsFurther(earlier, newer));
  // The experiments that follow start from the keyframe settled on only when one was skipped.
  CHECK(investigate::keyframeArgs(newer).empty());
  earlier.skippedKeyframe = replayer::ReplayResult::SkippedKeyframe{60, 60};
  CHECK(investigate::keyframeArgs(earlier) == std::vector<std::string>{"--keyframe", "0"});
}

TEST_CASE("a batch filled to its whole size repeats the kept rows in turn", "[investigate][bisect]") {
  CHECK(investigate::filledRows({3, 5}, 5) == std::vector<int64_t>{3, 5, 3, 5, 3});
  CHECK(investigate::filledRows({7}, 3) == std::vector<int64_t>{7, 7, 7});
  CHECK(investigate::filledRows({0, 1, 2, 3}, 4) == std::vector<int64_t>{0, 1, 2, 3});  // the whole batch, as it is
  CHECK(investigate::filledRows({}, 4).empty());
}

TEST_CASE("crashcap bisect samples names the corrupt row of a real crash", "[investigate][bisect][e2e]") {
  struct Case {
    std::string sample, fault;
    int64_t batch;
  };
  for (const auto& c : {Case{"crashcap-sample-seg", "nan-sample", 8}, Case{"crashcap-sample-cls", "bad-label", 32}}) {
    DYNAMIC_SECTION(c.sample << " " << c.fault) {
      test::TempDir dir;
      auto r = test::run({test::binPath(c.sample), "--steps", "10", "--record", dir.path(), "--fault", c.fault,
                          "--fault-step", "5", "--fault-row", "5", "--keyframe-every", "4"},
                         300);
      REQUIRE(r.exitCode == 1);
      std::string bundle;
      for (const auto& e : fs::directory_iterator(dir.path()))
        if (e.path().extension() == ".ccap") bundle = e.path().string();
      auto b = test::run({test::binPath("crashcap"), "bisect", "samples", bundle, "--json"}, 600);
      INFO(b.err);
      REQUIRE(b.exitCode == 0);
      auto j = nlohmann::json::parse(b.out);
      CHECK(j["reproduced"] == true);
      CHECK(j["step"] == 5);
      CHECK(j["batch_size"] == c.batch);
      CHECK(j["rows"] == nlohmann::json::array({5}));
      int bound = 2 * static_cast<int>(std::ceil(std::log2(c.batch))) + 2;
      CHECK(j["replays"].get<int>() <= bound);
      CHECK(j["experiments"].size() == j["replays"].get<size_t>());
      for (const auto& e : j["experiments"]) CHECK(e["command"].get<std::string>().find("--rows") != std::string::npos);
    }
  }
}
