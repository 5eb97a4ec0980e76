// Trainings that are not the samples: other models, losses, optimizers and schedules, each
// failing for its own reason. The investigation tests record them and check what replay,
// bisect and triage then say, so that a rule tuned to the samples' models shows up as wrong.
//
//   crashcap-test-trainings --training NAME --record DIR [--steps N] [--fault-step S] [--fault-row R]
//                           [--keyframe-every K] [--jit-optimize] [--first-step S] [--no-step-function]
// --jit-optimize leaves TorchScript's graph executor optimising (LibTorch's default); without it
// the trainings turn it off. The setModel trainings give the Recorder their step function
// (setStep), which lets crashcap replay them from the command line, unless --no-step-function.
//
// pow-overflow   regression MLP with a tanh(h) + h^2 feature layer (TorchScript, so the op runs
//                boxed by the interpreter), MSE, RMSprop; row R of step S's x is 1e20, which
//                overflows aten::pow in float32 but not in float64.
// embedding-oob  token model: embedding, mean pool, linear, BCE on a binary label, Adagrad; row R
//                of step S's tokens holds id 40 of a 32-row table.
// dice-valid0    per-pixel model with a Dice loss over "valid" pixels and no epsilon, Adam; row R of
//                step S has no valid pixel, so its Dice term divides 0 by 0 (a legitimate input
//                the loss cannot handle: every value is in range).
// gaussian-nll   heteroscedastic regression: a Gaussian negative log-likelihood whose variance is
//                the model's raw output clamped at 0, RMSprop; row R of step S has features that
//                drive its variance to 0 (log 0 and a division by 0 on in-range data).
// module-amsgrad a torch::nn::Module MLP (LayerNorm, GELU, dropout) recorded with setModel, AMSGrad
//                Adam, cross-entropy; row R of step S's x holds a NaN.
// module-batchnorm a torch::nn::Module with batch norm (buffers) recorded with setModel's named
//                tensors, momentum SGD with gradient clipping, nll_loss over 5 classes; row R of
//                step S's label is 7, and nll_loss throws.
// warmup-jump    autoencoder on Nesterov SGD with a linear warm-up to 0.01 by step 4, then a
//                schedule bug sets the rate to 100 from step S on; the weights run away.
//
// Exit status: 0 trained; 1 the training failed and the crash bundle was sealed; 2 bad usage.
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "crashcap/formats/records.hpp"
#include "crashcap/recorder/recorder.hpp"

using namespace crashcap;

namespace {

struct Options {
  std::string training, record;
  int64_t steps = 12, faultStep = 6, faultRow = 3, keyframeEvery = 4;
  bool jitOptimize = false;  ///< LibTorch's default is true; replay must hold either way
  bool stepFunction = true;  ///< setModel trainings give the Recorder their step (setStep)
  int64_t firstStep = 0;     ///< a training resumed from a checkpoint starts later
};

struct Training {
  torch::jit::Module module{"Training"};
  std::shared_ptr<torch::nn::Module> model;  ///< set: recorded with setModel, not setProgram
  std::function<at::Tensor(const std::vector<at::Tensor>&)> loss;  ///< set with `model`
  std::vector<std::string> inputs;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::function<std::vector<at::Tensor>(int64_t step)> batch;
  std::function<double(int64_t step)> learningRate;  ///< null: constant
  double clipNorm = 0;  ///< the training clips its gradients' total norm to this (0: no)
  bool namedTensors = false;  ///< setModel(named_parameters(), named_buffers()) instead of setModel(module)
};

std::vector<at::Tensor> parameters(const torch::jit::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p);
  return out;
}

void addParameter(torch::jit::Module& m, const std::string& name, at::Tensor value) {
  m.register_parameter(name, value.requires_grad_(), false);
}

Training powOverflow(const Options& o) {
  Training t;
  addParameter(t.module, "w1", torch::randn({4, 16}) * 0.5);
  addParameter(t.module, "b1", torch::zeros({16}));
  addParameter(t.module, "w2", torch::randn({16, 1}) * 0.25);
  t.module.define(R"(
def forward(self, x: Tensor, y: Tensor) -> Tensor:
    h = torch.matmul(x, self.w1) + self.b1
    f = torch.tanh(h) + torch.pow(h, 2.0)
    out = torch.matmul(f, self.w2)
    return torch.mean((out - y) ** 2)
)");
  t.inputs = {"x", "y"};
  t.optimizer = std::make_unique<torch::optim::RMSprop>(parameters(t.module), torch::optim::RMSpropOptions(1e-3));
  t.batch = [o](int64_t step) {
    auto x = torch::randn({8, 4});
    auto y = torch::randn({8, 1});
    if (step == o.faultStep) x[o.faultRow][1] = 1e20;
    return std::vector<at::Tensor>{x, y};
  };
  return t;
}

Training embeddingOob(const Options& o) {
  Training t;
  addParameter(t.module, "table", torch::randn({32, 8}));
  addParameter(t.module, "w", torch::randn({8, 1}) * 0.3);
  t.module.define(R"(
def forward(self, tokens: Tensor, label: Tensor) -> Tensor:
    e = torch.embedding(self.table, tokens)
    pooled = torch.mean(e, 1)
    logit = torch.matmul(pooled, self.w).squeeze(1)
    return torch.binary_cross_entropy_with_logits(logit, label)
)");
  t.inputs = {"tokens", "label"};
  t.optimizer = std::make_unique<torch::optim::Adagrad>(parameters(t.module), torch::optim::AdagradOptions(0.05));
  t.batch = [o](int64_t step) {
    auto tokens = torch::randint(0, 32, {8, 12});
    auto label = torch::randint(0, 2, {8}).to(torch::kFloat);
    if (step == o.faultStep) {
      tokens[o.faultRow][5] = 40;
      label[o.faultRow] = 0;  // an ordinary binary label on the culprit row: not a finding
    }
    return std::vector<at::Tensor>{tokens, label};
  };
  return t;
}

Training diceValid0(const Options& o) {
  Training t;
  addParameter(t.module, "w", torch::randn({3, 1}) * 0.5);
  addParameter(t.module, "b", torch::zeros({1}));
  t.module.define(R"(
def forward(self, x: Tensor, mask: Tensor, valid: Tensor) -> Tensor:
    prob = torch.sigmoid(torch.matmul(x, self.w).squeeze(2) + self.b)
    inter = torch.sum(prob * mask * valid, 1)
    union = torch.sum(prob * valid, 1) + torch.sum(mask * valid, 1)
    dice = 1.0 - 2.0 * inter / union
    return torch.mean(dice)
)");
  t.inputs = {"x", "mask", "valid"};
  t.optimizer = std::make_unique<torch::optim::Adam>(parameters(t.module), torch::optim::AdamOptions(1e-2));
  t.batch = [o](int64_t step) {
    auto x = torch::randn({8, 20, 3});
    auto mask = (torch::rand({8, 20}) > 0.5).to(torch::kFloat);
    auto valid = (torch::rand({8, 20}) > 0.2).to(torch::kFloat);
    if (step == o.faultStep) valid[o.faultRow].zero_();  // a sample whose pixels are all "don't care"
    return std::vector<at::Tensor>{x, mask, valid};
  };
  return t;
}

Training gaussianNll(const Options& o) {
  Training t;
  addParameter(t.module, "w", torch::randn({6, 2}) * 0.2);
  addParameter(t.module, "b", torch::tensor({0.0, 1.0}));
  t.module.define(R"(
def forward(self, x: Tensor, y: Tensor) -> Tensor:
    out = torch.matmul(x, self.w) + self.b
    mean = out[:, 0]
    var = torch.clamp(out[:, 1], min=0.0)
    return torch.mean(0.5 * torch.log(var) + (y - mean) ** 2 / (2.0 * var))
)");
  t.inputs = {"x", "y"};
  t.optimizer = std::make_unique<torch::optim::RMSprop>(parameters(t.module), torch::optim::RMSpropOptions(1e-3));
  at::Tensor w = t.module.attr("w").toTensor();
  t.batch = [o, w](int64_t step) {
    auto x = torch::randn({8, 6}) * 0.5;
    auto y = torch::randn({8});
    // Features of ordinary size whose signs oppose the variance weights: its variance clamps to 0.
    if (step == o.faultStep) x[o.faultRow] = -1.5 * torch::sign(w.detach().select(1, 1));
    return std::vector<at::Tensor>{x, y};
  };
  return t;
}

Training warmupJump(const Options& o) {
  Training t;
  addParameter(t.module, "enc", torch::randn({16, 4}) * 0.3);
  addParameter(t.module, "dec", torch::randn({4, 16}) * 0.3);
  t.module.define(R"(
def forward(self, x: Tensor) -> Tensor:
    code = torch.tanh(torch.matmul(x, self.enc))
    return torch.mean((torch.matmul(code, self.dec) - x) ** 2)
)");
  t.inputs = {"x"};
  t.optimizer = std::make_unique<torch::optim::SGD>(parameters(t.module),
                                                    torch::optim::SGDOptions(0.002).momentum(0.9).nesterov(true));
  t.batch = [](int64_t) { return std::vector<at::Tensor>{torch::randn({8, 16})}; };
  t.learningRate = [o](int64_t step) { return step >= o.faultStep ? 100.0 : 0.002 * static_cast<double>(std::min<int64_t>(step + 1, 5)); };
  return t;
}

/// A torch::nn::Module training recorded with setModel (no TorchScript program).
struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(10, 32));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({32})));
    drop = register_module("drop", torch::nn::Dropout(0.1));
    fc2 = register_module("fc2", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(drop(torch::gelu(norm(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Mlp);

Training moduleAmsgrad(const Options& o) {
  Training t;
  Mlp net;
  t.model = net.ptr();
  t.inputs = {"x", "y"};
  t.optimizer = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-3).amsgrad(true));
  t.loss = [net](const std::vector<at::Tensor>& b) mutable {
    return torch::nn::functional::cross_entropy(net->forward(b[0]), b[1]);
  };
  t.batch = [o](int64_t step) {
    auto x = torch::randn({8, 10});
    auto y = torch::randint(0, 4, {8});
    if (step == o.faultStep) x[o.faultRow][2] = std::nan("");
    return std::vector<at::Tensor>{x, y};
  };
  return t;
}

/// A torch::nn::Module with batch norm (buffers), recorded with setModel's named tensors, on
/// momentum SGD with gradient clipping; a class label beyond the classes makes nll_loss throw.
struct BnNetImpl : torch::nn::Module {
  BnNetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 5));
  }
  torch::Tensor forward(torch::Tensor x) { return torch::log_softmax(fc2(torch::relu(bn(fc1(x)))), 1); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(BnNet);

Training moduleBatchnorm(const Options& o) {
  Training t;
  BnNet net;
  t.model = net.ptr();
  t.namedTensors = true;
  t.clipNorm = 1.0;
  t.inputs = {"features", "label"};
  t.optimizer = std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  t.loss = [net](const std::vector<at::Tensor>& b) mutable { return torch::nll_loss(net->forward(b[0]), b[1]); };
  t.batch = [o](int64_t step) {
    auto x = torch::randn({12, 6}) * 2 + 1;
    auto y = torch::randint(0, 5, {12});
    if (step == o.faultStep) y[o.faultRow] = 7;
    return std::vector<at::Tensor>{x, y};
  };
  return t;
}

int usage(std::FILE* to, int code) {
  std::fprintf(to,
               "usage: crashcap-test-trainings --training pow-overflow|embedding-oob|dice-valid0|gaussian-nll|\n"
               "       warmup-jump|module-amsgrad|module-batchnorm\n"
               "       --record DIR [--steps N] [--fault-step S] [--fault-row R] [--keyframe-every K] [--jit-optimize]\n"
               "       [--first-step S] [--no-step-function]\n");
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        return argv[++i];
      };
      if (a == "--help" || a == "-h") return usage(stdout, 0);
      if (a == "--training") o.training = value();
      else if (a == "--record") o.record = value();
      else if (a == "--steps") o.steps = std::stoll(value());
      else if (a == "--fault-step") o.faultStep = std::stoll(value());
      else if (a == "--fault-row") o.faultRow = std::stoll(value());
      else if (a == "--keyframe-every") o.keyframeEvery = std::stoll(value());
      else if (a == "--jit-optimize") o.jitOptimize = true;
      else if (a == "--first-step") o.firstStep = std::stoll(value());
      else if (a == "--no-step-function") o.stepFunction = false;
      else throw std::invalid_argument("unknown option " + a);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "crashcap-test-trainings: %s\n", e.what());
    return usage(stderr, 2);
  }
  // A program that no longer gives its step function, for the test of what replay then says.
  if (std::getenv("CRASHCAP_TEST_SKIP_SET_STEP")) o.stepFunction = false;
  torch::jit::setGraphExecutorOptimize(o.jitOptimize);
  torch::manual_seed(7);
  Training t;
  if (o.training == "pow-overflow") t = powOverflow(o);
  else if (o.training == "embedding-oob") t = embeddingOob(o);
  else if (o.training == "dice-valid0") t = diceValid0(o);
  else if (o.training == "warmup-jump") t = warmupJump(o);
  else if (o.training == "gaussian-nll") t = gaussianNll(o);
  else if (o.training == "module-amsgrad") t = moduleAmsgrad(o);
  else if (o.training == "module-batchnorm") t = moduleBatchnorm(o);
  else return usage(stderr, 2);

  recorder::Policy policy;
  policy.keyframeEvery = o.keyframeEvery;
  recorder::Recorder rec(o.record, policy);
  if (t.model) {
    if (t.namedTensors)
      rec.setModel(t.model->named_parameters(), t.model->named_buffers());
    else
      rec.setModel(*t.model);
    if (o.stepFunction)
      rec.setStep([&t](const std::map<std::string, at::Tensor>& b) {
        // The step dies of a signal, for the test of what replay then says (only replays call this).
        if (const char* sig = std::getenv("CRASHCAP_TEST_SIGNAL_IN_STEP")) std::raise(std::atoi(sig));
        std::vector<at::Tensor> batch;
        for (const auto& name : t.inputs) batch.push_back(b.at(name));
        return t.loss(batch);
      });
  } else {
    rec.setProgram(t.module, t.inputs);
    t.loss = [&t](const std::vector<at::Tensor>& b) {
      return t.module.forward(std::vector<c10::IValue>(b.begin(), b.end())).toTensor();
    };
  }
  recorder::Recipe recipe;
  recipe.gradClipNorm = t.clipNorm;
  rec.setOptimizer(*t.optimizer, recipe);
  int64_t step = 0;
  try {
    for (step = o.firstStep; step < o.firstStep + o.steps; ++step) {
      auto batch = t.batch(step);
      if (t.learningRate)
        for (auto& g : t.optimizer->param_groups()) g.options().set_lr(t.learningRate(step));
      recorder::Batch named;
      for (size_t i = 0; i < batch.size(); ++i) named.emplace_back(t.inputs[i], batch[i]);
      named.emplace_back(formats::kDatasetIndexName, torch::arange(step * 100, step * 100 + batch[0].size(0)));
      auto guard = rec.beginStep(step, named);
      t.optimizer->zero_grad();
      auto loss = t.loss(batch);
      loss.backward();
      guard.end(loss);
      if (t.clipNorm > 0) torch::nn::utils::clip_grad_norm_(t.optimizer->parameters(), t.clipNorm);
      t.optimizer->step();
      std::printf("step %lld loss %.6g\n", static_cast<long long>(step), loss.item<double>());
    }
  } catch (const std::exception& e) {
    std::string bundle = rec.fail(e);
    std::printf("failed at step %lld: %s\nbundle %s\n", static_cast<long long>(step), e.what(), bundle.c_str());
    return 1;
  }
  return 0;
}
