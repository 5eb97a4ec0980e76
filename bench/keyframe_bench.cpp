// crashcap-bench-keyframe: what a keyframe costs as the model grows. For each model state (the
// weights and a real torch::optim::Adam's two moments over them: three times the weights), a
// Recorder with the default policy (but a keyframe every --every steps) records --steps steps of a
// training whose step takes --step-ms (the step's compute is a sleep, so that the writer thread has
// the cores a training would leave it). Measured in the same run:
//   stall      the training thread's time in beginStep on a keyframe step, less its median on the
//              other steps: the keyframe's copy
//   memcpy     a plain memcpy (one thread) of the same bytes into a buffer written before, at the
//              same moment of a step as a keyframe's copy: at the start of a step midway between
//              two keyframes, after the last step's sleep, while the recorder runs. That is the
//              floor the keyframe's copy is held to (the same caches, the same neighbours).
//   warm memcpy the same memcpy three times back to back before the run (its median): the bytes
//              are then in the caches when they fit, which a copy after a step cannot count on;
//              reported beside it (stall_over_warm_memcpy)
//   writer     the bundle writer with the recorder's options (zstd level 1, byte shuffle, 4 MiB
//              chunks, compression threads as the policy says) writing the same tensors
//   zstd       `zstd -1 -T0` on the same bytes in a file (the page cache holds it)
// and the recorder's counters: keyframes taken and skipped, steps lost. JSON: {"sizes": [{state_mb,
// stall_ms, memcpy_ms, stall_over_memcpy, writer_mb_s, zstd_mb_s, write_over_zstd, auto_interval,
// keyframes, keyframes_skipped, keyframes_written_raw, dropped_steps}, ...]}. auto_interval is the interval the
// recorder's automatic cadence chose from the run's own measurements (stats().autoKeyframeInterval:
// the copy, the writer's time, the step time), while the run itself keeps a keyframe every --every
// steps so that the stall is measured on several warm keyframes.
// --keyframe-pool-mb sets Policy::keyframePoolBytes (1: keep nothing for keyframes beyond the
// batches' queueBytes, as the recorder did before it had the bound). --no-raw-when-behind turns
// Policy::rawWhenBehind off (a keyframe the writer falls behind on is still compressed whole).
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/directory.hpp"
#include "crashcap/formats/torch/optimizer.hpp"
#include "crashcap/formats/torch/tensor_bridge.hpp"
#include "crashcap/recorder/recorder.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double msSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Weights of `bytes` in tensors of at most 64 MiB, as a module the recorder can name.
struct Weights : torch::nn::Module {
  explicit Weights(uint64_t bytes) {
    const int64_t perTensor = (64ll << 20) / 4;
    int64_t left = static_cast<int64_t>(bytes / 4);
    for (int i = 0; left > 0; ++i) {
      const int64_t n = std::min(left, perTensor);
      register_parameter(fmt::format("w{}", i), torch::randn({n}) * 0.02);
      left -= n;
    }
  }
};

struct Size {
  double stateMb = 0, stallMs = 0, memcpyMs = 0, memcpyWarmMs = 0, writerMbS = 0, zstdMbS = 0;
  uint64_t keyframes = 0, skipped = 0, writtenRaw = 0, lost = 0;
  int64_t autoInterval = 0;
  double copyS = 0, writeS = 0, stepS = 0;
  unsigned copyThreads = 0;
};

Size measure(uint64_t stateBytes, int64_t steps, int64_t every, double stepMs, uint64_t poolBytes, bool rawWhenBehind,
             const fs::path& scratch) {
  Size out;
  torch::manual_seed(0);
  auto model = std::make_shared<Weights>(stateBytes / 3);
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-4));
  for (auto& p : model->parameters()) p.mutable_grad() = torch::randn_like(p) * 1e-3;
  adam.step();  // a real step: the two moments exist, as in any training past its first step

  // What the keyframe holds, tensor by tensor: weights and the optimizer's state.
  std::vector<at::Tensor> state;
  for (auto& p : model->parameters()) {
    state.push_back(p.detach());
    for (const auto& [key, t] : crashcap::formats::torch::parameterState(adam, p).tensors) state.push_back(t);
  }
  uint64_t bytes = 0;
  for (const auto& t : state) bytes += static_cast<uint64_t>(t.numel()) * t.element_size();
  out.stateMb = bytes / 1e6;

  // The floor: memcpy into memory that was written before (as a reused buffer would be).
  std::vector<char> dst(bytes);
  std::memset(dst.data(), 1, bytes);
  auto plainCopy = [&] {
    auto t0 = Clock::now();
    uint64_t at = 0;
    for (const auto& t : state) {
      const uint64_t n = static_cast<uint64_t>(t.numel()) * t.element_size();
      std::memcpy(dst.data() + at, t.data_ptr(), n);
      at += n;
    }
    return msSince(t0);
  };
  {
    std::vector<double> runs;
    for (int r = 0; r < 3; ++r) runs.push_back(plainCopy());
    out.memcpyWarmMs = median(runs);
  }
  std::vector<double> inStepCopies;

  // The recorder on a training of these weights.
  crashcap::recorder::Policy policy;
  policy.keyframeEvery = every;
  policy.keyframePoolBytes = poolBytes;
  policy.rawWhenBehind = rawWhenBehind;
  policy.kernelTrace = false;
  policy.crashGuard = false;
  policy.quiet = true;
  const fs::path dir = scratch / fmt::format("record-{}", bytes);
  std::vector<double> keyframeCalls, otherCalls;
  {
    crashcap::recorder::Recorder rec(dir.string(), policy);
    rec.setModel(*model);
    rec.setOptimizer(adam);
    const auto batch = torch::randn({32, 64});
    for (int64_t step = 0; step < steps; ++step) {
      if (every >= 2 && step % every == every / 2) inStepCopies.push_back(plainCopy());
      const uint64_t before = rec.stats().keyframes;
      auto t0 = Clock::now();
      auto guard = rec.beginStep(step, {{"x", batch}});
      const double ms = msSince(t0);
      (rec.stats().keyframes > before ? keyframeCalls : otherCalls).push_back(ms);
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(stepMs));
      guard.end(torch::tensor(1.0));
    }
    auto stats = rec.stats();
    out.keyframes = stats.keyframes;
    out.skipped = stats.keyframesSkipped;
    out.writtenRaw = stats.keyframesWrittenRaw;
    out.lost = stats.lostStepCount;
    out.autoInterval = stats.autoKeyframeInterval;
    out.copyS = stats.keyframeCopySeconds;
    out.copyThreads = stats.keyframeCopyThreads;
    out.writeS = stats.keyframeWriteSeconds;
    out.stepS = stats.stepSeconds;
    rec.close();
  }
  crashcap::formats::removeTree(dir);
  // The first keyframe also starts the recording (its files, its first segment): the later ones
  // are the steady cost when there are any.
  std::vector<double> steady(keyframeCalls.size() > 1 ? keyframeCalls.begin() + 1 : keyframeCalls.begin(), keyframeCalls.end());
  out.stallMs = std::max(0.0, median(steady) - median(otherCalls));
  // With a keyframe at every step there is no step between two: the warm copy stands in.
  out.memcpyMs = inStepCopies.empty() ? out.memcpyWarmMs : median(inStepCopies);

  // The writer on the same tensors, with the recorder's options.
  {
    crashcap::formats::WriterOptions wo;
    wo.zstdLevel = policy.zstdLevel;
    wo.compressionThreads = crashcap::recorder::Policy::compressionThreadsFor(policy.compressionThreads, bytes);
    wo.durability.syncOnSeal = false;
    const fs::path file = scratch / "writer.ccap";
    auto writer = crashcap::formats::BundleWriter::create(file.string(), wo);
    auto t0 = Clock::now();
    int i = 0;
    for (const auto& t : state) crashcap::formats::torch::writeTensor(*writer, fmt::format("keyframes/0/state/{}", i++), t);
    writer->seal();
    out.writerMbS = bytes / 1e6 / (msSince(t0) / 1000);
    writer.reset();
    fs::remove(file);
  }
  // zstd -1 -T0 on the same bytes.
  {
    const fs::path raw = scratch / "state.raw";
    {
      std::ofstream f(raw, std::ios::binary);
      for (const auto& t : state)
        f.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * t.element_size()));
    }
    const std::string cmd = fmt::format("zstd -1 -T0 -q -c '{}' > /dev/null", raw.string());
    auto t0 = Clock::now();
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("zstd failed: is the zstd package installed?");
    out.zstdMbS = bytes / 1e6 / (msSince(t0) / 1000);
    fs::remove(raw);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  std::vector<uint64_t> sizesMb = {16, 256, 1024, 4096};
  int64_t steps = 31, every = 5;
  double stepMs = 200;
  uint64_t poolBytes = 0;
  bool rawWhenBehind = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") json = true;
    else if (a == "--sizes" && i + 1 < argc) {
      sizesMb.clear();
      std::string list = argv[++i];
      for (size_t at = 0; at <= list.size();) {
        size_t comma = list.find(',', at);
        if (comma == std::string::npos) comma = list.size();
        sizesMb.push_back(std::stoull(list.substr(at, comma - at)));
        at = comma + 1;
      }
    } else if (a == "--steps" && i + 1 < argc) steps = std::max<int64_t>(2, std::atoll(argv[++i]));
    else if (a == "--every" && i + 1 < argc) every = std::max<int64_t>(1, std::atoll(argv[++i]));
    else if (a == "--step-ms" && i + 1 < argc) stepMs = std::atof(argv[++i]);
    else if (a == "--keyframe-pool-mb" && i + 1 < argc) poolBytes = std::max<uint64_t>(1, std::stoull(argv[++i]) << 20);
    else if (a == "--no-raw-when-behind") rawWhenBehind = false;
    else {
      std::fprintf(stderr,
                   "usage: crashcap-bench-keyframe [--json] [--sizes MB,MB,...] [--steps N] [--every K] [--step-ms MS] "
                   "[--keyframe-pool-mb MB] [--no-raw-when-behind]\n");
      return 2;
    }
  }
  const fs::path scratch = fs::temp_directory_path() / ("crashcap-bench-keyframe-" + std::to_string(::getpid()));
  fs::create_directories(scratch);
  nlohmann::json sizes = nlohmann::json::array();
  try {
    for (uint64_t mb : sizesMb) {
      Size s = measure(mb << 20, steps, every, stepMs, poolBytes, rawWhenBehind, scratch);
      nlohmann::json j = {{"state_mb", s.stateMb},
                          {"stall_ms", s.stallMs},
                          {"memcpy_ms", s.memcpyMs},
                          {"stall_over_memcpy", s.memcpyMs > 0 ? s.stallMs / s.memcpyMs : 0},
                          {"memcpy_warm_ms", s.memcpyWarmMs},
                          {"stall_over_warm_memcpy", s.memcpyWarmMs > 0 ? s.stallMs / s.memcpyWarmMs : 0},
                          {"writer_mb_s", s.writerMbS},
                          {"zstd_mb_s", s.zstdMbS},
                          {"write_over_zstd", s.zstdMbS > 0 ? s.writerMbS / s.zstdMbS : 0},
                          {"auto_interval", s.autoInterval},
                          {"keyframe_copy_ms", 1000 * s.copyS},
                          {"keyframe_copy_threads", s.copyThreads},
                          {"keyframe_write_ms", 1000 * s.writeS},
                          {"measured_step_ms", 1000 * s.stepS},
                          {"keyframe_every", every},
                          {"keyframe_pool_bytes", poolBytes ? nlohmann::json(poolBytes) : nlohmann::json("default")},
                          {"steps", steps},
                          {"step_ms", stepMs},
                          {"keyframes", s.keyframes},
                          {"keyframes_skipped", s.skipped},
                          {"keyframes_written_raw", s.writtenRaw},
                          {"raw_when_behind", rawWhenBehind},
                          {"dropped_steps", s.lost}};
      if (!json)
        std::cerr << fmt::format("{:7.0f} MB  stall {:8.1f} ms  memcpy {:7.1f} ms  x{:.2f}  writer {:6.0f} MB/s  zstd -T0 {:6.0f} "
                                 "MB/s  x{:.2f}  keyframes {} (skipped {}, raw {})  lost steps {}  auto interval {}\n",
                                 s.stateMb, s.stallMs, s.memcpyMs, j["stall_over_memcpy"].get<double>(), s.writerMbS,
                                 s.zstdMbS, j["write_over_zstd"].get<double>(), s.keyframes, s.skipped, s.writtenRaw,
                                 s.lost, s.autoInterval);
      sizes.push_back(std::move(j));
    }
  } catch (const std::exception& e) {
    crashcap::formats::removeTree(scratch);
    std::cerr << "crashcap-bench-keyframe: " << e.what() << "\n";
    return 1;
  }
  crashcap::formats::removeTree(scratch);
  nlohmann::json out = {{"sizes", sizes}, {"cpus", std::thread::hardware_concurrency()}, {"torch_threads", at::get_num_threads()}};
  if (json) std::cout << out.dump(2) << "\n";
  return 0;
}
