// crashcap-bench-record: what the flight recorder costs a training step. Runs the same
// sample training three ways, interleaved round by round so machine noise hits all alike:
//   baseline  — no recorder
//   recorded  — the Recorder with its default policy (keyframes, op ring, fingerprints)
//   anomaly   — no recorder, autograd anomaly detection on (the reference users know)
// Each run's step time is its median step (the first steps, warm-up, excluded); each ratio is
// per round, and the reported ratio is the median over rounds with its min and max.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <unistd.h>

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
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") json = true;
    else if (a == "--rounds" && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
    else if (a == "--steps" && i + 1 < argc) steps = std::max<int64_t>(10, std::atoll(argv[++i]));
    else if (a == "--task" && i + 1 < argc) task = std::string(argv[++i]) == "cls" ? Task::Cls : Task::Seg;
    else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: crashcap-bench-record [--json] [--rounds N] [--steps N] [--task seg|cls] [--threads T]\n");
      return 2;
    }
  }
  auto scratch = std::filesystem::temp_directory_path() / ("crashcap-bench-record-" + std::to_string(::getpid()));
  const size_t warmup = 3;
  std::vector<double> base, rec, anom, overhead, anomaly, callMs;
  uint64_t dropped = 0;
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
      if (which == 1) dropped += result.recorderStats.droppedRecords;
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
  std::error_code ec;
  std::filesystem::remove_all(scratch, ec);
  auto mm = [](const std::vector<double>& v) {
    return nlohmann::json{{"min", *std::min_element(v.begin(), v.end())},
                          {"max", *std::max_element(v.begin(), v.end())}};
  };
  nlohmann::json j = {{"task", task == Task::Seg ? "seg" : "cls"},
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
  if (json) {
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("baseline %.2f ms/step, recorded %.2f ms/step: overhead x%.4f (spread %.4f..%.4f); anomaly mode x%.3f\n"
                "recorder calls on the training thread: %.3f ms/step (%.2f%%)\n",
                median(base), median(rec), median(overhead), j["overhead_ratio_spread"]["min"].get<double>(),
                j["overhead_ratio_spread"]["max"].get<double>(), median(anomaly), median(callMs),
                100 * median(callMs) / median(rec));
  }
  return 0;
}
