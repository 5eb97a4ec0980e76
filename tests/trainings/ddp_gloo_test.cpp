// A data-parallel C++ training on c10d's ProcessGroupGloo (tests/trainings/ddp_gloo.cpp), its ranks
// started by `crashcap run --nproc N`: every failed rank's bundle says its rank and backend, the
// job's story names the rank that failed first and every rank's last collective, the job replays
// bit for bit with each parameter's all-reduce issued again from the replayed backward, and
// triage names the rank, the row and the dataset index of a NaN sample.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <regex>
#include <set>

#include "test_support.hpp"

using namespace crashcap;
using nlohmann::json;

namespace {

struct Job {
  test::RunResult run;
  double seconds = 0;
};

/// `crashcap run --nproc N` over the training, recording into the run's directory.
Job runJob(const test::TempDir& dir, int nproc, std::vector<std::string> faults) {
  std::vector<std::string> args = {test::binPath("crashcap"), "run", "--nproc", std::to_string(nproc),
                                   "--hang-timeout", "30", "--dir", dir.path(), "--",
                                   test::binPath("crashcap-test-ddp-gloo"), "--record", dir.path(), "--steps", "8"};
  args.insert(args.end(), faults.begin(), faults.end());
  auto started = std::chrono::steady_clock::now();
  Job job{test::run(args, 600), 0};
  job.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return job;
}

json crashcapJson(std::vector<std::string> args, int timeout = 600) {
  args.insert(args.begin(), test::binPath("crashcap"));
  args.push_back("--json");
  auto r = test::run(args, timeout);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);
  return json::parse(r.out);
}

json theJob(const test::TempDir& dir) {
  auto story = crashcapJson({"inspect", dir.path()});
  REQUIRE(story["jobs"].size() == 1);
  REQUIRE(story["not_in_a_job"].empty());
  return story["jobs"][0];
}

std::map<int, json> ranksOf(const json& job) {
  std::map<int, json> out;
  for (const auto& r : job["ranks"]) out[r["rank"].get<int>()] = r;
  return out;
}

}  // namespace

TEST_CASE("a NaN sample on rank 1 of a 2-rank C++ Gloo training: the story, the job's bit-for-bit replay and triage "
          "name rank 1, row 5 and its dataset index",
          "[trainings][distributed]") {
  test::TempDir dir;
  auto job = runJob(dir, 2, {"--fail-rank", "1", "--fail-how", "nan", "--fail-step", "3", "--fail-row", "5"});
  INFO(job.run.out << job.run.err);
  REQUIRE(job.run.exitCode != 0);
  std::smatch m;
  REQUIRE(std::regex_search(job.run.out, m, std::regex("rank 1: a NaN in dataset sample (\\d+), row 5")));
  const int64_t poisoned = std::stoll(m[1]);

  // Each rank's bundle says who it was: the program told its Recorder (setDistributed).
  auto bundles = test::bundlesIn(dir.path());
  REQUIRE(bundles.size() == 2);
  std::set<int> recordedRanks;
  for (const auto& bundle : bundles) {
    auto one = crashcapJson({"inspect", bundle});
    recordedRanks.insert(one["distributed"]["rank"].get<int>());
    CHECK(one["distributed"]["backend"] == "gloo");
    CHECK(one["distributed"]["source"] == "c10d");
    CHECK(one["distributed"]["world_size"] == 2);
    CHECK(one["distributed"]["job_id_source"] == "crashcap run");
  }
  CHECK(recordedRanks == std::set<int>{0, 1});

  auto story = theJob(dir);
  INFO(story.dump(2));
  CHECK(story["backend"] == "gloo");
  CHECK(story["first_failed"] == 1);
  CHECK(story["missing"].empty());
  auto ranks = ranksOf(story);
  REQUIRE(ranks.size() == 2);
  CHECK(ranks[1]["classification"] == "nonfinite-loss");
  CHECK(ranks[1]["step"] == 3);
  CHECK_FALSE(ranks[1]["from_peer"].get<bool>());
  CHECK(ranks[0]["from_peer"].get<bool>());  // its gradients went NaN through the all-reduce
  // The four broadcasts of rank 0's weights (#0..#3), then one all-reduce per parameter (four) per
  // step: step 3's last is #4 + 4 * 4 - 1 = #19, on both ranks.
  for (auto& [rank, r] : ranks) {
    CHECK(r["last_collective"]["name"] == "gloo:all_reduce");
    CHECK(r["last_collective"]["step"] == 3);
    CHECK(r["last_collective"]["seq"] == 19);
  }

  // The job replayed from rank 0's bundle: both ranks together, each parameter's hook all-reducing
  // its gradient again in the replayed backward; the norms agree across the ranks, NaN at step 3.
  auto replay = crashcapJson({"replay", ranks[0]["bundle"].get<std::string>()});
  INFO(replay.dump(2));
  CHECK(replay["step"] == 3);
  REQUIRE(replay["ranks"].size() == 2);
  std::set<std::string> norms;
  for (const auto& r : replay["ranks"]) {
    CHECK(r["error"].is_null());
    CHECK(r["replay"]["verdict"] == "reproduced-bitwise");
    json steps = json::array();
    for (const auto& s : r["replay"]["steps"]) steps.push_back(s["grad_norm"]);
    norms.insert(steps.dump());
  }
  CHECK(norms.size() == 1);
  CHECK(replay["ranks"][1]["replay"]["first_nonfinite_op"]["name"] == "aten::addmm");

  // Triage asked of rank 0 triages rank 1, which failed first on its own.
  auto triage = crashcapJson({"triage", ranks[0]["bundle"].get<std::string>()}, 1200);
  INFO(triage.dump(2));
  CHECK(triage["job"]["rank"] == 1);
  CHECK(triage["job"]["asked_rank"] == 0);
  bool confirmed = false;
  for (const auto& h : triage["hypotheses"])
    if (h["id"] == "invalid-data") confirmed = h["verdict"] == "confirmed";
  CHECK(confirmed);
  CHECK(triage["culprit"]["rank"] == 1);
  CHECK(triage["culprit"]["step"] == 3);
  CHECK(triage["culprit"]["rows"] == json::array({5}));
  CHECK(triage["culprit"]["dataset_indices"] == json::array({poisoned}));
}

TEST_CASE("rank 2 of a 4-rank C++ Gloo training SIGKILLed at step 3: every rank sealed in bounded time, the story "
          "names its op and the all-reduce it never issued, and the job replays to it",
          "[trainings][distributed]") {
  test::TempDir dir;
  auto job = runJob(dir, 4, {"--fail-rank", "2", "--fail-how", "kill", "--fail-step", "3"});
  INFO(job.run.out << job.run.err);
  CHECK(job.run.exitCode == 128 + SIGKILL);  // the status of the rank that failed first
  // The peers meet the closed connection, not their collectives' 30-minute timeout.
  CHECK(job.seconds < 300);
  CHECK(test::bundlesIn(dir.path()).size() == 4);

  auto story = theJob(dir);
  INFO(story.dump(2));
  CHECK(story["first_failed"] == 2);
  auto ranks = ranksOf(story);
  REQUIRE(ranks.size() == 4);
  CHECK(ranks[2]["how"] == "killed by SIGKILL");
  CHECK(ranks[2]["step"] == 3);
  CHECK(ranks[2]["ops_from_progress"].get<bool>());
  CHECK(ranks[2]["op"] == "aten::binary_cross_entropy_with_logits");  // killed after its forward
  // Its last collective was step 2's last all-reduce (#15); the others issued step 3's first.
  CHECK(ranks[2]["last_collective"]["seq"] == 15);
  CHECK(ranks[2]["last_collective"]["step"] == 2);
  CHECK(ranks[2]["collective_story"].get<std::string>().find("it never issued #16 gloo:all_reduce") !=
        std::string::npos);
  for (int peer : {0, 1, 3}) {
    CHECK((ranks[peer]["from_peer"].get<bool>() || ranks[peer]["outcome"] == "stopped"));
    CHECK(ranks[peer]["last_collective"]["seq"] == 16);
    CHECK(ranks[peer]["last_collective"]["step"] == 3);
  }

  // Rank 2's step 3 died with it before the recorder's writer took it (the replay ends at step 2,
  // bit for bit), or reached its bundle: then the job replays step 3, whose step function has no
  // kill in it (the training loop had): no rank fails, and rank 2's replay says why its SIGKILL did
  // not come back. Either way step 2 is the recording's, bit for bit, wherever its end reached
  // the bundle (SIGKILL may take rank 2's with it).
  auto replay = crashcapJson({"replay", ranks[2]["bundle"].get<std::string>()});
  INFO(replay.dump(2));
  REQUIRE(replay["ranks"].size() == 4);
  for (const auto& r : replay["ranks"]) {
    CHECK(r["error"].is_null());
    REQUIRE(r["replay"].is_object());
    int stepTwo = 0;
    for (const auto& s : r["replay"]["steps"])
      if (s["step"] == 2) {
        ++stepTwo;
        CHECK((s["bitwise"].get<bool>() || (r["rank"] == 2 && s["recorded_loss"].is_null())));
      }
    CHECK(stepTwo == 1);
  }
  if (replay["step"] == 2) {
    bool said = false;
    for (const auto& note : replay["notes"])
      said = said || note.get<std::string>().find("rank 2 was in step 3") != std::string::npos;
    CHECK(said);
    for (const auto& r : replay["ranks"]) CHECK(r["verdict"] == "reproduced-bitwise");
  } else {
    CHECK(replay["step"] == 3);
    for (const auto& r : replay["ranks"]) CHECK(r["verdict"] == "not-reproduced");
    bool said = false;
    for (const auto& note : replay["ranks"][2]["replay"]["notes"])
      said = said || note.get<std::string>().find("ended in step 3 (killed by SIGKILL) without its recorder seeing "
                                                  "why") != std::string::npos;
    CHECK(said);
  }
}
