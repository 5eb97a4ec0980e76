// A training program written the way a crashcap user outside this tree writes one: it knows
// crashcap only through the installed package (find_package(crashcap), crashcap::recorder) and
// docs/RECORDING.md. A regression MLP (linear, layer norm, GELU, MSE) trained with AdamW on
// synthetic data; with --inf-at STEP, row 3 of that step's features holds an Inf, as a corrupt
// record from a data pipeline would. The consumer test installs crashcap, builds this, lets it
// crash, and triages the bundle with the installed `crashcap`. With --module the same regressor is
// a torch::nn::Module recorded with setModel and setStep, which crashcap replays by running this
// program again.
//
//   consumer-train --record DIR [--steps N] [--inf-at STEP] [--module]
#include <torch/script.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "crashcap/recorder/recorder.hpp"

namespace {

torch::jit::Module makeProgram() {
  torch::jit::Module m("Regressor");
  torch::manual_seed(7);
  auto param = [&](const char* name, at::Tensor t) {
    m.register_parameter(name, t.requires_grad_(), /*is_buffer=*/false);
  };
  param("w1", torch::randn({16, 32}) * 0.2);
  param("b1", torch::zeros({32}));
  param("ln_w", torch::ones({32}));
  param("ln_b", torch::zeros({32}));
  param("w2", torch::randn({32, 1}) * 0.2);
  param("b2", torch::zeros({1}));
  // The step program returns the loss: crashcap replays exactly this.
  m.define(R"(
def forward(self, features: Tensor, targets: Tensor) -> Tensor:
    h = torch.matmul(features, self.w1) + self.b1
    h = torch.layer_norm(h, [32], self.ln_w, self.ln_b, 1e-5, False)
    h = torch.gelu(h)
    out = torch.matmul(h, self.w2) + self.b2
    return torch.mse_loss(out, targets, 1)
)");
  return m;
}

struct RegressorImpl : torch::nn::Module {
  RegressorImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(16, 32));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})));
    fc2 = register_module("fc2", torch::nn::Linear(32, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::gelu(norm(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(Regressor);

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  int64_t steps = 24, infAt = -1;
  bool module = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--record") && i + 1 < argc) dir = argv[++i];
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--inf-at") && i + 1 < argc) infAt = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--module")) module = true;
    else {
      std::fprintf(stderr, "usage: consumer-train --record DIR [--steps N] [--inf-at STEP] [--module]\n");
      return 2;
    }
  }
  torch::jit::setGraphExecutorOptimize(false);  // docs/RECORDING.md: bitwise replay
  torch::manual_seed(1);
  auto program = makeProgram();
  Regressor net;
  std::vector<at::Tensor> params;
  if (module)
    params = net->parameters();
  else
    for (const auto& p : program.parameters()) params.push_back(p);
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  auto lossOf = [&](const at::Tensor& features, const at::Tensor& targets) {
    return module ? torch::mse_loss(net->forward(features), targets)
                  : program.forward({features, targets}).toTensor();
  };

  crashcap::recorder::Policy policy;
  policy.keyframeEvery = 4;
  crashcap::recorder::Recorder rec(dir, policy);
  if (module) {
    rec.setModel(*net);
    rec.setStep([&](const std::map<std::string, at::Tensor>& batch) {
      return lossOf(batch.at("features"), batch.at("targets"));
    });
  } else {
    rec.setProgram(program, {"features", "targets"});
  }
  rec.setOptimizer(optimizer);

  const int64_t batch = 16;
  int64_t step = 0;
  try {
    for (; step < steps; ++step) {
      auto features = torch::randn({batch, 16});
      auto targets = features.sum(1, true) * 0.1;
      if (step == infAt) features[3][5] = std::numeric_limits<float>::infinity();
      auto guard = rec.beginStep(step, {{"features", features},
                                        {"targets", targets},
                                        {"index", torch::arange(step * batch, (step + 1) * batch)}});
      optimizer.zero_grad();
      auto loss = lossOf(features, targets);
      loss.backward();
      guard.end(loss);
      optimizer.step();
      std::printf("step %lld loss %.5f\n", static_cast<long long>(step), loss.item<double>());
    }
  } catch (const std::exception& e) {
    std::string bundle = rec.fail(e);
    std::fprintf(stderr, "training failed at step %lld: %s\ncrash bundle: %s\n", static_cast<long long>(step),
                 e.what(), bundle.c_str());
    return 1;
  }
  rec.close();
  return 0;
}
