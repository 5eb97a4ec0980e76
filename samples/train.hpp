#pragma once
// The sample trainings, as a library: the seg and cls sample binaries, the benchmarks and the
// end-to-end tests run the same loop. The loop uses the public Recorder API exactly as a
// user's training would: beginStep before the forward, end(loss) after backward, fail(e) in
// the handler.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "crashcap/recorder/recorder.hpp"
#include "models.hpp"

namespace crashcap::samples {

/// Seg and Cls: the two small samples; Wide: a wide MLP (makeWideModel) whose state is as large as
/// wideWidth and wideLayers make it.
enum class Task { Seg, Cls, Wide };

struct TrainOptions {
  Task task = Task::Seg;
  int64_t steps = 30;
  std::string recordDir;           ///< empty: no recorder
  FaultPlan fault;
  uint64_t seed = 0;
  int64_t batch = 0;               ///< 0: the task's default (8 seg, 32 cls, 16 wide)
  int64_t wideWidth = 4096;        ///< Task::Wide: the layers' width
  int64_t wideLayers = 6;          ///< Task::Wide: how many layers
  std::string optimizer = "sgd";   ///< "sgd" | "adam"
  int threads = 0;                 ///< 0: LibTorch's default
  bool jitOptimize = false;        ///< leave TorchScript's graph executor optimising (LibTorch's default)
  /// Settings applied before training (formats/torch/settings.hpp names), e.g.
  /// {"cudnn.benchmark", "true"}: the recording carries them, replay applies them again.
  std::vector<std::pair<std::string, std::string>> settings;
  bool anomalyMode = false;        ///< torch autograd anomaly detection (the reference overhead)
  recorder::Policy policy;         ///< used when recordDir is set
  int printEvery = 10;             ///< progress lines; 0 = silent
  /// Called after each completed step with the recorder (null without one): a benchmark's probe.
  std::function<void(int64_t step, const recorder::Recorder* recorder)> afterStep;
};

struct TrainResult {
  bool failed = false;
  int64_t failedStep = -1;
  std::string error;
  std::string bundle;                   ///< the crash bundle the recorder sealed
  std::vector<double> losses;           ///< per completed step
  std::vector<double> stepSeconds;      ///< wall time of each step (batch generation excluded)
  std::vector<double> recorderSeconds;  ///< of which inside beginStep and end(loss)
  recorder::RecorderStats recorderStats;
};

/// Runs the training; never throws for a training failure (it is the result).
TrainResult train(const TrainOptions& options);

/// The sample binaries' main: parses the flags (see --help), runs, prints; 0 ok, 1 the
/// training failed, 2 bad usage.
int sampleMain(Task task, int argc, char** argv);

}  // namespace crashcap::samples
