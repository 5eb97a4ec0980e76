// Crash safety with real processes: every way a training process dies leaves a bundle that
// names the step, and what reached the OS before a SIGKILL is never lost.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/inspect/story.hpp"
#include "crashcap/recorder/recording_dir.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace crashcap;
using crashcap::test::TempDir;

namespace {

/// The one crash bundle a run left, verified.
std::string onlyBundle(const std::string& dir) {
  auto bundles = test::bundlesIn(dir);
  REQUIRE(bundles.size() == 1);
  auto v = formats::verifyBundle(bundles[0]);
  INFO((v.problems.empty() ? std::string() : v.problems[0].what));
  REQUIRE(v.ok());
  return bundles[0];
}

struct Expect {
  std::string fail;
  int exitCode;          ///< negative: killed by that signal
  std::string kind;
  int signal;            ///< 0: none
  std::string errorPart; ///< text the crash error contains
};

}  // namespace

TEST_CASE("every way a training step dies leaves one sealed bundle naming the step", "[recorder][crash]") {
  const std::vector<Expect> cases = {
      {"exception", 1, "exception", 0, "injected failure at step 5"},
      {"uncaught", -SIGABRT, "terminate", 0, "injected failure at step 5"},
      {"terminate", -SIGABRT, "terminate", 0, "without an active exception"},
      {"abort", -SIGABRT, "signal", SIGABRT, "SIGABRT"},
      // raise(): the process sent it itself, so there is no faulting address to name.
      {"segv", -SIGSEGV, "signal", SIGSEGV, "SIGSEGV (Segmentation fault), raised in the process (raise or kill"},
      {"nonfinite", 1, "nonfinite", 0, "non-finite loss at step 5"},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.fail) {
      TempDir dir;
      auto r = test::run({test::binPath("crashcap-test-victim"), "--dir", dir.path(), "--fail", c.fail, "--fail-step",
                          "5", "--steps", "12", "--keyframe-every", "4"});
      INFO(r.err);
      CHECK(r.exitCode == c.exitCode);  // the process dies as it would have without the recorder
      auto bundle = onlyBundle(dir.path());
      CHECK(fs::path(bundle).filename().string().rfind("crash-", 0) == 0);
      CHECK(recorder::findRecordings(dir.path()).empty());  // the recording became the bundle
      auto reader = formats::BundleReader::open(bundle);
      auto story = inspect::storyJson(*reader);
      INFO(story.dump(2));
      CHECK(story["crash"]["kind"] == c.kind);
      CHECK(story["crash"]["step"] == 5);
      CHECK(story["crash"]["phase"] == "forward");
      if (c.signal)
        CHECK(story["crash"]["signal"] == c.signal);
      else
        CHECK(story["crash"]["signal"].is_null());
      CHECK(story["crash"]["error"].get<std::string>().find(c.errorPart) != std::string::npos);
      CHECK(!story["crash"]["stack"].empty());
      CHECK(story["steps"]["first"] == 0);
      CHECK(story["steps"]["last"] == 5);
      // Steps 0..4 completed; step 5 died, in its forward pass or, non-finite, as its end was
      // recorded: it ended then (its loss is kept) but never completed.
      CHECK(story["steps"]["count"] == 6);
      CHECK(story["steps"]["ended"] == (c.fail == "nonfinite" ? 6 : 5));
      CHECK(story["steps"]["completed"] == 5);
      CHECK(story["keyframes"] == nlohmann::json::array({0, 4}));
      // The failing step's inputs and generator state are there, and so is the keyframe
      // replay starts from.
      CHECK(reader->find("steps/5/batch/x"));
      CHECK(reader->find("steps/5/batch/y"));
      CHECK(reader->find("steps/5/rng/cpu"));
      CHECK(reader->find("keyframes/4/parameters/w1"));
      CHECK(reader->find("keyframes/4/optimizer/w1/momentum_buffer"));
      // The op ring ends in the failing step's forward.
      REQUIRE(!story["last_ops"].empty());
      CHECK(story["last_ops"].back()["step"] == 5);
      CHECK(story["status"] == "crashed");
    }
  }
}

TEST_CASE("a fatal signal carries the interpreter's stack its dump writes, and a fault inside the dump still seals",
          "[recorder][crash]") {
  for (std::string how : {"text", "faulty"}) {
    DYNAMIC_SECTION(how) {
      TempDir dir;
      auto r = test::run({test::binPath("crashcap-test-victim"), "--dir", dir.path(), "--fail", "segv", "--fail-step",
                          "3", "--steps", "6", "--stack-dump", how});
      INFO(r.err);
      CHECK(r.exitCode == -SIGSEGV);
      auto reader = formats::BundleReader::open(onlyBundle(dir.path()));
      auto crash = inspect::storyJson(*reader)["crash"];
      INFO(crash.dump(2));
      CHECK(crash["kind"] == "signal");
      CHECK(crash["step"] == 3);
      const auto error = crash["error"].get<std::string>();
      const auto& stack = crash["stack"];
      REQUIRE(stack.size() >= 2);
      if (how == "text") {
        // The program's innermost line, and the library call it was in; the frames follow the
        // native ones, innermost first.
        CHECK(error.find("; in Python at File \"/work/train.py\", line 12, in <module> (calling File "
                         "\"/usr/lib/python3.11/ctypes/__init__.py\", line 519, in string_at)") != std::string::npos);
        CHECK(stack[stack.size() - 1] == "File \"/work/train.py\", line 12, in <module>");
        CHECK(stack[stack.size() - 2] == "File \"/usr/lib/python3.11/ctypes/__init__.py\", line 519, in string_at");
      } else {
        // The dump faulted after writing: the handler came back from it and sealed without them.
        CHECK(error.find("in Python at") == std::string::npos);
        CHECK(stack.back().get<std::string>().rfind("File \"", 0) != 0);
      }
    }
  }
}

TEST_CASE("a failure before the first step is sealed with its text though no segment exists", "[recorder][crash]") {
  TempDir dir;
  auto r = test::run({test::binPath("crashcap-test-victim"), "--dir", dir.path(), "--fail", "setup"});
  INFO(r.err);
  CHECK(r.exitCode == 1);
  auto bundle = onlyBundle(dir.path());
  auto reader = formats::BundleReader::open(bundle);
  auto story = inspect::storyJson(*reader);
  INFO(story.dump(2));
  CHECK(story["crash"]["kind"] == "exception");
  CHECK(story["crash"]["phase"] == "setup");
  CHECK(story["crash"]["step"].is_null());
  CHECK(story["crash"]["error"].get<std::string>().find("data loader failed") != std::string::npos);
  CHECK(story["steps"]["count"] == 0);
  CHECK(formats::readRecords(*reader).program.has_value());  // run.ccap was copied
}

/// `crashcap seal DIR --json` over a directory holding one recording: its entry in "sealed".
nlohmann::json sealOnlyRecording(const std::string& dir) {
  auto s = test::run({test::binPath("crashcap"), "seal", dir, "--json"});
  INFO(s.err);
  REQUIRE(s.exitCode == 0);
  auto j = nlohmann::json::parse(s.out);
  REQUIRE(j["sealed"].size() == 1);
  return j["sealed"][0];
}

TEST_CASE("a rank its launcher placed is placed in its job even when killed before the writer wrote anything",
          "[recorder][kill][distributed]") {
  // The identity from the launcher's variables is in run.ccap, synced, when the Recorder exists:
  // it does not wait in the writer's queue behind the first step, where a SIGKILL would take it.
  TempDir dir;
  auto r = test::run({"/usr/bin/env", "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "MASTER_ADDR=127.0.0.1",
                      "MASTER_PORT=29511", "CRASHCAP_JOB_ID=job-killed-early", test::binPath("crashcap-test-victim"),
                      "--dir", dir.path(), "--fail", "start"});
  INFO(r.err);
  REQUIRE(r.exitCode == -SIGKILL);
  std::string bundle = sealOnlyRecording(dir.path())["bundle"];
  auto view = formats::readRecords(*formats::BundleReader::open(bundle));
  REQUIRE(view.distributed);
  CHECK(view.distributed->rank == 1);
  CHECK(view.distributed->worldSize == 2);
  CHECK(view.distributed->localRank == 1);
  CHECK(view.distributed->jobId == "job-killed-early");
  CHECK(view.distributed->jobIdSource == "crashcap run");
  CHECK(view.distributed->rendezvous == "env://127.0.0.1:29511");
  CHECK(view.distributed->source == "environment");
  CHECK(view.stepBegins.empty());
}

TEST_CASE("a recording closed without its syncs is as finished and as complete as a synced one", "[recorder][seal]") {
  // close(durable=false) is for a recording removed when clean; if it is kept after all (a crash
  // after the close), every record is there for seal, from the page cache.
  TempDir dir;
  auto r = test::run({test::binPath("crashcap-test-victim"), "--dir", dir.path(), "--steps", "7", "--keyframe-every",
                      "3", "--close-unsynced"});
  INFO(r.err);
  REQUIRE(r.exitCode == 0);
  auto recordings = recorder::findRecordings(dir.path());
  REQUIRE(recordings.size() == 1);
  CHECK(recorder::recordingState(recordings[0]) == "finished");
  auto sealed = sealOnlyRecording(dir.path());
  CHECK(sealed["state"] == "finished");
  CHECK(sealed["first_step"] == 0);
  CHECK(sealed["last_step"] == 6);
  std::string bundle = sealed["bundle"];
  CHECK(formats::verifyBundle(bundle).ok());
  auto story = inspect::storyJson(*formats::BundleReader::open(bundle));
  CHECK(story["status"] == "finished");
  CHECK(story["steps"]["completed"] == 7);
}

TEST_CASE("a clean run leaves a recording that seal turns into a finished bundle", "[recorder][seal]") {
  TempDir dir;
  auto r = test::run({test::binPath("crashcap-test-victim"), "--dir", dir.path(), "--steps", "9", "--keyframe-every",
                      "3", "--retain", "2"});
  REQUIRE(r.exitCode == 0);
  CHECK(test::bundlesIn(dir.path()).empty());
  auto recordings = recorder::findRecordings(dir.path());
  REQUIRE(recordings.size() == 1);
  // Retention: one segment per keyframe (0, 3, 6), at most two kept.
  CHECK(recorder::segmentFiles(recordings[0]).size() == 2);
  auto sealed = sealOnlyRecording(dir.path());
  CHECK(sealed["state"] == "finished");
  CHECK(sealed["first_step"] == 3);
  CHECK(sealed["last_step"] == 8);
  std::string bundle = sealed["bundle"];
  CHECK(fs::path(bundle).filename().string().rfind("recording-", 0) == 0);
  CHECK(formats::verifyBundle(bundle).ok());
  auto story = inspect::storyJson(*formats::BundleReader::open(bundle));
  CHECK(story["crash"].is_null());
  CHECK(story["status"] == "finished");
  CHECK(story["segments_deleted"] == 1);
  CHECK(story["steps"]["completed"] == 6);
  CHECK(recorder::findRecordings(dir.path()).empty());
}

namespace {

/// Starts the victim with stdout on a pipe, reads its "written N" lines for `ms` milliseconds
/// — counted from the start, or from its first written step when `midRun` — SIGKILLs it and
/// returns the newest N it reported (-1: none).
int64_t runAndKill(const std::string& dir, int ms, int keyframeEvery, bool midRun) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);
    auto bin = test::binPath("crashcap-test-victim");
    auto kf = std::to_string(keyframeEvery);
    execl(bin.c_str(), bin.c_str(), "--dir", dir.c_str(), "--fail", "busy", "--report", "--keyframe-every", kf.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  int64_t written = -1;
  std::string pending;
  auto start = std::chrono::steady_clock::now();
  auto deadline = midRun ? start + std::chrono::seconds(120) : start + std::chrono::milliseconds(ms);
  bool timerStarted = !midRun;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[4096];
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    for (size_t nl; (nl = pending.find('\n')) != std::string::npos; pending.erase(0, nl + 1)) {
      auto line = pending.substr(0, nl);
      if (line.rfind("written ", 0) == 0) written = std::stoll(line.substr(8));
      if (!timerStarted && written >= 0) {
        timerStarted = true;
        deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
      }
    }
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  close(fds[0]);
  CHECK(WIFSIGNALED(status));
  return written;
}

}  // namespace

TEST_CASE("after SIGKILL at a random moment, seal recovers every step that reached the OS", "[recorder][kill]") {
  int trials = 50;
  if (const char* t = std::getenv("CRASHCAP_KILL_TRIALS")) trials = std::atoi(t);
  uint64_t seed = std::random_device{}();
  if (const char* s = std::getenv("CRASHCAP_KILL_SEED")) seed = std::strtoull(s, nullptr, 10);
  INFO("seed " << seed << " (rerun with CRASHCAP_KILL_SEED=" << seed << ")");
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < trials; ++trial) {
    TempDir dir;
    // One trial in five kills during start-up (before or while the recorder opens); the rest
    // at a random moment of the training, after its first step reached the OS. Keyframes
    // every few steps, so kills also land inside segment switches.
    bool midRun = trial % 5 != 0;
    int ms = midRun ? static_cast<int>(rng() % 1500) : static_cast<int>(rng() % 1200);
    int keyframeEvery = 1 + static_cast<int>(rng() % 8);
    int64_t written = runAndKill(dir.path(), ms, keyframeEvery, midRun);
    INFO("trial " << trial << ": killed " << ms << " ms after " << (midRun ? "its first step" : "start")
                  << ", keyframe every " << keyframeEvery << ", last step reported written " << written);
    if (midRun) REQUIRE(written >= 0);
    auto s = test::run({test::binPath("crashcap"), "seal", dir.path(), "--json"});
    if (written < 0 && s.exitCode != 0) continue;  // killed before anything reached the OS
    INFO(s.err);
    REQUIRE(s.exitCode == 0);
    auto j = nlohmann::json::parse(s.out);
    REQUIRE(j["sealed"].size() == 1);
    std::string bundle = j["sealed"][0]["bundle"];
    auto v = formats::verifyBundle(bundle);
    INFO((v.problems.empty() ? std::string() : v.problems[0].what));
    REQUIRE(v.ok());
    auto reader = formats::BundleReader::open(bundle);
    auto view = formats::readRecords(*reader);
    if (written < 0) continue;  // killed before the first step reached the OS: nothing promised
    // The step program is queued before the first step, so it reached the file before it.
    CHECK(view.program.has_value());
    // Every step 0..written is there (nothing is retained away: the victim keeps all
    // segments), with its batch, in order and without gaps.
    REQUIRE(!view.stepBegins.empty());
    CHECK(view.stepBegins.front().step == 0);
    CHECK(view.stepBegins.back().step >= written);
    for (size_t i = 0; i < view.stepBegins.size(); ++i) {
      const auto& b = view.stepBegins[i];
      REQUIRE(b.step == static_cast<int64_t>(i));
      for (const auto& name : b.batch) REQUIRE(reader->find(name));
      REQUIRE(b.keyframe >= 0);
    }
    CHECK(view.status.has_value());
    CHECK(view.status->state == "interrupted");
  }
}

TEST_CASE("after SIGKILL, the progress file names the step and phase the process was in, its last op and "
          "collective",
          "[recorder][kill]") {
  // Killed in the forward pass of step 30, with the writer given no time: whatever of steps
  // 0..30 reached the disk, the sealed status says step 30, forward; the op ring and its
  // collectives die with the process, but the newest op and the collectives issued (one after
  // each step's backward, 0..29) outlive it in the progress file.
  for (int trial = 0; trial < 3; ++trial) {
    TempDir dir;
    auto r = test::run({test::binPath("crashcap-test-victim"), "--dir", dir.path(), "--fail", "kill", "--fail-step", "30",
                        "--steps", "40", "--keyframe-every", "10", "--collective"});
    REQUIRE(r.exitCode == -SIGKILL);
    auto recordings = recorder::findRecordings(dir.path());
    REQUIRE(recordings.size() == 1);
    auto progress = recorder::readProgress(recordings[0]);
    REQUIRE(progress);
    CHECK(progress->step == 30);
    CHECK(progress->phase == "forward");
    CHECK(progress->stepsBegun == 31);
    // Step 30's newest op (cleared at each step's begin, so not a step-29 op), and step 29's
    // collective.
    CHECK(progress->lastOp.rfind("aten::", 0) == 0);
    CHECK(progress->collectivesIssued == 30);
    CHECK(progress->lastCollective == "gloo:all_reduce");
    CHECK(progress->lastCollectiveStep == 29);
    auto s = test::run({test::binPath("crashcap"), "seal", dir.path(), "--json"});
    INFO(s.err);
    REQUIRE(s.exitCode == 0);
    auto sealed = nlohmann::json::parse(s.out)["sealed"][0];
    CHECK(sealed["begun_step"] == 30);
    std::string bundle = sealed["bundle"];
    auto reader = formats::BundleReader::open(bundle);
    auto view = formats::readRecords(*reader);
    REQUIRE(view.status);
    CHECK(view.status->state == "interrupted");
    CHECK(view.status->lastStep == 30);
    CHECK(view.status->lastPhase == "forward");
    CHECK(view.status->stepsBegun == 31);
    CHECK(view.status->lastOp == progress->lastOp);
    CHECK(view.status->collectivesIssued == 30);
    CHECK(view.status->lastCollective == "gloo:all_reduce");
    CHECK(view.status->lastCollectiveStep == 29);
    REQUIRE(!view.stepBegins.empty());
    // Step 30, and every step before it down to the earliest keyframe, is in the bundle or named
    // lost (still in the writer's queue at the kill): never silently missing.
    auto lost = formats::lostSteps(view);
    bool recorded = view.stepBegins.back().step == 30;
    CHECK((recorded || std::find(lost.begin(), lost.end(), 30) != lost.end()));
    std::set<int64_t> held(lost.begin(), lost.end());
    for (const auto& b : view.stepBegins) held.insert(b.step);
    REQUIRE(!view.keyframes.empty());
    int64_t earliest = INT64_MAX;
    for (const auto& k : view.keyframes) earliest = std::min(earliest, k.step);
    for (int64_t step = earliest; step <= 30; ++step) CHECK(held.count(step) == 1);
    if (!recorded) {
      bool warned = false;
      for (const auto& w : view.status->warnings) warned |= w.find("the process was in step 30 (forward)") != std::string::npos;
      CHECK(warned);
    }
  }
}

TEST_CASE("seal ignores a progress file that is missing, short or not one", "[recorder][kill]") {
  for (std::string content : {std::string(), std::string("CCPROG1"), std::string(64, 'x')}) {
    TempDir dir;
    auto r = test::run({test::binPath("crashcap-test-victim"), "--dir", dir.path(), "--fail", "kill", "--fail-step", "5",
                        "--steps", "10", "--sleep-ms", "20"});
    REQUIRE(r.exitCode == -SIGKILL);
    auto recording = recorder::findRecordings(dir.path()).at(0);
    auto path = fs::path(recording) / recorder::kProgressFileName;
    if (content.empty()) {
      fs::remove(path);
    } else {
      test::writeFile(path.string(), std::vector<uint8_t>(content.begin(), content.end()));
    }
    CHECK(!recorder::readProgress(recording));
    auto s = test::run({test::binPath("crashcap"), "seal", dir.path(), "--json"});
    INFO(s.err);
    REQUIRE(s.exitCode == 0);
    auto view = formats::readRecords(*formats::BundleReader::open(nlohmann::json::parse(s.out)["sealed"][0]["bundle"]));
    REQUIRE(view.status);
    // Without the file, the step comes from the records (the sleep gave the writer time).
    CHECK(view.status->lastStep == view.stepBegins.back().step);
    CHECK(view.status->lastPhase.empty());
  }
}

TEST_CASE("the sealed warning names the steps that never reached the disk only as far as the count begun proves",
          "[recorder][kill]") {
  // A SIGKILLed recording whose progress file is made to say that the process had gone further
  // than its records: how far, and how many steps it had begun, decide what the warning can name.
  // Step numbers only grow from 0: N steps begun, the newest N-1, are exactly 0..N-1.
  struct Case {
    int64_t ahead;      ///< the progress file's step: the last held + ahead
    int64_t begunLess;  ///< steps begun: the progress file's step + 1 - begunLess
    const char* what;
  };
  for (auto c : {Case{1, 0, "the next step"}, Case{4, 0, "four steps, 0..S all begun"},
                 Case{85, 78, "a step far ahead, fewer begun: the numbers skip"}}) {
    INFO(c.what);
    TempDir dir;
    auto r = test::run({test::binPath("crashcap-test-victim"), "--dir", dir.path(), "--fail", "kill", "--fail-step", "5",
                        "--steps", "10", "--sleep-ms", "20"});
    REQUIRE(r.exitCode == -SIGKILL);
    auto recording = recorder::findRecordings(dir.path()).at(0);
    // The last step the segments hold: a copy of the recording, sealed as it is.
    TempDir copy;
    fs::copy(recording, fs::path(copy.path()) / fs::path(recording).filename(), fs::copy_options::recursive);
    auto probe = test::run({test::binPath("crashcap"), "seal", copy.path(), "--json"});
    REQUIRE(probe.exitCode == 0);
    auto probed =
        formats::readRecords(*formats::BundleReader::open(nlohmann::json::parse(probe.out)["sealed"][0]["bundle"]));
    REQUIRE(!probed.stepBegins.empty());
    const int64_t last = probed.stepBegins.back().step;
    const int64_t step = last + c.ahead;
    const uint64_t begun = static_cast<uint64_t>(step + 1 - c.begunLess);
    {
      auto path = (fs::path(recording) / recorder::kProgressFileName).string();
      auto bytes = test::readFile(path);
      REQUIRE(bytes.size() >= sizeof(recorder::ProgressPage));
      std::memcpy(bytes.data() + offsetof(recorder::ProgressPage, step), &step, sizeof step);
      std::memcpy(bytes.data() + offsetof(recorder::ProgressPage, stepsBegun), &begun, sizeof begun);
      test::writeFile(path, bytes);
    }
    auto s = test::run({test::binPath("crashcap"), "seal", dir.path(), "--json"});
    INFO(s.err);
    REQUIRE(s.exitCode == 0);
    auto view = formats::readRecords(*formats::BundleReader::open(nlohmann::json::parse(s.out)["sealed"][0]["bundle"]));
    REQUIRE(view.status);
    REQUIRE(view.stepBegins.back().step == last);
    std::string missing =
        c.ahead == 1          ? fmt::format("the records of step {}", step)
        : c.begunLess == 0    ? fmt::format("the records of steps {}..{}", last + 1, step)
                              : fmt::format("the records of step {}, and of any step begun after step {},", step, last);
    std::string warning;
    for (const auto& w : view.status->warnings)
      if (w.rfind(fmt::format("the process was in step {} (", step), 0) == 0) warning = w;
    CHECK(warning.size() > missing.size());
    CHECK(warning.find("); " + missing + " never reached the disk") != std::string::npos);
    // The steps named lost agree: all of them when 0..S began, only S when the numbers may skip.
    auto lost = formats::lostSteps(view);
    std::vector<int64_t> expected;
    for (int64_t k = c.begunLess == 0 ? last + 1 : step; k <= step; ++k) expected.push_back(k);
    CHECK(lost == expected);
  }
}

TEST_CASE("a file-size limit mid-run degrades the recording, never the training", "[recorder][disk]") {
  TempDir dir;
  // 160 KiB per file: a segment (a keyframe and 40 steps of about 6 KiB) outgrows it; the next
  // keyframe's segment starts small again.
  auto victim = test::binPath("crashcap-test-victim");
  auto r = test::run({"bash", "-c",
                      "ulimit -f 160 && exec \"$0\" --dir \"$1\" --steps 120 --keyframe-every 40", victim,
                      dir.path()});
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 0);  // training finished
  std::smatch m;
  REQUIRE(std::regex_search(r.out, m, std::regex("done: 120 steps, (\\d+) dropped")));
  uint64_t dropped = std::stoull(m[1]);
  CHECK(dropped > 0);
  // One clear warning, not one per record.
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t at = r.err.find(what); at != std::string::npos; at = r.err.find(what, at + 1)) ++n;
    return n;
  };
  CHECK(count("recording degraded") == 1);
  CHECK(r.err.find("File too large") != std::string::npos);
  auto s = test::run({test::binPath("crashcap"), "seal", dir.path(), "--json"});
  INFO(s.err);
  REQUIRE(s.exitCode == 0);
  std::string bundle = nlohmann::json::parse(s.out)["sealed"][0]["bundle"];
  auto story = inspect::storyJson(*formats::BundleReader::open(bundle));
  CHECK(story["dropped_records"] == dropped);
  CHECK(story["status"] == "finished");
  CHECK(!story["warnings"].empty());
}

TEST_CASE("secrets in the environment and on the command line never reach a bundle", "[recorder][secrets]") {
  TempDir dir;
  const std::string envSecret = "sk-live-ENVSECRET-4f9a2b";
  const std::string argSecret = "hunter2-ARGSECRET-77c1";
  setenv("WANDB_API_KEY", envSecret.c_str(), 1);
  setenv("HF_TOKEN", envSecret.c_str(), 1);
  setenv("MY_DB_PASSWORD", envSecret.c_str(), 1);
  auto r = test::run({test::binPath("crashcap-test-victim"), "--dir", dir.path(), "--fail", "exception", "--api-key",
                      argSecret});
  unsetenv("WANDB_API_KEY");
  unsetenv("HF_TOKEN");
  unsetenv("MY_DB_PASSWORD");
  REQUIRE(r.exitCode == 1);
  auto bundle = onlyBundle(dir.path());
  // Raw bytes: not stored anywhere as written.
  auto raw = test::readFile(bundle);
  std::string bytes(raw.begin(), raw.end());
  CHECK(bytes.find(envSecret) == std::string::npos);
  CHECK(bytes.find(argSecret) == std::string::npos);
  // Decompressed: every record's meta and decoded body.
  auto reader = formats::BundleReader::open(bundle);
  for (const auto& rec : reader->records()) {
    auto raw = reader->readRecord(rec.offset);
    std::string meta(raw.meta.begin(), raw.meta.end()), body(raw.body.begin(), raw.body.end());
    INFO("record at " << rec.offset);
    CHECK(meta.find(envSecret) == std::string::npos);
    CHECK(body.find(envSecret) == std::string::npos);
    CHECK(meta.find(argSecret) == std::string::npos);
    CHECK(body.find(argSecret) == std::string::npos);
  }
  // The names are on record as withheld, so a reader knows they were set.
  auto env = reader->environment();
  REQUIRE(env);
  for (const char* name : {"WANDB_API_KEY", "HF_TOKEN", "MY_DB_PASSWORD"})
    CHECK(std::find(env->redacted.begin(), env->redacted.end(), name) != env->redacted.end());
}
