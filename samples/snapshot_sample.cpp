// crashcap-sample-snapshot: a tiny real LibTorch training run (a conv net learning to tell
// procedurally drawn horizontal from vertical stripes) that writes what a crash investigation
// needs into a bundle: the model's weights and buffers, the last batch, its loss and
// gradients. Until the recorder exists, this is how the demo gets a
// bundle of real training tensors.
#include <torch/torch.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/torch/tensor_bridge.hpp"
#include "crashcap/recorder/environment.hpp"

namespace {

struct NetImpl : torch::nn::Module {
  torch::nn::Conv2d conv1{torch::nn::Conv2dOptions(1, 8, 3).padding(1)};
  torch::nn::BatchNorm2d bn1{8};
  torch::nn::Conv2d conv2{torch::nn::Conv2dOptions(8, 16, 3).padding(1).stride(2)};
  torch::nn::Linear head{16, 2};
  NetImpl() {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("head", head);
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(bn1(conv1(x)));
    x = torch::relu(conv2(x));
    return head(x.mean({2, 3}));
  }
};
TORCH_MODULE(Net);

/// A batch of 32x32 stripe images: label 0 horizontal, 1 vertical, with noise.
std::pair<torch::Tensor, torch::Tensor> makeBatch(int64_t n) {
  auto labels = torch::randint(0, 2, {n}, torch::kInt64);
  auto coords = torch::arange(32, torch::kFloat32);
  auto freq = torch::rand({n, 1, 1}) * 0.5 + 0.3;
  auto rows = torch::sin(coords.view({1, 32, 1}) * freq).expand({n, 32, 32});
  auto cols = torch::sin(coords.view({1, 1, 32}) * freq).expand({n, 32, 32});
  auto vertical = labels.to(torch::kFloat32).view({n, 1, 1});
  auto images = rows * (1 - vertical) + cols * vertical + 0.1 * torch::randn({n, 32, 32});
  return {images.unsqueeze(1), labels};
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  int steps = 20;
  int seed = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) out = argv[++i];
    else if (a == "--steps" && i + 1 < argc) steps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--seed" && i + 1 < argc) seed = std::atoi(argv[++i]);
    else {
      std::cerr << "usage: crashcap-sample-snapshot --out BUNDLE [--steps N] [--seed S]\n";
      return 2;
    }
  }
  if (out.empty()) {
    std::cerr << "crashcap-sample-snapshot: --out BUNDLE is required\n";
    return 2;
  }
  torch::manual_seed(seed);
  torch::set_num_threads(1);
  Net net;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::Tensor images, labels, loss;
  for (int step = 0; step < steps; ++step) {
    std::tie(images, labels) = makeBatch(16);
    opt.zero_grad();
    loss = torch::cross_entropy_loss(net->forward(images), labels);
    loss.backward();
    opt.step();
    if (step % 5 == 0 || step == steps - 1)
      std::printf("step %3d  loss %.4f\n", step, loss.item<float>());
  }
  try {
    crashcap::formats::WriterOptions options;
    options.producer = "crashcap-sample-snapshot";
    options.overwrite = true;
    auto writer = crashcap::formats::BundleWriter::create(out, options);
    using crashcap::formats::torch::writeTensor;
    for (const auto& p : net->named_parameters()) {
      writeTensor(*writer, "weights/" + p.key(), p.value());
      writeTensor(*writer, "grads/" + p.key(), p.value().grad());
    }
    for (const auto& b : net->named_buffers()) writeTensor(*writer, "buffers/" + b.key(), b.value());
    writeTensor(*writer, "batch/images", images);
    writeTensor(*writer, "batch/labels", labels);
    writeTensor(*writer, "loss", loss.detach());
    writer->writeNote("sample.step", std::to_string(steps - 1));
    auto env = crashcap::recorder::captureEnvironment();
    env.facts.emplace_back("torch.version", TORCH_VERSION);
    env.facts.emplace_back("torch.threads", std::to_string(torch::get_num_threads()));
    writer->writeEnvironment(env);
    writer->seal();
    std::printf("wrote %s (%llu bytes)\n", out.c_str(), (unsigned long long)writer->stats().fileBytes);
  } catch (const crashcap::Error& e) {
    std::cerr << "crashcap-sample-snapshot: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
