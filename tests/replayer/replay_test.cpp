// Replay from real crash bundles of the sample trainings: the crash reproduces bit for bit on
// the same device, the first op whose output goes non-finite is named, and a departure from
// the recording is reported as divergence at its step.
#include <catch2/catch.hpp>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/layout.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/replayer/replay.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace crashcap;

namespace {

/// Runs a sample with a fault under the recorder and returns its crash bundle.
std::string crashBundle(const test::TempDir& dir, const std::string& sample, const std::string& fault,
                        int faultStep = 6, const std::string& optimizer = "sgd") {
  auto r = test::run({test::binPath(sample), "--steps", "16", "--record", dir.path(), "--fault", fault, "--fault-step",
                      std::to_string(faultStep), "--fault-row", "2", "--keyframe-every", "4", "--optimizer", optimizer},
                     300);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 1);
  for (const auto& e : fs::directory_iterator(dir.path()))
    if (e.path().extension() == ".ccap") return e.path().string();
  FAIL("no crash bundle");
  return "";
}

}  // namespace

TEST_CASE("replay reproduces each sample crash bit for bit and names the first non-finite op", "[replayer]") {
  struct Case {
    std::string sample, fault, op, phase;
    bool inputAlreadyNonFinite;  ///< the op received the bad value (data) or made it (numerics)
  };
  const std::vector<Case> cases = {
      {"crashcap-sample-seg", "nan-sample", "convolution", "forward", true},
      {"crashcap-sample-seg", "dice-eps0", "aten::div", "forward", false},
      {"crashcap-sample-cls", "nan-sample", "convolution", "forward", true},
  };
  for (const auto& c : cases) {
    DYNAMIC_SECTION(c.sample << " " << c.fault) {
      test::TempDir dir;
      auto bundle = crashBundle(dir, c.sample, c.fault);
      auto r = replayer::replay(bundle);
      CHECK(r.verdict == replayer::Verdict::ReproducedBitwise);
      CHECK(r.step == 6);
      CHECK(r.keyframe == 4);
      CHECK(!r.divergedAt);
      REQUIRE(r.steps.size() == 3);
      for (const auto& s : r.steps) CHECK(s.bitwise);
      CHECK(r.error.find("non-finite loss at step 6") != std::string::npos);
      REQUIRE(r.firstNonFiniteOp);
      INFO(r.firstNonFiniteOp->name);
      CHECK(r.firstNonFiniteOp->name.find(c.op) != std::string::npos);
      CHECK(r.firstNonFiniteOp->phase == c.phase);
      int64_t inputNonFinite = 0;
      for (const auto& in : r.firstNonFiniteOp->inputs) inputNonFinite += in.nanCount + in.infCount;
      CHECK((inputNonFinite > 0) == c.inputAlreadyNonFinite);
      int64_t outputNonFinite = 0;
      for (const auto& out : r.firstNonFiniteOp->outputs) outputNonFinite += out.nanCount + out.infCount;
      CHECK(outputNonFinite > 0);
    }
  }
}

TEST_CASE("the same failure: last lines equal but for numbers, and a worker's death in either of the loader's words",
          "[replayer]") {
  using replayer::sameFailure;
  CHECK(sameFailure("Traceback ...\nIndexError: Target 12 is out of bounds.", "IndexError: Target 7 is out of bounds."));
  CHECK_FALSE(sameFailure("IndexError: Target 7 is out of bounds.", "ValueError: Target 7 is out of bounds."));
  CHECK_FALSE(sameFailure("IndexError: Target 7 is out of bounds.\nsomething else", "IndexError: Target 7 is out of bounds."));
  const std::string killed = "RuntimeError: DataLoader worker (pid 1234) is killed by signal: Segmentation fault. ";
  const std::string waited = "RuntimeError: DataLoader worker (pid(s) 77) exited unexpectedly";
  const std::string reported = "(the DataLoader reports: DataLoader worker (pid 77) is killed by signal: Segmentation "
                               "fault.)\n" + waited;
  CHECK(sameFailure(waited, killed));                // how the worker ended is unknown on one side
  CHECK(sameFailure(killed, waited));
  CHECK(sameFailure(reported, killed));              // both say: the same signal
  CHECK_FALSE(sameFailure(killed, "RuntimeError: DataLoader worker (pid 9) is killed by signal: Bus error. It is "
                                  "possible that dataloader's workers are out of shared memory."));
  CHECK_FALSE(sameFailure(reported, "RuntimeError: DataLoader worker (pid 9) exited unexpectedly with exit code 1. "
                                    "Details are lost due to multiprocessing."));
  // A worker's death is compared only when the error raised is one: a report in the notes of
  // another error does not make it one.
  CHECK_FALSE(sameFailure(reported.substr(0, reported.find('\n')) + "\nValueError: bad record", killed));
}

TEST_CASE("replay reproduces an exception with the same text, including the dropout RNG", "[replayer]") {
  test::TempDir dir;
  auto bundle = crashBundle(dir, "crashcap-sample-cls", "bad-label");
  auto r = replayer::replay(bundle);
  CHECK(r.verdict == replayer::Verdict::ReproducedBitwise);  // steps 4, 5 bit for bit (dropout draws from the restored RNG)
  CHECK(r.error.find("Target 10 is out of bounds.") != std::string::npos);
}

TEST_CASE("replay restores Adam's moments and step counters bit for bit", "[replayer]") {
  test::TempDir dir;
  auto bundle = crashBundle(dir, "crashcap-sample-cls", "nan-sample", 7, "adam");
  auto r = replayer::replay(bundle);
  CHECK(r.keyframe == 4);
  CHECK(r.steps.size() == 4);
  CHECK(r.verdict == replayer::Verdict::ReproducedBitwise);  // steps 4..6 after Adam updates from restored state
}

TEST_CASE("an injected nondeterministic kernel makes replay diverged at its step", "[replayer][fault]") {
  test::TempDir dir;
  auto bundle = crashBundle(dir, "crashcap-sample-seg", "nan-sample", 7);
  // Replay only: the first convolution of step 5 moves every output by one ulp, as a kernel
  // with a different reduction order would.
  auto r = test::run({"/usr/bin/env", "CRASHCAP_FAULT_INJECT=op=aten::conv2d;step=5;mode=perturb",
                      test::binPath("crashcap"), "replay", bundle, "--json"},
                     300);
  INFO(r.err);
  REQUIRE(r.exitCode == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["verdict"] == "diverged");
  CHECK(j["diverged_at"] == 5);
  CHECK(j["same_setup"] == true);
  CHECK(j["steps"][0]["bitwise"] == true);   // step 4 still matches
  CHECK(j["steps"][1]["bitwise"] == false);  // step 5 does not
  // Without the fault the same bundle replays bit for bit.
  auto clean = test::run({test::binPath("crashcap"), "replay", bundle, "--json"}, 300);
  REQUIRE(clean.exitCode == 0);
  CHECK(nlohmann::json::parse(clean.out)["verdict"] == "reproduced-bitwise");
}

TEST_CASE("replay in float64 or under another setting compares the failure, not the bits", "[replayer]") {
  test::TempDir dir;
  auto bundle = crashBundle(dir, "crashcap-sample-seg", "dice-eps0");
  auto wide = test::run({test::binPath("crashcap"), "replay", bundle, "--dtype", "float64", "--json"}, 300);
  INFO(wide.err);
  REQUIRE(wide.exitCode == 0);
  auto j = nlohmann::json::parse(wide.out);
  CHECK(j["dtype"] == "float64");
  CHECK(j["same_setup"] == false);
  CHECK(j["verdict"] == "reproduced");  // 0/0 is NaN in any precision
  CHECK(j["diverged_at"].is_null());    // float64 numbers differ from the recording without being divergence
  CHECK(j["first_nonfinite_op"]["name"] == "aten::div");
  CHECK(j["first_nonfinite_op"]["outputs"][0]["dtype"] == "Double");

  auto threads = test::run({test::binPath("crashcap"), "replay", bundle, "--set", "torch.threads=2", "--json"}, 300);
  REQUIRE(threads.exitCode == 0);
  auto t = nlohmann::json::parse(threads.out);
  CHECK(t["settings"]["torch.threads"] == "2");
  CHECK(t["recorded_settings"]["torch.threads"] == j["recorded_settings"]["torch.threads"]);
  CHECK(t["threads"] == 2);
  CHECK(t["verdict"].get<std::string>().rfind("reproduced", 0) == 0);

  auto unknown = test::run({test::binPath("crashcap"), "replay", bundle, "--set", "cudnn.fastest=true"});
  CHECK(unknown.exitCode == 2);
  CHECK(unknown.err.find("unknown setting 'cudnn.fastest'") != std::string::npos);
  auto badValue = test::run({test::binPath("crashcap"), "replay", bundle, "--set", "cudnn.benchmark=maybe"});
  CHECK(badValue.exitCode == 2);
  CHECK(badValue.err.find("not true or false") != std::string::npos);
}

TEST_CASE("replay of a healthy step matches the recording; a missing step is a clear error", "[replayer]") {
  test::TempDir dir;
  auto bundle = crashBundle(dir, "crashcap-sample-cls", "nan-sample", 9);
  replayer::ReplayOptions o;
  o.step = 6;
  auto r = replayer::replay(bundle, o);
  CHECK(r.verdict == replayer::Verdict::ReproducedBitwise);
  CHECK(r.error.empty());
  CHECK(!r.firstNonFiniteOp);
  o.step = 400;
  try {
    replayer::replay(bundle, o);
    FAIL("replayed a step that is not there");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::NotFound);
    CHECK(e.message().find("step 400") != std::string::npos);
  }
}

TEST_CASE("a process killed in a step its bundle holds: replay runs the step, and the kill is not reproduced; "
          "killed in a step it does not hold: replay says it ends before it",
          "[replayer]") {
  // SIGKILL leaves no crash record: only the run status, never closed, with the step and phase the
  // process was in, and what crashcap run saw. Made from a healthy run of 8 steps, sealed: killed in
  // step 7's backward, before its end reached the bundle; killed between steps 7 and 8; and a
  // crashed run's bundle whose crash record SIGKILL took (its last step goes NaN again on replay).
  test::TempDir dir;
  auto r0 = test::run({test::binPath("crashcap-sample-cls"), "--steps", "8", "--record", dir.file("healthy"), "--fault",
                       "none", "--keyframe-every", "4"},
                      300);
  REQUIRE(r0.exitCode == 0);
  auto sealed = test::run({test::binPath("crashcap"), "seal", dir.file("healthy")});
  INFO(sealed.err);
  REQUIRE(sealed.exitCode == 0);
  auto healthy = test::bundlesIn(dir.file("healthy"));
  REQUIRE(healthy.size() == 1);
  auto killedCopy = [&](const std::string& from, const std::string& name, int64_t step, const std::string& phase,
                        bool dropLastEnd) {
    const std::string out = dir.file(name);
    auto reader = formats::BundleReader::open(from);
    uint64_t lastEnd = 0;
    for (const auto& e : reader->records())
      if (e.type == static_cast<uint16_t>(formats::RecordType::StepEnd)) lastEnd = std::max(lastEnd, e.offset);
    auto writer = formats::BundleWriter::createCopy(out, reader->fileHeader(), formats::WriterOptions{});
    formats::copyRecords(*reader, *writer, [&](const formats::RecordEntry& e) {
      return e.type != static_cast<uint16_t>(formats::RecordType::Crash) &&
             e.type != static_cast<uint16_t>(formats::RecordType::RunStatus) && !(dropLastEnd && e.offset == lastEnd);
    });
    formats::RunStatusData status;
    status.state = "interrupted";
    status.stepsBegun = static_cast<uint64_t>(step + 1);
    status.lastStep = step;
    status.lastPhase = phase;
    formats::writeMetaRecord(*writer, status);
    formats::SupervisionData supervision;
    supervision.signal = 9;
    supervision.signalName = "SIGKILL";
    supervision.classification = "signal";
    supervision.evidence = "killed by SIGKILL";
    formats::writeMetaRecord(*writer, supervision);
    writer->seal();
    return out;
  };

  // Killed in step 7: the replay (its default target, the last step) runs it clean.
  auto killed = killedCopy(healthy[0], "killed.ccap", 7, "backward", true);
  auto view = formats::readRecords(*formats::BundleReader::open(killed));
  REQUIRE(formats::killedInStep(view) == 7);
  REQUIRE(view.stepEnds.size() == 7);
  auto r = replayer::replay(killed);
  CHECK(r.step == 7);
  CHECK(r.verdict == replayer::Verdict::NotReproduced);
  CHECK(r.recordedError == "killed by SIGKILL");
  CHECK(r.error.empty());
  REQUIRE(r.steps.size() == 4);  // from keyframe 4
  for (const auto& s : r.steps) CHECK((s.bitwise || (s.step == 7 && !s.recorded)));
  REQUIRE(r.notes.size() == 1);
  CHECK(r.notes[0].find("ended in step 7 (killed by SIGKILL) without its recorder seeing why") != std::string::npos);
  CHECK_FALSE(replayer::showsFailure(r));
  // Another step is no kill step: it reproduces the recording.
  replayer::ReplayOptions o;
  o.step = 5;
  CHECK(replayer::replay(killed, o).verdict == replayer::Verdict::ReproducedBitwise);

  // Killed in step 8, whose records never reached the bundle: the replay ends at step 7, the last
  // held, which passed in the recording and again, and says why it ends there.
  auto unheld = killedCopy(healthy[0], "unheld.ccap", 8, "forward", false);
  auto u = replayer::replay(unheld);
  CHECK(u.step == 7);
  CHECK(u.verdict == replayer::Verdict::ReproducedBitwise);
  CHECK_FALSE(replayer::showsFailure(u));
  REQUIRE(u.notes.size() == 1);
  CHECK(u.notes[0] == "the process was killed in step 8 (killed by SIGKILL), whose records never reached the bundle: "
                      "the replay ends at step 7, the last it holds, which the recording saw pass");

  // Killed after step 7 ended: step 7 passed in the recording and passes again.
  auto between = killedCopy(healthy[0], "between.ccap", 7, "between-steps", false);
  auto b = replayer::replay(between);
  CHECK(b.verdict == replayer::Verdict::ReproducedBitwise);
  CHECK(b.notes.empty());

  // A replay that fails in the kill step shows that failure: SIGKILL came after the step went NaN.
  test::TempDir crashDir;
  auto nan = killedCopy(crashBundle(crashDir, "crashcap-sample-cls", "nan-sample", 6), "nan.ccap", 6, "backward", true);
  auto n = replayer::replay(nan);
  CHECK(n.step == 6);
  CHECK(replayer::showsFailure(n));
  CHECK(n.error.find("non-finite") != std::string::npos);
}

TEST_CASE("crashcap replay --json has the verdict, the step and the first non-finite op", "[replayer][cli]") {
  test::TempDir dir;
  auto bundle = crashBundle(dir, "crashcap-sample-seg", "dice-eps0");
  auto r = test::run({test::binPath("crashcap"), "replay", bundle, "--json"}, 300);
  INFO(r.err);
  REQUIRE(r.exitCode == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["verdict"] == "reproduced-bitwise");
  CHECK(j["step"] == 6);
  CHECK(j["diverged_at"].is_null());
  CHECK(j["first_nonfinite_op"]["name"] == "aten::div");
  CHECK(j["first_nonfinite_op"]["phase"] == "forward");
  CHECK(j["first_nonfinite_op"]["outputs"][0]["nan_count"] == 1);
  CHECK(j["steps_replayed"] == 3);
  CHECK(j["device"] == "cpu");
  CHECK(j["recorded_device"] == "cpu");
  CHECK(j["same_setup"] == true);
  // Without a GPU: a clear error naming what is here.
  auto devices = replayer::availableDevices();
  if (std::find(devices.begin(), devices.end(), "cuda:0") == devices.end()) {
    auto cuda = test::run({test::binPath("crashcap"), "replay", bundle, "--device", "cuda:0"});
    CHECK(cuda.exitCode == 2);
    CHECK(cuda.err.find("cannot replay on cuda:0") != std::string::npos);
    CHECK(cuda.err.find("devices here: cpu") != std::string::npos);
  }
  // A CUDA-only setting cannot change a CPU replay (no fault-injection hook reads it here).
  CHECK_FALSE(replayer::settingActsOn("cudnn.benchmark", "cpu"));
  CHECK_FALSE(replayer::settingActsOn("cuda.matmul.allow_tf32", "cpu"));
  CHECK(replayer::settingActsOn("torch.threads", "cpu"));
  CHECK(replayer::settingActsOn("cudnn.benchmark", "cuda:0"));
}

TEST_CASE("bisect steps finds the first failing step and shows the weights running away", "[replayer][bisect]") {
  SECTION("a learning-rate blow-up: finite losses first, weights exploding, then non-finite") {
    test::TempDir dir;
    auto bundle = crashBundle(dir, "crashcap-sample-seg", "lr-blowup", 5);
    auto r = test::run({test::binPath("crashcap"), "bisect", "steps", bundle, "--json"}, 300);
    INFO(r.err);
    REQUIRE(r.exitCode == 0);
    auto j = nlohmann::json::parse(r.out);
    CHECK(j["from_keyframe"] == 0);  // the whole retained history
    int64_t first = j["first_failing_step"];
    CHECK((first > 5 && first <= 9));
    CHECK(j["target"] == first);  // the recorder stopped the run at the first non-finite step
    const auto& steps = j["steps"];
    CHECK(steps[5]["lr"].get<double>() > 1e3 * steps[4]["lr"].get<double>());
    // The update of the step before the failure left the weights orders of magnitude larger.
    double before = steps[4]["weight_norm"], last = steps[first - 1]["weight_norm"];
    CHECK(last > 1000 * before);
  }
  SECTION("a corrupt sample: the failing step is the one that consumed it") {
    test::TempDir dir;
    auto bundle = crashBundle(dir, "crashcap-sample-cls", "nan-sample", 6);
    auto r = test::run({test::binPath("crashcap"), "bisect", "steps", bundle, "--json"}, 300);
    REQUIRE(r.exitCode == 0);
    auto j = nlohmann::json::parse(r.out);
    CHECK(j["first_failing_step"] == 6);
    CHECK(j["reason"] == "loss");
  }
}

TEST_CASE("replay is bit for bit with TorchScript's graph executor optimising, as LibTorch does by default",
          "[replayer]") {
  // The segmenter's optimised backward differs in the last bit from its profiling calls'; a
  // replay from keyframe 8 must make the calls the run made before it.
  test::TempDir dir;
  auto r = test::run({test::binPath("crashcap-sample-seg"), "--steps", "16", "--record", dir.path(), "--fault",
                      "nan-sample", "--fault-step", "10", "--fault-row", "2", "--keyframe-every", "4", "--jit-optimize"},
                     300);
  INFO(r.out << r.err);
  REQUIRE(r.exitCode == 1);
  auto bundles = test::bundlesIn(dir.path());
  REQUIRE(bundles.size() == 1);
  auto replay = replayer::replay(bundles[0]);
  CHECK(replay.keyframe == 8);
  for (const auto& s : replay.steps) {
    INFO("step " << s.step);
    CHECK(s.bitwise);
  }
  CHECK(replay.verdict == replayer::Verdict::ReproducedBitwise);
}
