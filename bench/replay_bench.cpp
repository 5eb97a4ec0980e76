// crashcap-bench-replay: what reproducing a crash costs. Records a sample training that
// fails at step S (keyframe only at step 0, so replay walks S steps), then replays the bundle
// several times and compares replay time with the recorded step time:
//   target: replay_ms <= load_ms + 1.5 * steps_replayed * recorded_step_ms
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "crashcap/formats/directory.hpp"
#include "crashcap/replayer/replay.hpp"
#include "train.hpp"

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  int rounds = 5;
  int64_t failAt = 40;
  auto task = crashcap::samples::Task::Seg;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") json = true;
    else if (a == "--rounds" && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
    else if (a == "--fail-at" && i + 1 < argc) failAt = std::max(2, std::atoi(argv[++i]));
    else if (a == "--task" && i + 1 < argc) task = std::string(argv[++i]) == "cls" ? crashcap::samples::Task::Cls : crashcap::samples::Task::Seg;
    else {
      std::fprintf(stderr, "usage: crashcap-bench-replay [--json] [--rounds N] [--fail-at STEP] [--task seg|cls]\n");
      return 2;
    }
  }
  auto dir = std::filesystem::temp_directory_path() / ("crashcap-bench-replay-" + std::to_string(::getpid()));
  crashcap::samples::TrainOptions o;
  o.task = task;
  o.steps = failAt + 5;
  o.recordDir = dir.string();
  o.fault = {crashcap::samples::Fault::NanSample, failAt, 1};
  o.policy.keyframeEvery = failAt + 10;  // one keyframe, at step 0
  o.policy.quiet = true;
  o.printEvery = 0;
  auto recorded = crashcap::samples::train(o);
  if (!recorded.failed || recorded.bundle.empty()) {
    std::fprintf(stderr, "bench: the sample did not crash as planned: %s\n", recorded.error.c_str());
    return 1;
  }
  std::vector<double> steps(recorded.stepSeconds.begin() + std::min<size_t>(3, recorded.stepSeconds.size()),
                            recorded.stepSeconds.end());
  double recordedStepMs = 1000 * median(steps);
  std::vector<double> load, replay, plain;
  size_t replayed = 0;
  std::string verdict;
  for (int r = 0; r < rounds; ++r) {
    auto result = crashcap::replayer::replay(recorded.bundle);
    load.push_back(result.loadMs);
    replay.push_back(result.replayMs);
    replayed = result.steps.size();
    crashcap::replayer::ReplayOptions quick;
    quick.instrument = false;  // the same replay without the per-op NaN/Inf checks of the target step
    plain.push_back(crashcap::replayer::replay(recorded.bundle, quick).replayMs);
    verdict = crashcap::replayer::verdictName(result.verdict);
    if (!json)
      std::fprintf(stderr, "round %d: load %.0f ms, replay %.0f ms (%zu steps), %s\n", r + 1, result.loadMs,
                   result.replayMs, replayed, verdict.c_str());
  }
  crashcap::formats::removeTree(dir);
  double loadMs = median(load), replayMs = median(replay);
  double budget = loadMs + 1.5 * replayed * recordedStepMs;
  nlohmann::json j = {{"task", task == crashcap::samples::Task::Seg ? "seg" : "cls"},
                      {"rounds", rounds},
                      {"verdict", verdict},
                      {"steps_replayed", replayed},
                      {"recorded_step_ms", recordedStepMs},
                      {"load_ms", loadMs},
                      {"replay_ms", replayMs},
                      {"budget_ms", budget},
                      {"within_target", replayMs <= budget},
                      {"replay_step_ratio", replayMs / (replayed * recordedStepMs)},
                      {"replay_uninstrumented_ms", median(plain)}};
  if (json)
    std::cout << j.dump(2) << "\n";
  else
    std::printf("replayed %zu steps in %.0f ms (+%.0f ms load); recorded step %.1f ms; budget %.0f ms: %s\n", replayed,
                replayMs, loadMs, recordedStepMs, budget, replayMs <= budget ? "within target" : "OVER target");
  return 0;
}
