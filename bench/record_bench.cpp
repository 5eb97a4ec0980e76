// crashcap-bench-record: what the flight recorder costs a training step. Runs the same
// sample training three ways, interleaved round by round so machine noise hits all alike:
//   baseline  — no recorder
//   recorded  — the Recorder with its default policy (keyframes, op ring, fingerprints)
//   anomaly   — no recorder, autograd anomaly detection on (the reference users know)
// Each run's step time is its median step (the first steps, warm-up, excluded); each ratio is
// per round, and the reported ratio is the median over rounds with its min and max.
//
// Then the large-state case ("large_state" in the JSON; --large-rounds 0 skips it): a wide MLP
// (samples' Task::Wide, 8 layers of 4096: 537 MB of weights, 1.07 GB with SGD's momentum; one
// sample a batch, so that a step stays under a second with Debian's reference BLAS) on one
// LibTorch thread, baseline and recorded with the default policy, interleaved, --large-steps steps each
// (default 200) and a NaN in the batch after them, so the recorded run ends in a crash bundle. Its
// ratio is of the runs' total step time, every step counted (the keyframes' steps included: a
// median would hide them). The last round's bundle is replayed: the crash step from its newest
// keyframe must be reproduced-bitwise.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <unistd.h>

#include "crashcap/formats/directory.hpp"
#include "crashcap/replayer/replay.hpp"
#include "train.hpp"

namespace {

using crashcap::samples::Task;
using crashcap::samples::TrainOptions;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double sum(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s;
}

double medianMs(const std::vector<double>& seconds, size_t warmup) {
  std::vector<double> s(seconds.begin() + std::min(warmup, seconds.size()), seconds.end());
  return 1000 * median(s);
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  int rounds = 15;
  int64_t steps = 20;
  Task task = Task::Seg;
  int threads = 0;
  int largeRounds = 3;
  int64_t largeSteps = 200, largeLayers = 8;
  int largeThreads = 1;
  unsigned largeCompression = crashcap::recorder::Policy::kCompressionThreadsAuto;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") json = true;
    else if (a == "--rounds" && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
    else if (a == "--steps" && i + 1 < argc) steps = std::max<int64_t>(10, std::atoll(argv[++i]));
    else if (a == "--task" && i + 1 < argc) task = std::string(argv[++i]) == "cls" ? Task::Cls : Task::Seg;
    else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--large-rounds" && i + 1 < argc) largeRounds = std::max(0, std::atoi(argv[++i]));
    else if (a == "--large-steps" && i + 1 < argc) largeSteps = std::max<int64_t>(2, std::atoll(argv[++i]));
    else if (a == "--large-layers" && i + 1 < argc) largeLayers = std::max<int64_t>(1, std::atoll(argv[++i]));
    else if (a == "--large-threads" && i + 1 < argc) largeThreads = std::max(1, std::atoi(argv[++i]));
    else if (a == "--large-compression-threads" && i + 1 < argc) largeCompression = std::strtoul(argv[++i], nullptr, 10);
    else {
      std::fprintf(stderr,
                   "usage: crashcap-bench-record [--json] [--rounds N] [--steps N] [--task seg|cls] [--threads T]\n"
                   "                             [--large-rounds N] [--large-steps N] [--large-layers L] [--large-threads T]\n"
                   "                             [--large-compression-threads N] (default: the policy's automatic choice)\n");
      return 2;
    }
  }
  auto scratch = std::filesystem::temp_directory_path() / ("crashcap-bench-record-" + std::to_string(::getpid()));
  const size_t warmup = 3;
  std::vector<double> base, rec, anom, overhead, anomaly, callMs;
  uint64_t dropped = 0, stateBytes = 0;
  for (int r = 0; r < rounds; ++r) {
    // Rotate the order each round so no variant always runs first (cold caches, turbo).
    // Anomaly mode is an order of magnitude slower: measure it every third round, on fewer
    // steps, so the whole benchmark stays in minutes.
    bool withAnomaly = r % 3 == 0;
    std::vector<int> order = {0, 1};
    if (withAnomaly) order.push_back(2);
    std::rotate(order.begin(), order.begin() + (r % order.size()), order.end());
    double b = 0, c = 0, a = 0;
    for (int which : order) {
      TrainOptions o;
      o.task = task;
      o.steps = which == 2 ? std::min<int64_t>(steps, warmup + 6) : steps;
      o.threads = threads;
      o.printEvery = 0;
      if (which == 1) {
        o.recordDir = (scratch / std::to_string(r)).string();
        o.policy.quiet = true;
      }
      o.anomalyMode = which == 2;
      auto result = crashcap::samples::train(o);
      if (result.failed) {
        std::fprintf(stderr, "bench: training failed: %s\n", result.error.c_str());
        return 1;
      }
      double ms = medianMs(result.stepSeconds, warmup);
      if (which == 1) callMs.push_back(medianMs(result.recorderSeconds, warmup));
      (which == 0 ? b : which == 1 ? c : a) = ms;
      if (which == 1) {
        dropped += result.recorderStats.droppedRecords;
        stateBytes = result.recorderStats.keyframeBytes;
      }
    }
    base.push_back(b);
    rec.push_back(c);
    overhead.push_back(c / b);
    if (withAnomaly) {
      anom.push_back(a);
      anomaly.push_back(a / b);
    }
    if (!json)
      std::fprintf(stderr, "round %d: baseline %.2f ms  recorded %.2f ms (x%.3f)%s\n", r + 1, b, c, c / b,
                   withAnomaly ? fmt::format("  anomaly {:.2f} ms (x{:.3f})", a, a / b).c_str() : "");
  }
  auto mm = [](const std::vector<double>& v) {
    return nlohmann::json{{"min", *std::min_element(v.begin(), v.end())},
                          {"max", *std::max_element(v.begin(), v.end())}};
  };
  nlohmann::json j = {{"task", task == Task::Seg ? "seg" : "cls"},
                      {"state_bytes", stateBytes},  // the sample's keyframe: weights, buffers, optimizer state
                      {"steps_per_run", steps},
                      {"rounds", rounds},
                      {"warmup_steps_excluded", warmup},
                      {"baseline_step_ms", median(base)},
                      {"recorded_step_ms", median(rec)},
                      {"anomaly_step_ms", median(anom)},
                      {"overhead_ratio", median(overhead)},
                      {"overhead_ratio_spread", mm(overhead)},
                      {"anomaly_ratio", median(anomaly)},
                      {"anomaly_ratio_spread", mm(anomaly)},
                      {"anomaly_rounds", anomaly.size()},
                      {"torch_threads", threads > 0 ? threads : 0},
                      {"recorded_dropped_records", dropped},
                      // The training thread's own time in beginStep + end(loss): the part of the
                      // cost that is not hidden in noise (the op observer and the writer thread
                      // are not in it).
                      {"recorder_call_ms", median(callMs)},
                      {"recorder_call_fraction", median(callMs) / median(rec)}};
  // The large-state case.
  nlohmann::json large;
  if (largeRounds > 0) {
    const int64_t width = 4096;
    std::vector<double> ratios, baseTotal, recTotal;
    uint64_t largeDropped = 0, largeLost = 0;
    int64_t interval = 0;
    uint64_t keyframes = 0, skipped = 0;
    std::string bundle;
    for (int r = 0; r < largeRounds; ++r) {
      double b = 0, c = 0;
      for (int k = 0; k < 2; ++k) {
        const int which = (k + r) % 2;
        TrainOptions o;
        o.task = Task::Wide;
        o.wideWidth = width;
        o.wideLayers = largeLayers;
        o.optimizer = "sgd";  // with momentum: a state twice the weights
        o.batch = 1;
        o.threads = largeThreads;  // 1: the writer thread has the other core, as a GPU training leaves the CPU to it
        o.steps = largeSteps + 1;
        o.fault.fault = crashcap::samples::Fault::NanSample;
        o.fault.step = largeSteps;
        o.printEvery = 0;
        if (which == 1) {
          o.recordDir = (scratch / fmt::format("large-{}", r)).string();
          o.policy.quiet = true;
          o.policy.compressionThreads = largeCompression;
        }
        auto result = crashcap::samples::train(o);
        if (!result.failed || result.failedStep != largeSteps) {
          std::fprintf(stderr, "bench: the large-state run was to stop at the NaN of step %lld: %s\n",
                       static_cast<long long>(largeSteps), result.failed ? result.error.c_str() : "it trained through");
          return 1;
        }
        const double total = sum(result.stepSeconds);
        if (which == 0) {
          b = total;
        } else {
          c = total;
          const auto& s = result.recorderStats;
          largeDropped += s.droppedRecords;
          largeLost += s.lostStepCount;
          interval = s.keyframeInterval;
          keyframes = s.keyframes;
          skipped = s.keyframesSkipped;
          bundle = result.bundle;
        }
      }
      baseTotal.push_back(b);
      recTotal.push_back(c);
      ratios.push_back(c / b);
      if (!json)
        std::fprintf(stderr, "large round %d: baseline %.1f s  recorded %.1f s (x%.3f) over %lld steps\n", r + 1, b, c,
                     c / b, static_cast<long long>(largeSteps));
    }
    auto replay = crashcap::replayer::replay(bundle);
    const double stateBytes = 2.0 * largeLayers * width * (width + 1) * 4;  // weights and momentum
    large = {{"state_bytes", stateBytes},
             {"model", fmt::format("{} linear layers of {}x{}, SGD with momentum, batch 1, {} LibTorch thread(s)", largeLayers, width, width,
                                  largeThreads)},
             {"steps_per_run", largeSteps},
             {"rounds", largeRounds},
             {"baseline_step_ms", 1000 * median(baseTotal) / largeSteps},
             {"recorded_step_ms", 1000 * median(recTotal) / largeSteps},
             {"overhead_ratio", median(ratios)},
             {"overhead_ratio_spread", mm(ratios)},
             {"dropped_records", largeDropped},
             {"lost_steps", largeLost},
             {"keyframe_interval", interval},
             {"keyframes", keyframes},
             {"keyframes_skipped", skipped},
             {"replay", {{"step", replay.step},
                         {"keyframe", replay.keyframe},
                         {"steps_replayed", replay.steps.size()},
                         {"verdict", crashcap::replayer::verdictName(replay.verdict)}}}};
    j["large_state"] = large;
  }
  crashcap::formats::removeTree(scratch);
  if (json) {
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("baseline %.2f ms/step, recorded %.2f ms/step: overhead x%.4f (spread %.4f..%.4f); anomaly mode x%.3f\n"
                "recorder calls on the training thread: %.3f ms/step (%.2f%%)\n",
                median(base), median(rec), median(overhead), j["overhead_ratio_spread"]["min"].get<double>(),
                j["overhead_ratio_spread"]["max"].get<double>(), median(anomaly), median(callMs),
                100 * median(callMs) / median(rec));
    if (!large.is_null())
      std::printf("large state (%.2f GB): baseline %.1f ms/step, recorded %.1f ms/step: overhead x%.4f (spread %.4f..%.4f); "
                  "a keyframe every %lld steps, %llu dropped records; replay of step %lld from keyframe %lld: %s\n",
                  large["state_bytes"].get<double>() / 1e9, large["baseline_step_ms"].get<double>(),
                  large["recorded_step_ms"].get<double>(), large["overhead_ratio"].get<double>(),
                  large["overhead_ratio_spread"]["min"].get<double>(), large["overhead_ratio_spread"]["max"].get<double>(),
                  static_cast<long long>(large["keyframe_interval"].get<int64_t>()),
                  static_cast<unsigned long long>(large["dropped_records"].get<uint64_t>()),
                  static_cast<long long>(large["replay"]["step"].get<int64_t>()),
                  static_cast<long long>(large["replay"]["keyframe"].get<int64_t>()),
                  large["replay"]["verdict"].get<std::string>().c_str());
  }
  return 0;
}
