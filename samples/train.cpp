#include "train.hpp"

#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <stdexcept>

#include "crashcap/formats/records.hpp"
#include "crashcap/recorder/recording_dir.hpp"
#include "crashcap/formats/torch/settings.hpp"
#include "crashcap/testing/fault_injection.hpp"

namespace crashcap::samples {
namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<torch::optim::Optimizer> makeOptimizer(const std::string& kind, std::vector<at::Tensor> params,
                                                       double lr) {
  if (kind == "sgd") return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(lr).momentum(0.9));
  if (kind == "adam") return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(lr));
  throw std::invalid_argument("unknown optimizer '" + kind + "' (expected sgd or adam)");
}

double baseLr(const TrainOptions& o) {
  if (o.optimizer == "adam") return o.task == Task::Wide ? 1e-4 : 1e-3;
  return o.task == Task::Seg ? 0.02 : o.task == Task::Cls ? 0.05 : 0.01;
}

}  // namespace

TrainResult train(const TrainOptions& o) {
  TrainResult result;
  if (o.threads > 0) torch::set_num_threads(o.threads);
  for (const auto& [name, value] : o.settings) formats::torch::applySetting(name, value);
  // Tests only: CRASHCAP_FAULT_INJECT makes a chosen op misbehave under a chosen condition.
  testing::installFaultInjection();
  // The samples run TorchScript's unoptimised graph unless --jit-optimize; the recording keeps
  // the setting and replay follows it either way (docs/REPLAY.md, "TorchScript's graph executor").
  torch::jit::setGraphExecutorOptimize(o.jitOptimize);
  // The global generator feeds the classifier's dropout; seeding it makes the run repeatable
  // and is the state the recorder captures before each step.
  torch::manual_seed(o.seed);
  const int64_t classes = 10;
  const int64_t batchSize = o.batch > 0 ? o.batch : (o.task == Task::Seg ? 8 : o.task == Task::Cls ? 32 : 16);
  SampleModel model = o.task == Task::Seg   ? makeSegModel(o.seed, o.fault.fault == Fault::DiceEps0 ? 0.0 : 1e-6)
                      : o.task == Task::Cls ? makeClsModel(o.seed, classes)
                                            : makeWideModel(o.seed, o.wideWidth, o.wideLayers);
  std::vector<at::Tensor> params;
  for (const auto& p : model.module.parameters()) params.push_back(p);
  const double lr0 = baseLr(o);
  auto optimizer = makeOptimizer(o.optimizer, params, lr0);

  std::optional<recorder::Recorder> rec;
  if (!o.recordDir.empty()) {
    rec.emplace(o.recordDir, o.policy);
    rec->setProgram(model.module, model.inputs);
    rec->setOptimizer(*optimizer);
  }
  std::optional<torch::autograd::DetectAnomalyGuard> anomaly;
  if (o.anomalyMode) anomaly.emplace();

  int64_t step = 0;
  try {
    for (; step < o.steps; ++step) {
      auto batch = o.task == Task::Seg   ? makeSegBatch(o.seed, step, batchSize, o.fault)
                   : o.task == Task::Cls ? makeClsBatch(o.seed, step, batchSize, classes, o.fault)
                                         : makeWideBatch(o.seed, step, batchSize, o.wideWidth, o.fault);
      double lr = learningRate(lr0, step, o.fault);
      testing::setFaultStep(step);
      for (auto& g : optimizer->param_groups()) g.options().set_lr(lr);
      auto t0 = Clock::now();
      std::optional<recorder::StepGuard> guard;
      double inRecorder = 0;
      if (rec) {
        recorder::Batch named;
        for (size_t i = 0; i < batch.size(); ++i) named.emplace_back(model.inputs[i], batch[i]);
        // The procedural dataset's sample ids, as a data loader would hand them out.
        named.emplace_back(formats::kDatasetIndexName, torch::arange(step * batchSize, (step + 1) * batchSize));
        guard.emplace(rec->beginStep(step, named));
        inRecorder += std::chrono::duration<double>(Clock::now() - t0).count();
      }
      optimizer->zero_grad();
      std::vector<c10::IValue> inputs(batch.begin(), batch.end());
      auto loss = model.module.forward(inputs).toTensor();
      loss.backward();
      if (guard) {
        auto t1 = Clock::now();
        guard->end(loss);  // the recorder's non-finite policy stops a NaN step here
        inRecorder += std::chrono::duration<double>(Clock::now() - t1).count();
      } else if (!std::isfinite(loss.item<double>())) {
        // Without a recorder the sample still refuses to train on: a real script's check.
        throw std::runtime_error("loss is " + std::to_string(loss.item<double>()) + " at step " +
                                 std::to_string(step));
      }
      optimizer->step();
      guard.reset();
      result.stepSeconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
      result.recorderSeconds.push_back(inRecorder);
      result.losses.push_back(loss.item<double>());
      if (o.afterStep) o.afterStep(step, rec ? &*rec : nullptr);
      if (o.printEvery > 0 && (step % o.printEvery == 0 || step + 1 == o.steps))
        std::printf("step %4lld  loss %.5f  lr %.3g\n", static_cast<long long>(step), result.losses.back(), lr);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    result.failed = true;
    result.failedStep = step;
    result.error = e.what();
    if (rec) result.bundle = rec->fail(e);
  }
  if (rec) {
    rec->close();
    result.recorderStats = rec->stats();
  }
  return result;
}

int sampleMain(Task task, int argc, char** argv) {
  const char* name = task == Task::Seg ? "crashcap-sample-seg" : "crashcap-sample-cls";
  auto usage = [&](std::FILE* to) {
    std::fprintf(to,
                 "usage: %s [--steps N] [--record DIR] [--fault KIND] [--fault-step S] [--fault-row R]\n"
                 "       [--seed N] [--keyframe-every K] [--batch B] [--optimizer sgd|adam] [--threads T]\n"
                 "       [--jit-optimize]\n"
                 "       [--set SETTING=VALUE]...\n\n"
                 "A small real LibTorch training (%s) that fails for the reasons crashcap exists for.\n"
                 "  --record DIR        record under crashcap's flight recorder (crash bundle lands in DIR;\n"
                 "                      default: $CRASHCAP_DIR, which `crashcap run` sets)\n"
                 "  --fault KIND        none | nan-sample | %s | lr-blowup\n"
                 "  --fault-step S      step whose batch (or learning rate) goes bad (default 5)\n"
                 "  --fault-row R       batch row that carries the fault (default 0)\n"
                 "  --set S=V           a LibTorch setting for the run, e.g. cudnn.benchmark=true\n"
                 "  --jit-optimize      leave TorchScript's graph executor optimising (LibTorch's default)\n"
                 "Exit status: 0 trained; 1 the training failed (the fault worked); 2 bad usage.\n",
                 name,
                 task == Task::Seg ? "a DB-style text segmenter, Dice + BCE + L1 loss"
                                   : "a shape classifier, cross-entropy loss",
                 task == Task::Seg ? "dice-eps0" : "bad-label");
  };
  TrainOptions o;
  o.task = task;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        return argv[++i];
      };
      if (a == "--help" || a == "-h") {
        usage(stdout);
        return 0;
      } else if (a == "--steps") {
        o.steps = std::stoll(value());
      } else if (a == "--record") {
        o.recordDir = value();
      } else if (a == "--fault") {
        o.fault.fault = parseFault(value());
      } else if (a == "--fault-step") {
        o.fault.step = std::stoll(value());
      } else if (a == "--fault-row") {
        o.fault.row = std::stoll(value());
      } else if (a == "--seed") {
        o.seed = std::stoull(value());
      } else if (a == "--keyframe-every") {
        o.policy.keyframeEvery = std::stoll(value());
        if (o.policy.keyframeEvery < 1) throw std::invalid_argument("--keyframe-every must be >= 1");
      } else if (a == "--batch") {
        o.batch = std::stoll(value());
      } else if (a == "--optimizer") {
        o.optimizer = value();
      } else if (a == "--threads") {
        o.threads = std::stoi(value());
      } else if (a == "--jit-optimize") {
        o.jitOptimize = true;
      } else if (a == "--set") {
        auto v = value();
        auto eq = v.find('=');
        if (eq == std::string::npos) throw std::invalid_argument("--set needs SETTING=VALUE, got " + v);
        o.settings.emplace_back(v.substr(0, eq), v.substr(eq + 1));
      } else {
        throw std::invalid_argument("unknown option " + a);
      }
    }
    if (task == Task::Seg && o.fault.fault == Fault::BadLabel)
      throw std::invalid_argument("bad-label needs class labels: use crashcap-sample-cls");
    if (task == Task::Cls && o.fault.fault == Fault::DiceEps0)
      throw std::invalid_argument("dice-eps0 needs the Dice loss: use crashcap-sample-seg");
    if (o.steps < 1) throw std::invalid_argument("--steps must be >= 1");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    usage(stderr);
    return 2;
  }
  // Under `crashcap run` without --record: record where the supervisor says.
  if (o.recordDir.empty())
    if (const char* dir = std::getenv(recorder::kOutputDirVariable)) o.recordDir = dir;
  std::printf("%s: %lld steps, fault %s at step %lld row %lld, %s\n", name, static_cast<long long>(o.steps),
              faultName(o.fault.fault), static_cast<long long>(o.fault.step), static_cast<long long>(o.fault.row),
              o.recordDir.empty() ? "not recorded" : ("recording into " + o.recordDir).c_str());
  TrainResult r;
  try {
    r = train(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 2;
  }
  if (!r.failed) {
    std::printf("%s: trained %lld steps, final loss %.5f\n", name, static_cast<long long>(o.steps),
                r.losses.empty() ? 0.0 : r.losses.back());
    return 0;
  }
  std::string error = r.error;
  // TorchScript tracebacks are long; the last line is the original error.
  if (auto nl = error.find_last_not_of('\n'); nl != std::string::npos) error.resize(nl + 1);
  std::fprintf(stderr, "%s: training failed at step %lld: %s\n", name, static_cast<long long>(r.failedStep),
               error.c_str());
  if (!r.bundle.empty()) std::fprintf(stderr, "%s: crash bundle: %s\nnext: crashcap inspect %s\n", name, r.bundle.c_str(), r.bundle.c_str());
  return 1;
}

}  // namespace crashcap::samples
