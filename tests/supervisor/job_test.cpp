// `crashcap inspect DIR`'s rules on hand-built ranks: the rank that failed on its own comes first
// even when a peer's error was earlier, a rank waiting in a collective another never issued is
// named, and bundles of two jobs and of no job stay apart. The real jobs are in
// tests/python/test_distributed.py.
#include <catch2/catch.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <fstream>

#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/supervisor/job.hpp"
#include "test_support.hpp"

using namespace crashcap;
using namespace crashcap::formats;

namespace {

struct RankSpec {
  std::string job = "job-a";
  int rank = 0, world = 2;
  std::string error;                    ///< "" no crash record
  int64_t timeNs = 0;
  int64_t step = 4;
  std::vector<CollectiveData> collectives;
  bool distributed = true;
  std::string phase = "backward";       ///< the crash record's
};

CollectiveData collective(uint64_t seq, int64_t step, bool ended) {
  CollectiveData c;
  c.seq = seq;
  c.name = "gloo:all_reduce";
  c.step = step;
  c.inputs = {{"float32", {161}}};
  c.startNs = 1000;
  c.endNs = ended ? 2000 : 0;
  return c;
}

void writeRank(const std::string& path, const RankSpec& s) {
  auto w = BundleWriter::create(path);
  if (s.distributed) writeMetaRecord(*w, DistributedData{s.job, "crashcap run", s.rank, s.world, s.rank, "gloo", "", "test"});
  if (!s.error.empty()) {
    CrashData c;
    c.kind = "exception";
    c.step = s.step;
    c.phase = s.phase;
    c.error = s.error;
    c.timeNs = s.timeNs;
    c.pid = 100 + s.rank;
    writeMetaRecord(*w, c);
  }
  OpTraceData ops;
  ops.ops.push_back({7, "c10d::allreduce_", "backward", -1, s.step, 1, {}, 1, 2});
  ops.totalOps = 8;
  ops.capacity = 16;
  ops.collectives = s.collectives;
  ops.totalCollectives = s.collectives.empty() ? 0 : s.collectives.back().seq + 1;
  writeMetaRecord(*w, ops);
  w->seal();
}

/// crashcap run's record of a process it started, from start to end.
SupervisionData supervision(uint32_t pid, std::string classification, int64_t startNs, int64_t endNs) {
  SupervisionData sv;
  sv.pid = pid;
  sv.classification = std::move(classification);
  sv.startNs = startNs;
  sv.endNs = endNs;
  return sv;
}

const supervisor::JobRank& rankOf(const supervisor::Job& job, int rank) {
  for (const auto& r : job.ranks)
    if (r.rank == rank) return r;
  FAIL("no rank " << rank);
  throw 0;
}

}  // namespace

TEST_CASE("the rank that failed on its own is first, though a peer's error came earlier", "[job]") {
  test::TempDir dir;
  // Rank 0 saw rank 1 go (Gloo) 10 ms before rank 1's own error reached its recorder.
  writeRank(dir.file("crash-a0.ccap"), {"job-a", 0, 3, "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] "
                                                     "Connection closed by peer [127.0.0.1]:4242",
                                        1'000'000'000, 4, {collective(8, 4, true), collective(9, 4, false)}});
  writeRank(dir.file("crash-a1.ccap"), {"job-a", 1, 3, "IndexError: index 12 is out of bounds", 1'010'000'000, 4,
                                        {collective(8, 4, true)}});
  auto stories = supervisor::readJobs(dir.path());
  REQUIRE(stories.jobs.size() == 1);
  const auto& job = stories.jobs[0];
  CHECK(job.jobId == "job-a");
  CHECK(job.worldSize == 3);
  CHECK(job.firstFailed == 1);
  CHECK(rankOf(job, 0).fromPeer);
  CHECK_FALSE(rankOf(job, 1).fromPeer);
  CHECK(job.missing == std::vector<int>{2});  // the world has 3 ranks; rank 2 left nothing here
  REQUIRE(job.furthestCollective);
  CHECK(job.furthestCollective->seq == 9);
  auto headline = supervisor::jobHeadline(job);
  INFO(headline);
  CHECK(headline.rfind("rank 1 failed first: raised at step 4 (backward, last op c10d::allreduce_): IndexError", 0) == 0);
  CHECK(headline.find("rank 0 failed from it at step 4") != std::string::npos);
  CHECK(headline.find("waiting in collective #9 gloo:all_reduce (step 4)") != std::string::npos);
  auto text = supervisor::jobsText(stories);
  INFO(text);
  CHECK(text.find("its last collective #8 gloo:all_reduce (step 4) ended; it never issued #9 gloo:all_reduce") !=
        std::string::npos);
  CHECK(text.find("rank 2     MISSING") != std::string::npos);
  auto j = supervisor::jobsJson(stories);
  CHECK(j["jobs"][0]["first_failed"] == 1);
  CHECK(j["jobs"][0]["missing"] == nlohmann::json::array({2}));
  CHECK(j["jobs"][0]["ranks"][0]["last_collective"]["ended"] == false);
  CHECK(j["jobs"][0]["ranks"][0]["from_peer"] == true);
}

TEST_CASE("bundles of two jobs stay apart, and one of no job is listed on its own", "[job]") {
  test::TempDir dir;
  writeRank(dir.file("crash-a0.ccap"), {"job-a", 0, 2, "RuntimeError: a", 5'000'000'000, 2, {}});
  writeRank(dir.file("crash-a1.ccap"), {"job-a", 1, 2, "", 0, 2, {}});
  writeRank(dir.file("crash-b0.ccap"), {"job-b", 0, 2, "", 0, 6, {}});
  writeRank(dir.file("crash-b1.ccap"), {"job-b", 1, 2, "RuntimeError: b", 1'000'000'000, 6, {}});
  RankSpec single;
  single.distributed = false;
  single.error = "RuntimeError: alone";
  writeRank(dir.file("crash-single.ccap"), single);
  auto stories = supervisor::readJobs(dir.path());
  REQUIRE(stories.jobs.size() == 2);
  // The job whose failure is newest last.
  CHECK(stories.jobs[0].jobId == "job-b");
  CHECK(stories.jobs[0].firstFailed == 1);
  CHECK(stories.jobs[1].jobId == "job-a");
  CHECK(stories.jobs[1].firstFailed == 0);
  CHECK(rankOf(stories.jobs[1], 1).outcome == "healthy");  // its bundle records no failure
  REQUIRE(stories.notInJob.size() == 1);
  CHECK(stories.notInJob[0].find("crash-single.ccap") != std::string::npos);
  CHECK(supervisor::jobsText(stories).find("2 jobs in") != std::string::npos);
}

TEST_CASE("inspect DIR on what is no directory says so", "[job]") {
  test::TempDir dir;
  CHECK_THROWS_AS(supervisor::readJobs(dir.file("absent")), Error);
}

TEST_CASE("a rank that recorded a failure and went on is healthy when the run log says it exited 0", "[job]") {
  test::TempDir dir;
  // Rank 0 recorded a non-finite loss and went on (crashcap run --nonfinite record): exit 0.
  writeRank(dir.file("crash-a0.ccap"), {"job-a", 0, 2, "non-finite loss at step 4: nan", 1'000'000'000, 4, {}});
  {
    std::ofstream log(dir.file("runs.jsonl"));
    log << R"({"job_id": "job-a", "ranks": [{"rank": 0, "pid": 1, "exit_code": 0, "signal": 0, "classification": "",)"
        << R"( "stopped": false, "bundle": ""}, {"rank": 1, "pid": 2, "exit_code": 0, "signal": 0, "classification": "",)"
        << R"( "stopped": false, "bundle": ""}], "first_failed_rank": null})" << "\n";
    log << R"({"job_id": null, "ranks": 7})" << "\n";  // not a line crashcap wrote: passed over
  }
  auto stories = supervisor::readJobs(dir.path());
  REQUIRE(stories.jobs.size() == 1);
  const auto& job = stories.jobs[0];
  CHECK(job.firstFailed == -1);
  CHECK(rankOf(job, 0).outcome == "healthy");
  CHECK(rankOf(job, 1).outcome == "healthy");
  CHECK(job.missing.empty());
  CHECK(supervisor::jobHeadline(job) == "no rank failed");
}

TEST_CASE("a SIGKILLed rank's story takes its last op and collective from its progress file", "[job]") {
  test::TempDir dir;
  // Rank 0 saw rank 1 go while it waited in #9; rank 1, killed in step 4's forward, left no op
  // trace, but its run status (sealed from its progress file) keeps its newest op and that it
  // issued #0..#8, the last in step 3.
  writeRank(dir.file("crash-a0.ccap"), {"job-a", 0, 2, "RuntimeError: Connection closed by peer [127.0.0.1]:4242",
                                        2'000'000'000, 4, {collective(8, 3, true), collective(9, 4, false)}});
  {
    auto w = BundleWriter::create(dir.file("crash-a1.ccap"));
    writeMetaRecord(*w, DistributedData{"job-a", "crashcap run", 1, 2, 1, "gloo", "", "test"});
    SupervisionData sv = supervision(101, "signal", 500'000'000, 1'000'000'000);
    sv.signal = 9;
    sv.signalName = "SIGKILL";
    writeMetaRecord(*w, sv);
    RunStatusData status;
    status.state = "interrupted";
    status.stepsBegun = 5;
    status.lastStep = 4;
    status.lastPhase = "forward";
    status.lastOp = "aten::linear";
    status.collectivesIssued = 9;
    status.lastCollective = "gloo:all_reduce";
    status.lastCollectiveStep = 3;
    writeMetaRecord(*w, status);
    w->seal();
  }
  auto stories = supervisor::readJobs(dir.path());
  REQUIRE(stories.jobs.size() == 1);
  const auto& job = stories.jobs[0];
  CHECK(job.firstFailed == 1);
  const auto& killed = rankOf(job, 1);
  CHECK_FALSE(killed.opTrace);
  CHECK(killed.progressOps);
  CHECK(killed.op == "aten::linear");
  CHECK(killed.collectivesIssued == 9);
  REQUIRE(killed.lastCollective);
  CHECK(killed.lastCollective->seq == 8);
  CHECK(killed.lastCollective->step == 3);
  auto headline = supervisor::jobHeadline(job);
  INFO(headline);
  CHECK(headline.rfind("rank 1 failed first: killed by SIGKILL at step 4 (forward, last op aten::linear)", 0) == 0);
  auto text = supervisor::jobsText(stories);
  INFO(text);
  CHECK(text.find("the last collective it issued was #8 gloo:all_reduce (step 3) (from its progress file: whether it "
                  "ended is not known); it never issued #9 gloo:all_reduce") != std::string::npos);
  auto j = supervisor::jobsJson(stories);
  CHECK(j["jobs"][0]["ranks"][1]["ops_from_progress"] == true);
  CHECK(j["jobs"][0]["ranks"][1]["last_collective"]["seq"] == 8);
  CHECK(j["jobs"][0]["ranks"][1]["last_collective"]["ended"].is_null());  // not known, not "waiting"
  CHECK(j["jobs"][0]["ranks"][1]["last_collective"]["from_progress"] == true);
  CHECK(j["jobs"][0]["ranks"][0]["last_collective"]["from_progress"] == false);
  CHECK(j["jobs"][0]["ranks"][1]["collectives_issued"] == 9);
  CHECK(j["jobs"][0]["ranks"][1]["op"] == "aten::linear");
}

/// Rank 1 of job-a recorded by pid 101, with crashcap run's record of pid `supervised` (started
/// with `environment`, its stderr ending in `stderrTail`), and a crash record written by pid
/// `crashPid` (0: none). Without `recordedEnvironment` the bundle has no environment record (the
/// rank was killed before it reached the disk): only its recording info, written by this
/// process, names the recorder's pid.
void writeSupervisedRank(const std::string& path, uint32_t supervised, std::vector<std::string> environment,
                         uint32_t crashPid, std::string stderrTail = "", bool recordedEnvironment = true) {
  auto w = BundleWriter::create(path);
  writeMetaRecord(*w, DistributedData{"job-a", "crashcap run", 1, 2, 1, "gloo", "", "test"});
  if (recordedEnvironment) {
    EnvironmentData env;
    env.facts = {{"process.pid", "101"}};
    w->writeEnvironment(env);
  }
  if (crashPid) {
    CrashData c;
    c.kind = crashPid == 101 ? "nonfinite" : "exit";
    c.step = 4;
    c.phase = "forward";
    c.error = crashPid == 101 ? "non-finite loss at step 4: nan" : "process 1 terminated with signal SIGKILL";
    c.timeNs = 1'900'000'000;
    c.pid = crashPid;
    writeMetaRecord(*w, c);
  }
  SupervisionData sv = supervision(supervised, "python-exception", 500'000'000, 9'000'000'000);
  sv.exitCode = 1;
  sv.evidence = stderrTail.empty() ? "ProcessExitedException: process 1 terminated with signal SIGKILL"
                                   : "ChildFailedError: ========";
  sv.stderrTail = std::move(stderrTail);
  sv.environment = std::move(environment);
  writeMetaRecord(*w, sv);
  w->seal();
}

TEST_CASE("a launcher's supervision record tells a rank only when the rank has no account of its own", "[job]") {
  test::TempDir dir;
  // Rank 0 failed through its peer; rank 1's bundle holds crashcap run's record of pid 50.
  writeRank(dir.file("crash-a0.ccap"), {"job-a", 0, 2, "RuntimeError: Connection closed by peer [127.0.0.1]:4242",
                                        2'000'000'000, 4, {collective(8, 4, true)}});
  auto rank1 = [&] {
    auto stories = supervisor::readJobs(dir.path());
    REQUIRE(stories.jobs.size() == 1);
    CHECK(stories.jobs[0].firstFailed == 1);
    return rankOf(stories.jobs[0], 1);
  };
  SECTION("the rank recorded its own crash: pid 50 was the launcher (torch.multiprocessing.spawn, torchrun)") {
    writeSupervisedRank(dir.file("crash-a1.ccap"), 50, {}, 101);
    auto own = rank1();
    CHECK(own.classification == "nonfinite-loss");
    CHECK(own.error == "non-finite loss at step 4: nan");
    CHECK(own.timeNs == 1'900'000'000);  // its recorder's clock, not the launcher's exit
  }
  SECTION("crashcap run --nproc started pid 50 as this rank (a wrapper script that runs Python)") {
    writeSupervisedRank(dir.file("crash-a1.ccap"), 50, {"RANK=1", "WORLD_SIZE=2"}, 101);
    auto own = rank1();
    CHECK(own.classification == "python-exception");
    CHECK(own.timeNs == 9'000'000'000);
  }
  SECTION("the rank was SIGKILLed and crashcap run sealed its recording with the launcher's record") {
    // torch.multiprocessing.spawn names the process by its index, the rank.
    writeSupervisedRank(dir.file("crash-a1.ccap"), 50, {}, 50);
    auto own = rank1();
    CHECK(own.outcome == "failed");
    CHECK(own.how == "killed by SIGKILL");  // what the launcher saw it die of, not the launcher's exit status 1
    CHECK(own.signal == 9);
    CHECK(own.classification == "signal");
    CHECK(own.error == "process 1 terminated with signal SIGKILL (the launcher's report)");
    CHECK(own.timeNs == 0);  // the launcher's end is not when the rank died
  }
  SECTION("torchrun reported the rank's process by pid, among the other ranks' errors") {
    writeSupervisedRank(dir.file("crash-a1.ccap"), 50, {}, 50,
                        "[default0]:RuntimeError: [../gloo/transport/tcp/pair.cc:589] Read error: Connection reset by "
                        "peer\n  rank      : 1 (local_rank: 1)\n  exitcode  : -9 (pid: 101)\n  error_file: <N/A>\n"
                        "  traceback : Signal 9 (SIGKILL) received by PID 101\n");
    auto own = rank1();
    CHECK(own.how == "killed by SIGKILL");
    CHECK(own.error == "Signal 9 (SIGKILL) received by PID 101 (the launcher's report)");
    CHECK_FALSE(own.fromPeer);  // rank 0's peer error is in the launcher's output, not this rank's
  }
  SECTION("a rank killed before its environment reached the disk is known by its recording's pid") {
    const auto self = static_cast<uint32_t>(::getpid());  // BundleWriter's recording info names this process
    writeSupervisedRank(dir.file("crash-a1.ccap"), 50, {}, 0, fmt::format("  exitcode  : -9 (pid: {})\n", self), false);
    auto own = rank1();
    CHECK(own.how == "killed by SIGKILL");
    CHECK(own.classification == "signal");
    CHECK(own.error == fmt::format("exitcode  : -9 (pid: {}) (the launcher's report)", self));
  }
  SECTION("a rank its launcher stopped (torchrun's SIGTERM) is told stopped by that signal") {
    auto w = BundleWriter::create(dir.file("crash-a1.ccap"));
    writeMetaRecord(*w, DistributedData{"job-a", "crashcap run", 1, 2, 1, "gloo", "", "test"});
    EnvironmentData env;
    env.facts = {{"process.pid", "101"}};
    w->writeEnvironment(env);
    CrashData c;
    c.kind = "signal";
    c.step = 4;
    c.phase = "backward";
    c.signal = 15;
    c.signalName = "SIGTERM";
    c.error = "SIGTERM (Terminated), sent by process 50";
    c.pid = 101;
    writeMetaRecord(*w, c);
    SupervisionData sv = supervision(50, "python-exception", 500'000'000, 9'000'000'000);
    sv.exitCode = 1;
    writeMetaRecord(*w, sv);
    w->seal();
    auto stories = supervisor::readJobs(dir.path());
    REQUIRE(stories.jobs.size() == 1);
    auto own = rankOf(stories.jobs[0], 1);
    CHECK(own.outcome == "stopped");
    CHECK(own.how == "stopped by SIGTERM");  // not the crash record's kind ("signal")
    CHECK(own.step == 4);
  }
  SECTION("a launcher that reports another process's signal tells nothing of this rank") {
    writeSupervisedRank(dir.file("crash-a1.ccap"), 50, {}, 50, "  exitcode  : -9 (pid: 1010)\n");
    auto own = rank1();
    CHECK(own.how == "exit status 1");
    CHECK(own.signal == 0);
  }
}

TEST_CASE("a rank whose DataLoader raised loading the next batch failed after the step it names", "[job]") {
  test::TempDir dir;
  RankSpec failed{"job-l", 1, 2, "ValueError: corrupt sample 201", 1'000'000'000, 4, {collective(8, 4, true)}};
  failed.phase = "loading";
  writeRank(dir.file("crash-l1.ccap"), failed);
  writeRank(dir.file("crash-l0.ccap"), {"job-l", 0, 2, "RuntimeError: Connection closed by peer", 1'010'000'000, 5,
                                        {collective(8, 4, true), collective(9, 5, false)}});
  auto stories = supervisor::readJobs(dir.path());
  REQUIRE(stories.jobs.size() == 1);
  auto headline = supervisor::jobHeadline(stories.jobs[0]);
  INFO(headline);
  CHECK(headline.rfind("rank 1 failed first: raised after step 4 (loading", 0) == 0);
  CHECK(headline.find("rank 0 failed from it at step 5 (backward") != std::string::npos);
}
