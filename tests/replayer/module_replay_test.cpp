// Replay for torch::nn::Module trainings (Recorder::setModel, no TorchScript program): the user
// gives the model and a step function; the engine restores the keyframe into it and reproduces
// the crash bit for bit.
// LibTorch first: glog's CHECK must not replace Catch's.
#include <torch/script.h>
#include <torch/torch.h>
#undef CHECK
#include <catch2/catch.hpp>

#include <filesystem>

#include "crashcap/formats/error.hpp"
#include "crashcap/recorder/recorder.hpp"
#include "crashcap/replayer/replay_module.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace crashcap;

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(12, 16));
    bn = register_module("bn", torch::nn::BatchNorm1d(16));
    drop = register_module("drop", torch::nn::Dropout(0.2));
    fc2 = register_module("fc2", torch::nn::Linear(16, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(drop(torch::relu(bn(fc1(x))))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Net);

torch::Tensor loss(Net& net, const torch::Tensor& x, const torch::Tensor& y) {
  return torch::nn::functional::cross_entropy(net->forward(x), y);
}

/// Trains with the recorder until step 6's batch, whose row 2 holds a NaN, stops it.
std::string recordCrash(const test::TempDir& dir) {
  torch::manual_seed(7);
  Net net;
  torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  recorder::Policy policy;
  policy.keyframeEvery = 4;
  recorder::Recorder rec(dir.path(), policy);
  rec.setModel(*net);  // the module as it comes
  rec.setOptimizer(opt);
  try {
    for (int64_t step = 0; step < 10; ++step) {
      auto x = torch::randn({8, 12});
      auto y = torch::randint(0, 3, {8});
      if (step == 6) x[2][5] = std::nan("");
      auto guard = rec.beginStep(step, {{"x", x}, {"y", y}});
      opt.zero_grad();
      auto l = loss(net, x, y);
      l.backward();
      guard.end(l);
      opt.step();
    }
  } catch (const std::exception& e) {
    return rec.fail(e);
  }
  FAIL("the NaN did not stop the training");
  return "";
}

}  // namespace

TEST_CASE("a setModel recording replays through the user's step function, bit for bit", "[replayer][module]") {
  test::TempDir dir;
  auto bundle = recordCrash(dir);
  REQUIRE(fs::exists(bundle));

  torch::manual_seed(12345);  // other initial weights: the keyframe must replace them
  Net net;
  auto r = replayer::replay(bundle, *net, [&](const std::map<std::string, at::Tensor>& batch) {
    return loss(net, batch.at("x"), batch.at("y"));
  });
  CHECK(r.step == 6);
  CHECK(r.keyframe == 4);
  CHECK(r.verdict == replayer::Verdict::ReproducedBitwise);  // step 4 and 5 equal the recording, dropout included
  CHECK(r.steps.size() == 3);
  REQUIRE(r.firstNonFiniteOp);
  CHECK(r.firstNonFiniteOp->phase == "forward");
  INFO(r.firstNonFiniteOp->name);
  CHECK(r.firstNonFiniteOp->name.find("addmm") != std::string::npos);  // fc1 meets the NaN first

  // The TorchScript entry point says what to do instead of failing obscurely.
  try {
    replayer::replay(bundle);
    FAIL("replayed a recording without a step program");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::Unsupported);
    CHECK(e.hint().find("replay_module.hpp") != std::string::npos);
  }
  auto cli = test::run({test::binPath("crashcap"), "replay", bundle});
  CHECK(cli.exitCode == 2);
  CHECK(cli.err.find("Recorder::setModel") != std::string::npos);
}

TEST_CASE("an error thrown from C++ replays as its message, without LibTorch's backtrace", "[replayer][module]") {
  // c10::Error::what() ends in a C++ backtrace whose frames differ between processes; the
  // recorder keeps the message alone, and replay must compare and show the same.
  auto checkedLoss = [](Net& net, const torch::Tensor& x, const torch::Tensor& y) {
    int64_t top = y.max().item<int64_t>();
    TORCH_CHECK(top < 3, "label ", top, " is out of range for 3 classes");
    return loss(net, x, y);
  };
  test::TempDir dir;
  std::string bundle;
  {
    torch::manual_seed(7);
    Net net;
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05));
    recorder::Policy policy;
    policy.keyframeEvery = 2;
    recorder::Recorder rec(dir.path(), policy);
    rec.setModel(net->named_parameters(), net->named_buffers());
    rec.setOptimizer(opt);
    try {
      for (int64_t step = 0; step < 8; ++step) {
        auto x = torch::randn({8, 12});
        auto y = torch::randint(0, 3, {8});
        if (step == 5) y[4] = 99;
        auto guard = rec.beginStep(step, {{"x", x}, {"y", y}});
        opt.zero_grad();
        auto l = checkedLoss(net, x, y);
        l.backward();
        guard.end(l);
        opt.step();
      }
      FAIL("the bad label did not stop the training");
    } catch (const std::exception& e) {
      bundle = rec.fail(e);
    }
  }
  REQUIRE(fs::exists(bundle));
  Net net;
  auto r = replayer::replay(bundle, *net, [&](const std::map<std::string, at::Tensor>& batch) {
    return checkedLoss(net, batch.at("x"), batch.at("y"));
  });
  CHECK(r.step == 5);
  CHECK(r.error == "label 99 is out of range for 3 classes");
  CHECK(r.error.find("frame #") == std::string::npos);
  CHECK(r.verdict == replayer::Verdict::ReproducedBitwise);
}

TEST_CASE("setModel refuses an optimizer that updates tensors it was not given", "[replayer][module]") {
  test::TempDir dir;
  Net net;
  recorder::Policy policy;
  policy.quiet = true;
  {
    // Copies of the weights: a keyframe would hold tensors the training never updates.
    std::vector<std::pair<std::string, at::Tensor>> copies;
    for (const auto& p : net->named_parameters()) copies.emplace_back(p.key(), p.value().clone());
    torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(1e-3).amsgrad(true));
    recorder::Recorder rec(dir.path(), policy);
    rec.setModel(copies, {});
    try {
      rec.setOptimizer(opt);
      FAIL("setOptimizer accepted an optimizer over other tensors");
    } catch (const crashcap::Error& e) {
      CHECK(e.code() == ErrorCode::InvalidArgument);
      CHECK(std::string(e.what()).find("the optimizer's parameter 0 of group 0 (shape [16,12]) is not among the 6 "
                                       "parameters given to setProgram or setModel") != std::string::npos);
      CHECK(e.hint().find("not copies") != std::string::npos);
    }
  }
  {
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    recorder::Recorder rec(dir.path(), policy);
    CHECK_THROWS_AS(rec.setOptimizer(opt), crashcap::Error);  // no setModel at all
    rec.setModel(*net);
    CHECK_NOTHROW(rec.setOptimizer(opt));
  }
}

TEST_CASE("setStep is refused after the first step, and on a TorchScript program", "[replayer][module]") {
  test::TempDir dir;
  Net net;
  recorder::Policy policy;
  policy.quiet = true;
  auto step = [&](const std::map<std::string, at::Tensor>& b) { return loss(net, b.at("x"), b.at("y")); };
  {
    recorder::Recorder rec(dir.path(), policy);
    rec.setModel(*net);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.1));
    rec.setOptimizer(opt);
    { auto guard = rec.beginStep(0, {{"x", torch::randn({4, 12})}, {"y", torch::zeros({4}, torch::kLong)}}); }
    // A replay of this program would reach its loop before setStep: refused, not recorded as replayable.
    try {
      rec.setStep(step);
      FAIL("setStep after a step was accepted");
    } catch (const crashcap::Error& e) {
      CHECK(e.code() == ErrorCode::InvalidArgument);
      CHECK_THAT(e.what(), Catch::Contains("setStep after step 0 began"));
    }
  }
  {
    torch::jit::Module m("M");
    m.register_parameter("w", torch::ones({2}), false);
    recorder::Recorder rec(dir.path(), policy);
    rec.setProgram(m, {"x"});
    CHECK_THROWS_AS(rec.setStep(step), crashcap::Error);
  }
}
