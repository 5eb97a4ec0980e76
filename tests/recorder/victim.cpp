// crashcap-test-victim: a small real LibTorch training loop (a TorchScript MLP, SGD) under
// the Recorder that fails on demand, for the crash-safety tests:
//   --fail none|abort|segv|kill|terminate|exception|uncaught|nonfinite|busy   at --fail-step S
//   --fail setup   throws before the first step (no segment exists yet)
//   --fail start   SIGKILLs itself right after creating the Recorder, before it is given
//                  anything (the writer thread has had no job to write)
// "exception" is caught in main and passed to Recorder::fail; "uncaught" leaves main;
// "busy" never fails and runs until killed (SIGKILL tests). --report prints
// "written N" after each step: the newest step the recorder has handed to the OS. --collective
// opens, after each step's backward, the user-scope RecordFunction a torch.distributed backend
// opens for a collective ("gloo:all_reduce"), with nothing behind it: there is no peer here.
// --stack-dump text|faulty sets the interpreter stack dump a fatal signal runs (as the Python
// module does): "text" writes two frames in CPython's format, "faulty" faults inside the dump.
#include <ATen/record_function.h>
#include <torch/script.h>
#include <torch/torch.h>

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>

#include "crashcap/recorder/recorder.hpp"
#include "crashcap/recorder/signal_context.hpp"

namespace {

torch::jit::Module makeProgram() {
  torch::jit::Module m("Victim");
  torch::manual_seed(1);
  m.register_parameter("w1", (torch::randn({16, 32}) * 0.2).requires_grad_(), false);
  m.register_parameter("b1", torch::zeros({32}).requires_grad_(), false);
  m.register_parameter("w2", (torch::randn({32, 4}) * 0.2).requires_grad_(), false);
  m.register_parameter("b2", torch::zeros({4}).requires_grad_(), false);
  m.define(R"(
    def forward(self, x, y):
        h = torch.relu(torch.matmul(x, self.w1) + self.b1)
        logits = torch.matmul(h, self.w2) + self.b2
        return torch.cross_entropy_loss(logits, y, None, 1, -100, 0.0)
  )");
  m.train();
  return m;
}

/// Two frames as CPython's dump writes them, most recent call first: a library's, then the program's.
void dumpTwoFrames(int fd) {
  const char text[] =
      "Stack (most recent call first):\n"
      "  File \"/usr/lib/python3.11/ctypes/__init__.py\", line 519 in string_at\n"
      "  File \"/work/train.py\", line 12 in <module>\n";
  ssize_t ignored = ::write(fd, text, sizeof(text) - 1);
  (void)ignored;
}

/// A dump that faults, as CPython's may on a damaged interpreter.
void dumpThatFaults(int fd) {
  dumpTwoFrames(fd);
  volatile int* nowhere = nullptr;
  *nowhere = 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, fail = "none";
  int64_t steps = 20, failStep = 5, keyframeEvery = 5, sleepMs = 0;
  size_t retain = 0;
  bool report = false, recordGrads = true, collective = false, closeUnsynced = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--dir") dir = next();
    else if (a == "--fail") fail = next();
    else if (a == "--fail-step") failStep = std::stoll(next());
    else if (a == "--steps") steps = std::stoll(next());
    else if (a == "--keyframe-every") keyframeEvery = std::stoll(next());
    else if (a == "--retain") retain = std::stoul(next());
    else if (a == "--sleep-ms") sleepMs = std::stoll(next());
    else if (a == "--report") report = true;
    else if (a == "--collective") collective = true;
    else if (a == "--close-unsynced") closeUnsynced = true;  // close(durable=false)
    else if (a == "--stack-dump") {
      const auto how = next();
      crashcap::recorder::setSignalContextDump(how == "faulty" ? &dumpThatFaults : &dumpTwoFrames);
    }
    else if (a == "--api-key") (void)next();  // accepted and ignored: the secrets test passes one
    else {
      std::cerr << "usage: crashcap-test-victim --dir DIR [--fail KIND] [--fail-step S] [--steps N] "
                   "[--keyframe-every K] [--retain N] [--sleep-ms MS] [--report] [--collective]\n";
      return 2;
    }
  }
  (void)recordGrads;
  torch::set_num_threads(1);
  crashcap::recorder::Policy policy;
  policy.keyframeEvery = keyframeEvery;
  policy.retainSegments = retain;
  policy.crashDrainSeconds = 20;
  crashcap::recorder::Recorder recorder(dir, policy);
  if (fail == "start") std::raise(SIGKILL);
  auto program = makeProgram();
  recorder.setProgram(program, {"x", "y"});
  std::vector<at::Tensor> params;
  for (const auto& p : program.parameters()) params.push_back(p);
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  recorder.setOptimizer(optimizer);
  try {
    if (fail == "setup") throw std::runtime_error("victim: data loader failed before the first step");
    for (int64_t step = 0; fail == "busy" || step < steps; ++step) {
      auto x = torch::randn({8, 16});
      auto y = torch::randint(0, 4, {8}, torch::kInt64);
      if (fail == "nonfinite" && step == failStep) x[3][2] = std::nan("");
      auto guard = recorder.beginStep(step, {{"x", x}, {"y", y}});
      optimizer.zero_grad();
      auto loss = program.forward({x, y}).toTensor();
      if (step == failStep) {
        if (fail == "abort") std::abort();
        if (fail == "segv") std::raise(SIGSEGV);
        if (fail == "kill") std::raise(SIGKILL);
        if (fail == "terminate") std::terminate();
        if (fail == "exception" || fail == "uncaught")
          throw std::runtime_error("victim: injected failure at step " + std::to_string(step));
      }
      loss.backward();
      if (collective) {
        RECORD_USER_SCOPE("gloo:all_reduce");
      }
      guard.end(loss);
      optimizer.step();
      if (report) {
        std::printf("written %lld\n", static_cast<long long>(recorder.stats().writtenThrough));
        std::fflush(stdout);
      }
      if (sleepMs) std::this_thread::sleep_for(std::chrono::milliseconds(sleepMs));
    }
  } catch (const std::exception& e) {
    if (fail == "uncaught") throw;
    std::cerr << "victim: training failed: " << e.what() << "\n";
    auto bundle = recorder.fail(e);
    std::cerr << "victim: bundle " << bundle << "\n";
    return 1;
  }
  recorder.close(/*durable=*/!closeUnsynced);
  auto s = recorder.stats();
  std::printf("done: %llu steps, %llu dropped\n", (unsigned long long)s.stepsBegun,
              (unsigned long long)s.droppedRecords);
  return 0;
}
