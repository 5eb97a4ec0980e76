// A training with a big state, recorded: a TorchScript step program of eight 4096-wide linear
// layers (512 MiB of weights) on Adam, so one keyframe (weights and both moments) is 1.5 GiB,
// three times the writer's default queue budget. Its batch at --nan-step carries a NaN, so the
// run ends in a crash bundle. On the CPU with one thread it is deterministic: replay must give
// reproduced-bitwise, and the recording must keep every step's records however large the
// keyframes are (tests/bigstate/check.sh checks both). Written as a user would, against the
// public recorder API only.
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <string>

#include "crashcap/recorder/recorder.hpp"

namespace {

constexpr int64_t kWidth = 4096;
constexpr int kLayers = 8;

torch::jit::Module makeModel() {
  torch::jit::Module m("BigMlp");
  std::string forward = "def forward(self, x: Tensor, y: Tensor) -> Tensor:\n    h = x\n";
  for (int i = 0; i < kLayers; ++i) {
    // Scaled so activations neither vanish nor blow up through eight layers.
    m.register_parameter("w" + std::to_string(i), (torch::randn({kWidth, kWidth}) / std::sqrt(double(kWidth))).requires_grad_(),
                         false);
    m.register_parameter("b" + std::to_string(i), torch::zeros({kWidth}).requires_grad_(), false);
    forward += "    h = torch.tanh(torch.addmm(self.b" + std::to_string(i) + ", h, self.w" + std::to_string(i) + "))\n";
  }
  forward += "    return torch.mse_loss(h, y)\n";
  m.define(forward);
  return m;
}

int usage(std::FILE* to) {
  std::fprintf(to,
               "usage: crashcap-bigstate --record DIR [--steps N] [--nan-step S] [--keyframe-every K]\n"
               "A 512 MiB-weight MLP on Adam (CPU, one thread), recorded under crashcap's default policy\n"
               "(or a keyframe every K steps). Exit 1 when the NaN at --nan-step stops it (the bundle is in\n"
               "DIR), 0 when it trained through, 2 on bad usage.\n");
  return to == stdout ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int64_t steps = 30, nanStep = 29, keyframeEvery = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--help" || a == "-h") return usage(stdout);
    if (a == "--record" && (v = next())) dir = v;
    else if (a == "--steps" && (v = next())) steps = std::atoll(v);
    else if (a == "--nan-step" && (v = next())) nanStep = std::atoll(v);
    else if (a == "--keyframe-every" && (v = next())) keyframeEvery = std::atoll(v);
    else return usage(stderr);
  }
  if (dir.empty() || steps < 1) return usage(stderr);

  torch::set_num_threads(1);
  torch::jit::setGraphExecutorOptimize(false);  // as the samples; replay follows the recorded setting
  torch::manual_seed(2026);
  auto model = makeModel();
  std::vector<at::Tensor> params;
  for (const auto& p : model.parameters()) params.push_back(p);
  torch::optim::Adam adam(params, torch::optim::AdamOptions(1e-4));

  crashcap::recorder::Policy policy;  // the default: queueBytes as shipped
  if (keyframeEvery > 0) policy.keyframeEvery = keyframeEvery;
  crashcap::recorder::Recorder rec(dir, policy);
  auto t0 = std::chrono::steady_clock::now();
  rec.setProgram(model, {"x", "y"});
  std::printf("setProgram %.2f s\n", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  rec.setOptimizer(adam);

  int code = 0;
  try {
    for (int64_t step = 0; step < steps; ++step) {
      auto x = torch::randn({32, kWidth});
      auto y = torch::rand({32, kWidth}) * 2 - 1;
      if (step == nanStep) x[5][17] = std::nan("");
      auto s0 = std::chrono::steady_clock::now();
      auto guard = rec.beginStep(step, {{"x", x}, {"y", y}});
      double inBegin = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
      adam.zero_grad();
      auto loss = model.forward({x, y}).toTensor();
      loss.backward();
      guard.end(loss);
      adam.step();
      std::printf("step %3lld  loss %.6f  %.2f s (beginStep %.2f s)\n", static_cast<long long>(step),
                  loss.item<double>(), std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count(),
                  inBegin);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    std::printf("crash bundle %s\n", rec.fail(e).c_str());
    code = 1;
  }
  rec.close();
  auto s = rec.stats();
  std::printf("keyframes %llu  skipped %llu  lost steps %llu  dropped records %llu\n",
              static_cast<unsigned long long>(s.keyframes), static_cast<unsigned long long>(s.keyframesSkipped),
              static_cast<unsigned long long>(s.lostStepCount), static_cast<unsigned long long>(s.droppedRecords));
  return code;
}
