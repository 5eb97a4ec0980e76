// A data-parallel LibTorch training on c10d's ProcessGroupGloo, without Python: one rank of a
// job that a launcher started (crashcap run --nproc N sets RANK, WORLD_SIZE, MASTER_ADDR and
// MASTER_PORT, as torchrun does). The ranks meet in a TCPStore on MASTER_ADDR:MASTER_PORT (rank 0
// serves it), rank 0's initial weights are broadcast to the others, and each parameter's gradient
// is averaged over the ranks by an all-reduce in a hook on that parameter, so that the gradient
// is reduced wherever backward runs: in the training loop and in crashcap's replay of its steps
// (setModel + setStep). Each rank trains on its own share of a shuffled dataset, as
// torch.utils.data.DistributedSampler deals it, and records the dataset index of every row.
//
//   crashcap-test-ddp-gloo --record DIR [--steps N] [--fail-rank R] [--fail-step S]
//                          [--fail-how nan|kill|raise] [--fail-row W] [--keyframe-every K]
//
// The model is an MLP with dropout (each rank's generator differs), the loss binary
// cross-entropy with logits, the optimizer SGD with momentum and weight decay under a step
// schedule. Faults at --fail-step on --fail-rank: nan (a NaN in row --fail-row of that rank's
// batch at that step; it prints the row's dataset index), kill (SIGKILL to itself after the forward), raise (an
// exception after the forward).
//
// Exit status: 0 trained; 1 the training failed and the crash bundle was sealed; 2 bad usage.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "crashcap/formats/records.hpp"
#include "crashcap/recorder/recorder.hpp"

using namespace crashcap;

namespace {

struct Options {
  std::string record, failHow = "nan";
  int64_t steps = 8, failRank = -1, failStep = 3, failRow = 5, keyframeEvery = 2;
};

constexpr int64_t kSamples = 512, kFeatures = 8, kBatch = 16;

std::string environment(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) throw std::invalid_argument(std::string(name) + " is not set: start the ranks with a launcher "
                                             "(crashcap run --nproc N, torchrun)");
  return v;
}

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(kFeatures, 32));
    drop = register_module("drop", torch::nn::Dropout(0.2));
    fc2 = register_module("fc2", torch::nn::Linear(32, 1));
  }
  torch::Tensor forward(torch::Tensor x) { return fc2(drop(torch::relu(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(Net);

/// The dataset indices rank `rank` of `world` trains on in epoch `epoch`: a permutation seeded
/// by the epoch, dealt round-robin (DistributedSampler's order).
std::vector<int64_t> shareOf(int64_t rank, int64_t world, int64_t epoch) {
  auto g = at::detail::createCPUGenerator(1000 + epoch);
  auto perm = torch::randperm(kSamples, g, torch::kLong);
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < kSamples; i += world) mine.push_back(perm[i].item<int64_t>());
  return mine;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"One rank of a data-parallel LibTorch training on c10d's ProcessGroupGloo. RANK, WORLD_SIZE, "
               "MASTER_ADDR and MASTER_PORT come from its launcher (crashcap run --nproc N, torchrun). Exit status: "
               "0 trained; 1 the training failed and the crash bundle was sealed; 2 bad usage.",
               "crashcap-test-ddp-gloo"};
  app.add_option("--record", o.record, "the recording's directory")->required();
  app.add_option("--steps", o.steps, "steps to train");
  app.add_option("--fail-rank", o.failRank, "the rank that fails (-1: none)");
  app.add_option("--fail-step", o.failStep, "the step it fails at");
  app.add_option("--fail-how", o.failHow, "nan: a NaN in one sample; kill: SIGKILL after the forward; raise: an exception")
      ->check(CLI::IsMember({"nan", "kill", "raise"}));
  app.add_option("--fail-row", o.failRow, "with nan: the batch row that holds the sample");
  app.add_option("--keyframe-every", o.keyframeEvery, "steps between keyframes");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  int rank = 0, world = 1, port = 0;
  std::string host;
  try {
    rank = std::stoi(environment("RANK"));
    world = std::stoi(environment("WORLD_SIZE"));
    host = environment("MASTER_ADDR");
    port = std::stoi(environment("MASTER_PORT"));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "crashcap-test-ddp-gloo: %s\n", e.what());
    return 2;
  }

  if (o.failRow < 0 || o.failRow >= kBatch) {
    std::fprintf(stderr, "crashcap-test-ddp-gloo: --fail-row is a row of a batch of %lld\n",
                 static_cast<long long>(kBatch));
    return 2;
  }
  if (world < 1 || world > kSamples / kBatch || rank < 0 || rank >= world) {
    std::fprintf(stderr, "crashcap-test-ddp-gloo: rank %d of %d: the world is 1..%lld ranks\n", rank, world,
                 static_cast<long long>(kSamples / kBatch));
    return 2;
  }

  // The Recorder first, so that it sees every collective from the first (the broadcast below),
  // and its place in the job before anything can fail.
  recorder::Policy policy;
  policy.keyframeEvery = o.keyframeEvery;
  recorder::Recorder rec(o.record, policy);
  formats::DistributedData identity;
  identity.rank = rank;
  identity.worldSize = world;
  identity.backend = "gloo";
  identity.rendezvous = "tcp://" + host + ":" + std::to_string(port);
  identity.source = "c10d";
  rec.setDistributed(identity);

  int64_t step = -1;
  try {
    // The ranks meet in rank 0's store; Gloo's pairs connect on this machine's loopback (a
    // one-machine job). Collectives wait as long as torch.distributed's default (30 minutes):
    // a peer that died is seen when its connection closes, not by a timeout.
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(port);
    so.isServer = rank == 0;
    so.numWorkers = world;
    so.timeout = std::chrono::seconds(60);
    auto store = c10::make_intrusive<c10d::TCPStore>(host, so);
    auto pgOptions = c10d::ProcessGroupGloo::Options::create(std::chrono::minutes(30));
    pgOptions->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, pgOptions);

    // The same data on every rank.
    torch::manual_seed(0);
    auto x = torch::randn({kSamples, kFeatures});
    auto y = (x.sum(1, /*keepdim=*/true) > 0).to(torch::kFloat);
    const int64_t perEpoch = kSamples / world / kBatch;

    torch::manual_seed(100 + rank);  // each rank's own dropout
    Net net;
    // Rank 0's initial weights on every rank, as DistributedDataParallel broadcasts them.
    for (auto& p : net->parameters()) {
      std::vector<at::Tensor> one{p.detach()};  // a Gloo broadcast's tensors are one tensor's copies
      group->broadcast(one)->wait();
    }
    for (auto& p : net->parameters())
      p.register_hook([group, world](at::Tensor grad) {
        std::vector<at::Tensor> reduced{grad.clone()};
        group->allreduce(reduced)->wait();
        return reduced[0].div_(world);
      });
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-4));
    torch::optim::StepLR schedule(optimizer, /*step_size=*/4, /*gamma=*/0.5);

    // One loss for the loop and for crashcap's replay of its steps.
    auto lossOf = [net](const at::Tensor& xb, const at::Tensor& yb) mutable {
      return torch::binary_cross_entropy_with_logits(net->forward(xb), yb);
    };
    rec.setModel(*net);
    rec.setStep([lossOf](const std::map<std::string, at::Tensor>& b) mutable { return lossOf(b.at("x"), b.at("y")); });
    rec.setOptimizer(optimizer);

    std::vector<int64_t> share;
    for (step = 0; step < o.steps; ++step) {
      if (step % perEpoch == 0) share = shareOf(rank, world, step / perEpoch);
      auto index = torch::tensor(std::vector<int64_t>(share.begin() + (step % perEpoch) * kBatch,
                                                      share.begin() + (step % perEpoch + 1) * kBatch));
      auto xb = x.index_select(0, index), yb = y.index_select(0, index);
      const bool failing = rank == o.failRank && step == o.failStep;
      if (failing && o.failHow == "nan") {
        // A corrupt sample: the one this rank's row --fail-row holds at this step.
        xb[o.failRow][2] = std::nan("");
        std::printf("rank %d: a NaN in dataset sample %lld, row %lld of its batch at step %lld\n", rank,
                    static_cast<long long>(index[o.failRow].item<int64_t>()), static_cast<long long>(o.failRow),
                    static_cast<long long>(step));
      }
      auto guard = rec.beginStep(step, {{"x", xb}, {"y", yb}, {formats::kDatasetIndexName, index}});
      optimizer.zero_grad();
      auto loss = lossOf(xb, yb);
      if (failing && o.failHow == "kill") std::raise(SIGKILL);
      if (failing && o.failHow == "raise")
        throw std::runtime_error("rank " + std::to_string(rank) + " gives up at step " + std::to_string(step));
      loss.backward();
      guard.end(loss);
      optimizer.step();
      schedule.step();
      std::printf("rank %d step %lld loss %.6g\n", rank, static_cast<long long>(step), loss.item<double>());
    }
  } catch (const std::exception& e) {
    std::string bundle = rec.fail(e);
    std::printf("rank %d failed at step %lld: %s\nbundle %s\n", rank, static_cast<long long>(step), e.what(),
                bundle.c_str());
    return 1;
  }
  return 0;
}
