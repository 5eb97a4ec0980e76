// Steps the recording lost. A keyframe larger than the writer's queue budget must never crowd
// out a step's own records (batch, generator states, learning rates, fingerprints): it is the
// keyframe that waits. And when a step is lost all the same (the writer really was behind), a
// replay whose window holds it says so with its own verdict instead of blaming the training
// with `diverged`, and inspect lists it.
// LibTorch first: glog's CHECK must not replace Catch's.
#include <torch/torch.h>
#undef CHECK
#include <catch2/catch.hpp>

#include <filesystem>

#include <nlohmann/json.hpp>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/recorder/recorder.hpp"
#include "crashcap/replayer/replay_module.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace crashcap;

namespace {

/// Wide enough that one keyframe (weights and momentum, about 9 MiB) is several times the
/// queue budget the test gives the writer.
struct WideImpl : torch::nn::Module {
  WideImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(64, 1024));
    fc2 = register_module("fc2", torch::nn::Linear(1024, 1024));
    fc3 = register_module("fc3", torch::nn::Linear(1024, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc3(torch::tanh(fc2(torch::relu(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Wide);

torch::Tensor loss(Wide& net, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(net->forward(x), y);
}

/// Trains with `policy` until step 10's batch, whose row 3 holds a NaN, stops it; returns the
/// bundle and the recorder's stats at the end.
std::pair<std::string, recorder::RecorderStats> recordCrash(const test::TempDir& dir, const recorder::Policy& policy) {
  torch::manual_seed(11);
  Wide net;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  recorder::Recorder rec(dir.path(), policy);
  rec.setModel(*net);
  rec.setOptimizer(opt);
  try {
    for (int64_t step = 0; step < 14; ++step) {
      auto x = torch::randn({8, 64});
      auto y = torch::randint(0, 4, {8});
      if (step == 10) x[3][7] = std::nan("");
      auto guard = rec.beginStep(step, {{"x", x}, {"y", y}});
      opt.zero_grad();
      auto l = loss(net, x, y);
      l.backward();
      guard.end(l);
      opt.step();
    }
  } catch (const std::exception& e) {
    auto bundle = rec.fail(e);
    return {bundle, rec.stats()};
  }
  FAIL("the NaN did not stop the training");
  return {};
}

std::vector<int64_t> recordedSteps(const std::string& bundle) {
  auto reader = formats::BundleReader::open(bundle);
  std::vector<int64_t> steps;
  for (const auto& b : formats::readRecords(*reader).stepBegins) steps.push_back(b.step);
  return steps;
}

/// A copy of `bundle` without the step_begin record of `step`: what the recorder writes when the
/// writer is too far behind to queue that step.
std::string withoutStep(const std::string& bundle, int64_t step, const std::string& out) {
  auto reader = formats::BundleReader::open(bundle);
  {
    auto writer = formats::BundleWriter::createCopy(out, reader->fileHeader());
    formats::copyRecords(*reader, *writer, [&](const formats::RecordEntry& r) {
      if (r.type != static_cast<uint16_t>(formats::RecordType::StepBegin)) return true;
      return formats::decodeStepBegin(reader->readRecord(r.offset).meta).step != step;
    });
    writer->seal();
  }
  return out;
}

/// A copy of `bundle` as `crashcap seal` leaves a process SIGKILLed in step `killedIn` whose
/// writer had only reached step `held`: no step record after `held`, no crash record, and a run
/// status `interrupted` with the progress file's step and count of steps begun.
std::string killedWithQueue(const std::string& bundle, int64_t held, int64_t killedIn, const std::string& out) {
  auto reader = formats::BundleReader::open(bundle);
  {
    auto writer = formats::BundleWriter::createCopy(out, reader->fileHeader());
    formats::copyRecords(*reader, *writer, [&](const formats::RecordEntry& r) {
      switch (static_cast<formats::RecordType>(r.type)) {
        case formats::RecordType::StepBegin:
          return formats::decodeStepBegin(reader->readRecord(r.offset).meta).step <= held;
        case formats::RecordType::StepEnd:
          return formats::decodeStepEnd(reader->readRecord(r.offset).meta).step <= held;
        case formats::RecordType::Crash:
        case formats::RecordType::RunStatus:
          return false;
        default:
          return true;
      }
    });
    formats::RunStatusData status;
    status.state = "interrupted";
    status.stepsBegun = static_cast<uint64_t>(killedIn + 1);
    status.lastStep = killedIn;
    status.lastPhase = "forward";
    formats::writeMetaRecord(*writer, status);
    writer->seal();
  }
  return out;
}

replayer::ReplayResult replayWide(const std::string& bundle, int64_t step = -1) {
  Wide net;
  replayer::ReplayOptions o;
  o.step = step;
  return replayer::replay(
      bundle, *net, [&](const std::map<std::string, at::Tensor>& b) { return loss(net, b.at("x"), b.at("y")); }, o);
}

}  // namespace

TEST_CASE("a keyframe larger than the writer's queue budget never costs a step its records", "[replayer][lost]") {
  test::TempDir dir;
  recorder::Policy policy;
  policy.keyframeEvery = 3;
  policy.queueBytes = 1 << 20;  // a keyframe here is about 9 MiB
  auto [bundle, stats] = recordCrash(dir, policy);
  REQUIRE(fs::exists(bundle));
  CHECK(stats.lostSteps.empty());
  CHECK(stats.lostStepCount == 0);
  CHECK(stats.keyframes >= 1);
  // Every step up to the crash, keyframe steps included, has its batch in the bundle.
  CHECK(recordedSteps(bundle) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
  auto reader = formats::BundleReader::open(bundle);
  auto records = formats::readRecords(*reader);
  CHECK(formats::lostSteps(records).empty());
  REQUIRE(records.status);
  CHECK(records.status->lostStepCount == 0);
  CHECK(records.status->keyframesSkipped == stats.keyframesSkipped);

  auto r = replayWide(bundle);
  CHECK(r.step == 10);
  CHECK(r.lostSteps.empty());
  CHECK(r.verdict == replayer::Verdict::ReproducedBitwise);
}

TEST_CASE("a step lost inside the replay window gives recording-incomplete, never diverged", "[replayer][lost]") {
  test::TempDir dir;
  recorder::Policy policy;
  policy.keyframeEvery = 4;  // keyframes at 0, 4, 8; the crash at 10
  auto [recorded, stats] = recordCrash(dir, policy);
  REQUIRE(fs::exists(recorded));
  REQUIRE(replayWide(recorded).verdict == replayer::Verdict::ReproducedBitwise);

  SECTION("a step between the keyframe and the target") {
    auto bundle = withoutStep(recorded, 9, dir.file("lost9.ccap"));
    auto r = replayWide(bundle);
    CHECK(r.step == 10);
    CHECK(r.keyframe == 8);
    CHECK(r.verdict == replayer::Verdict::RecordingIncomplete);
    CHECK(r.lostSteps == std::vector<int64_t>{9});
    CHECK(!r.divergedAt);
    REQUIRE(r.steps.size() == 1);  // step 8, then it stops before the lost one
    CHECK(r.steps[0].step == 8);
    CHECK(r.steps[0].bitwise);
    // A window without the lost step replays as before.
    CHECK(replayWide(bundle, 7).verdict == replayer::Verdict::ReproducedBitwise);

    auto inspect = test::run({test::binPath("crashcap"), "inspect", bundle, "--json"});
    INFO(inspect.err);
    REQUIRE(inspect.exitCode == 0);
    CHECK(nlohmann::json::parse(inspect.out)["steps"]["lost"] == nlohmann::json::array({9}));
    auto text = test::run({test::binPath("crashcap"), "inspect", bundle});
    CHECK(text.out.find("lost       step 9") != std::string::npos);
  }
  SECTION("a step before a later keyframe") {
    auto bundle = withoutStep(recorded, 5, dir.file("lost5.ccap"));
    CHECK(replayWide(bundle).verdict == replayer::Verdict::ReproducedBitwise);  // from keyframe 8
    // Replay from the earliest keyframe (what bisect steps does) starts after the lost step.
    Wide net;
    replayer::ReplayOptions o;
    o.fromEarliestKeyframe = true;
    auto r = replayer::replay(
        bundle, *net, [&](const std::map<std::string, at::Tensor>& b) { return loss(net, b.at("x"), b.at("y")); }, o);
    CHECK(r.keyframe == 8);
    CHECK(r.lostSteps.empty());
    CHECK(r.verdict == replayer::Verdict::ReproducedBitwise);
  }
  SECTION("the keyframe's own step") {
    auto bundle = withoutStep(recorded, 8, dir.file("lost8.ccap"));
    auto r = replayWide(bundle);
    CHECK(r.verdict == replayer::Verdict::RecordingIncomplete);
    CHECK(r.lostSteps == std::vector<int64_t>{8});
    CHECK(r.steps.empty());
  }
  SECTION("the steps still queued when the process was killed") {
    // SIGKILLed in step 10 with steps 7..10 in the writer's queue: all four are named lost, and
    // the replay ends at step 6, the last held, before any of them.
    auto bundle = killedWithQueue(recorded, 6, 10, dir.file("killed.ccap"));
    auto reader = formats::BundleReader::open(bundle);
    CHECK(formats::lostSteps(formats::readRecords(*reader)) == std::vector<int64_t>{7, 8, 9, 10});
    auto r = replayWide(bundle);
    CHECK(r.step == 6);
    CHECK(r.verdict == replayer::Verdict::ReproducedBitwise);
    auto inspect = test::run({test::binPath("crashcap"), "inspect", bundle, "--json"});
    INFO(inspect.err);
    REQUIRE(inspect.exitCode == 0);
    CHECK(nlohmann::json::parse(inspect.out)["steps"]["lost"] == nlohmann::json::array({7, 8, 9, 10}));
    // A run of lost steps reads as a range.
    auto text = test::run({test::binPath("crashcap"), "inspect", bundle});
    CHECK(text.out.find("lost       steps 7..10: their records are not in the bundle") != std::string::npos);
  }
  SECTION("the failing step itself") {
    auto bundle = withoutStep(recorded, 10, dir.file("lost10.ccap"));
    auto r = replayWide(bundle, 10);
    CHECK(r.verdict == replayer::Verdict::RecordingIncomplete);
    CHECK(r.lostSteps == std::vector<int64_t>{10});
  }
}

TEST_CASE("replay, bisect and triage of a TorchScript recording say which step was lost", "[replayer][lost][cli]") {
  test::TempDir dir;
  auto run = test::run({test::binPath("crashcap-sample-cls"), "--steps", "12", "--record", dir.path(), "--fault",
                        "nan-sample", "--fault-step", "9", "--fault-row", "2", "--keyframe-every", "4"},
                       300);
  INFO(run.out << run.err);
  REQUIRE(run.exitCode == 1);
  auto bundles = test::bundlesIn(dir.path());
  REQUIRE(bundles.size() == 1);
  auto bundle = withoutStep(bundles[0], 7, dir.file("lost7.ccap"));  // keyframes 0, 4, 8: the window is 8..9
  const std::string crashcap = test::binPath("crashcap");

  // Step 9 replays from keyframe 8: the lost step 7 is outside its window.
  auto replay = test::run({crashcap, "replay", bundle, "--json"}, 300);
  INFO(replay.err);
  REQUIRE(replay.exitCode == 0);
  auto j = nlohmann::json::parse(replay.out);
  CHECK(j["verdict"] == "reproduced-bitwise");
  CHECK(j["lost_steps"].empty());

  // Step 7 itself, and step 8 from keyframe 4 through it.
  auto lostTarget = nlohmann::json::parse(test::run({crashcap, "replay", bundle, "--step", "7", "--json"}, 300).out);
  CHECK(lostTarget["verdict"] == "recording-incomplete");
  CHECK(lostTarget["lost_steps"] == nlohmann::json::array({7}));
  // Keyframe 8 is the newest at or before step 8, so the window holds no lost step.
  CHECK(nlohmann::json::parse(test::run({crashcap, "replay", bundle, "--step", "8", "--json"}, 300).out)["verdict"] ==
        "reproduced-bitwise");

  auto text = test::run({crashcap, "replay", bundle, "--step", "7"}, 300);
  CHECK(text.out.find("verdict  recording-incomplete") != std::string::npos);
  CHECK(text.out.find("the recording lost step 7 of the replay window (keyframe 4 to step 7)") != std::string::npos);
  CHECK(text.out.find("diverged") == std::string::npos);

  auto samples = test::run({crashcap, "bisect", "samples", bundle, "--step", "7", "--json"}, 300);
  INFO(samples.err);
  REQUIRE(samples.exitCode == 0);
  auto s = nlohmann::json::parse(samples.out);
  CHECK(s["lost_steps"] == nlohmann::json::array({7}));
  CHECK(s["replays"] == 0);
}
