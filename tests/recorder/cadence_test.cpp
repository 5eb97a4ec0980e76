// The keyframe cadence. With keyframeEvery left at auto, the recorder spaces keyframes so that
// what they cost (the copy on the training thread, the writer's time on one core) stays under
// Policy::keyframeBudget of the step time, never closer than kAutoKeyframeEveryMin steps, and
// two segments fit in retainBytes. A keyframe is what the cadence skips, never a step.
// LibTorch first: glog's CHECK must not replace Catch's.
#include <torch/torch.h>
#undef CHECK
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/recorder/recorder.hpp"
#include "test_support.hpp"

using namespace crashcap;

namespace {

/// Weights of `bytes` as one module, with Adam's two moments over them (a keyframe holds three
/// times the weights).
struct State {
  std::shared_ptr<torch::nn::Module> model = std::make_shared<torch::nn::Module>();
  std::unique_ptr<torch::optim::Adam> adam;
  explicit State(int64_t bytes) {
    model->register_parameter("w", torch::randn({bytes / 4}) * 0.02);
    adam = std::make_unique<torch::optim::Adam>(model->parameters(), torch::optim::AdamOptions(1e-4));
    for (auto& p : model->parameters()) p.mutable_grad() = torch::randn_like(p) * 1e-3;
    adam->step();
  }
};

/// Records `steps` steps whose compute is a sleep of `stepMs`; the recorder's stats at the end.
recorder::RecorderStats record(const std::string& dir, recorder::Policy policy, State& state, int64_t steps,
                               double stepMs) {
  policy.quiet = true;
  policy.crashGuard = false;
  policy.kernelTrace = false;
  recorder::Recorder rec(dir, policy);
  rec.setModel(*state.model);
  rec.setOptimizer(*state.adam);
  const auto batch = torch::randn({4, 8});
  for (int64_t step = 0; step < steps; ++step) {
    auto guard = rec.beginStep(step, {{"x", batch}});
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(stepMs));
    guard.end(torch::tensor(1.0));
  }
  auto stats = rec.stats();
  rec.close();
  return stats;
}

}  // namespace

TEST_CASE("a small model on slow steps keeps the floor: a keyframe every 50 steps", "[recorder][cadence]") {
  test::TempDir dir;
  State state(4 << 10);
  auto stats = record(dir.path(), recorder::Policy{}, state, 55, 60);
  CHECK(stats.keyframeInterval == recorder::Policy::kAutoKeyframeEveryMin);
  CHECK(stats.keyframes == 2);  // steps 0 and 50
  CHECK(stats.lostStepCount == 0);
  CHECK(stats.keyframeCopySeconds > 0);
}

TEST_CASE("a keyframe that costs more than the budget allows comes less often, and every step is kept",
          "[recorder][cadence]") {
  test::TempDir dir;
  State state(32 << 20);  // a keyframe of 96 MiB: its copy alone is milliseconds, the step 2 ms
  auto stats = record(dir.path(), recorder::Policy{}, state, 200, 2);
  INFO("copy " << stats.keyframeCopySeconds << " s, write " << stats.keyframeWriteSeconds << " s, step "
               << stats.stepSeconds << " s, interval " << stats.keyframeInterval);
  REQUIRE(stats.stepSeconds > 0);
  REQUIRE(stats.keyframeCopySeconds > 0);
  // The rule's lower bound: the copy spread over the interval is at most the budget of a step.
  CHECK(stats.keyframeInterval >= std::floor(stats.keyframeCopySeconds / (0.01 * stats.stepSeconds)));
  CHECK(stats.keyframeInterval > recorder::Policy::kAutoKeyframeEveryMin);
  CHECK(stats.keyframes == 1);  // step 0: the next is due beyond step 200
  CHECK(stats.lostStepCount == 0);
  CHECK(stats.stepsBegun == 200);

  // A fixed cadence is kept as given, and stats still say what auto would choose.
  test::TempDir fixedDir;
  recorder::Policy fixed;
  fixed.keyframeEvery = 40;
  auto f = record(fixedDir.path(), fixed, state, 200, 2);
  CHECK(f.keyframeInterval == 40);
  CHECK(f.keyframes + f.keyframesSkipped >= 5);
  CHECK(f.autoKeyframeInterval > recorder::Policy::kAutoKeyframeEveryMin);
  CHECK(f.lostStepCount == 0);
}

TEST_CASE("two segments must fit in retainBytes: the interval shrinks to fit and says so once", "[recorder][cadence]") {
  State state(8 << 20);  // a keyframe of 24 MiB
  test::TempDir freeDir, boundDir;
  recorder::Policy unbounded;
  unbounded.retainBytes = 0;
  auto free = record(freeDir.path(), unbounded, state, 120, 20);
  // Room for a keyframe and 256 KiB of steps (a step's records are a few KiB: its generator
  // states), twice.
  recorder::Policy bounded;
  bounded.retainBytes = 2 * ((24ull << 20) + (256ull << 10));
  auto bound = record(boundDir.path(), bounded, state, 120, 20);
  INFO("interval " << bound.keyframeInterval << " (without the bound " << free.keyframeInterval << "), write "
                   << bound.keyframeWriteSeconds << " s");
  CHECK(bound.keyframeInterval < free.keyframeInterval);
  CHECK(bound.keyframes >= 2);
  CHECK(bound.lostStepCount == 0);
  int said = 0;
  for (const auto& w : bound.warnings) said += w.find("retainBytes") != std::string::npos;
  CHECK(said == 1);
  for (const auto& w : free.warnings) CHECK(w.find("retainBytes") == std::string::npos);
}

TEST_CASE("a cadence or budget that means nothing is refused", "[recorder][cadence]") {
  test::TempDir dir;
  recorder::Policy every;
  every.keyframeEvery = -3;
  CHECK_THROWS_AS(recorder::Recorder(dir.path(), every), crashcap::Error);
  recorder::Policy budget;
  budget.keyframeBudget = 0;
  CHECK_THROWS_AS(recorder::Recorder(dir.path(), budget), crashcap::Error);
  budget.keyframeBudget = 1.5;
  CHECK_THROWS_AS(recorder::Recorder(dir.path(), budget), crashcap::Error);
}

TEST_CASE("a keyframe due while keyframes are held (between two updates of gradient accumulation) waits for the "
          "first step after the hold",
          "[recorder][cadence]") {
  test::TempDir dir;
  State state(4 << 10);
  recorder::Policy policy;
  policy.keyframeEvery = 3;
  policy.quiet = true;
  policy.crashGuard = false;
  policy.kernelTrace = false;
  recorder::Recorder rec(dir.path(), policy);
  rec.setModel(*state.model);
  rec.setOptimizer(*state.adam);
  const auto batch = torch::randn({4, 8});
  // An update every second step (1, 3, 5, ...): the even steps begin after one, the odd steps
  // between two. Due at 3 (held: it waits), taken at 4; due again at 7 (held), taken at 8.
  for (int64_t step = 0; step < 10; ++step) {
    rec.holdKeyframes(step % 2 == 1);
    auto guard = rec.beginStep(step, {{"x", batch}});
    guard.end(torch::tensor(1.0));
  }
  CHECK(rec.stats().keyframes == 3);  // 0, 4, 8
  auto bundle = rec.fail(std::runtime_error("the end of the test"));
  REQUIRE_FALSE(bundle.empty());
  auto reader = formats::BundleReader::open(bundle);
  for (int64_t step = 0; step < 10; ++step) {
    INFO("step " << step);
    CHECK(bool(reader->find(fmt::format("keyframes/{}/parameters/w", step))) == (step % 4 == 0));
  }
}
