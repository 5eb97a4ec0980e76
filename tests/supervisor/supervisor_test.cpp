// `crashcap run`: real child processes — exit codes, fatal signals, the error text of real
// CUDA, cuDNN, NCCL and PyTorch failures, restarts, Ctrl-C and a child that ignores SIGTERM —
// each ending with one sealed, classified bundle per crash.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "crashcap/cupti/trace_file.hpp"
#include "crashcap/cupti/tracer.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/signal_name.hpp"
#include "crashcap/supervisor/classify.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace crashcap;
using nlohmann::json;

namespace {

json inspectJson(const std::string& bundle) {
  auto r = test::run({test::binPath("crashcap"), "inspect", bundle, "--json"});
  INFO(r.err);
  REQUIRE(r.exitCode == 0);
  return json::parse(r.out);
}

bool verifies(const std::string& bundle) {
  return test::run({test::binPath("crashcap"), "verify", bundle}).exitCode == 0;
}

/// A cudaMalloc that failed and that PyTorch's caching allocator recovered from: a soft error.
formats::ApiErrorData recoveredOom() {
  formats::ApiErrorData e;
  e.domain = "runtime";
  e.api = "cudaMalloc";
  e.code = 2;
  e.name = "cudaErrorMemoryAllocation";
  return e;
}

/// `crashcap run --dir DIR ARGS... -- sh -c SCRIPT`.
test::RunResult runShell(const std::string& dir, const std::string& script, std::vector<std::string> args = {}) {
  std::vector<std::string> argv = {test::binPath("crashcap"), "run", "--dir", dir};
  argv.insert(argv.end(), args.begin(), args.end());
  for (const char* a : {"--", "/bin/sh", "-c"}) argv.push_back(a);
  argv.push_back(script);
  return test::run(argv, 300);
}

}  // namespace

TEST_CASE("classification: the earliest GPU error decides, from the messages real failures print", "[run]") {
  using supervisor::classifyExit;
  struct Case {
    const char* stderrText;
    const char* id;
    const char* evidence;
  };
  const std::vector<Case> cases = {
      // an illegal instruction, as PyTorch 2.x prints it
      {"Traceback (most recent call last):\n  File \"train.py\", line 9\n"
       "torch.AcceleratorError: CUDA error: an illegal instruction was encountered\n",
       "cuda-illegal-instruction", "torch.AcceleratorError: CUDA error: an illegal instruction was encountered"},
      // cuDNN failing inside a convolution
      {"RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED\n", "cudnn-execution-failed", "CUDNN_STATUS_EXECUTION_FAILED"},
      // a device-side assert in a long run: the assert first, the illegal instruction at teardown is its consequence
      {"/pytorch/aten/src/ATen/native/cuda/Loss.cu:242: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], "
       "thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed.\n"
       "RuntimeError: CUDA error: device-side assert triggered\n"
       "AcceleratorError: CUDA error: an illegal instruction was encountered\n",
       "cuda-device-assert", "Assertion `t >= 0 && t < n_classes` failed."},
      {"RuntimeError: CUDA error: an illegal memory access was encountered\n", "cuda-illegal-address", "illegal memory access"},
      {"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)\n",
       "cuda-oom", "Tried to allocate 2.00 GiB"},
      {"RuntimeError: CUDA error: unspecified launch failure\n", "cuda-launch-failure", "unspecified launch failure"},
      {"torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1275, "
       "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.14.3\n",
       "nccl-error", "NCCL error in:"},
      // torch/cuda/__init__.py: CUDA touched after a fork
      {"Traceback (most recent call last):\n  File \"/usr/lib/python3/dist-packages/torch/cuda/__init__.py\", line 217, "
       "in _lazy_init\nRuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
       "you must use the 'spawn' start method\n",
       "cuda-forked-subprocess", "Cannot re-initialize CUDA in forked subprocess"},
      // torch/utils/data/dataloader.py: a worker gone (the OOM killer, a crash in native code)
      {"Traceback (most recent call last):\n  File \"train.py\", line 12, in <module>\n"
       "RuntimeError: DataLoader worker (pid(s) 4242) exited unexpectedly\n",
       "dataloader-worker-died", "DataLoader worker (pid(s) 4242) exited unexpectedly"},
      {"crashcap-sample-seg: training failed at step 6: non-finite loss at step 6: nan\n", "nonfinite-loss",
       "non-finite loss at step 6"},
      {"Traceback (most recent call last):\n  File \"train.py\", line 40, in <module>\n    loss.backward()\n"
       "crashcap.NonFiniteError: non-finite gradient norm at step 8: -nan (loss 0.6931)\n",
       "nonfinite-loss", "non-finite gradient norm at step 8"},
      {"Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n    raise ValueError(\"bad config\")\n"
       "ValueError: bad config\n",
       "python-exception", "ValueError: bad config"},
      // torch.multiprocessing.spawn's launcher: its rank's traceback inside its own exception's
      // text, then what the interpreter printed at exit (not the exception)
      {"Traceback (most recent call last):\n  File \"train.py\", line 80, in <module>\n    mp.spawn(run, nprocs=2)\n"
       "torch.multiprocessing.spawn.ProcessRaisedException: \n\n-- Process 1 terminated with the following error:\n"
       "Traceback (most recent call last):\n  File \"train.py\", line 58, in run\n    loss = cross_entropy(model(x), y)\n"
       "IndexError: Target 99 is out of bounds.\n\n"
       "/usr/lib/python3.11/multiprocessing/resource_tracker.py:224: UserWarning: resource_tracker: There appear to be "
       "11 leaked semaphore objects to clean up at shutdown\n",
       "python-exception", "IndexError: Target 99 is out of bounds."},
      // a chained exception: the one raised last is the run's; a traceback Python printed for an
      // exception it ignored (an atexit callback's) is not
      {"Traceback (most recent call last):\n  File \"train.py\", line 5, in load\nKeyError: 'lr'\n\n"
       "The above exception was the direct cause of the following exception:\n\n"
       "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\nValueError: config has no lr\n"
       "Exception ignored in atexit callback: <function flush at 0x7f>\n"
       "Traceback (most recent call last):\n  File \"log.py\", line 2, in flush\nOSError: [Errno 28] No space left\n",
       "python-exception", "ValueError: config has no lr"},
      // torch/_utils.py's ExceptionWrapper: a DataLoader worker's exception, raised again in the
      // main process with the worker's traceback in its text; the worker's line is the evidence
      {"Traceback (most recent call last):\n  File \"train.py\", line 16, in <module>\n    for xb, yb in dl:\n"
       "  File \"/usr/lib/python3/dist-packages/torch/_utils.py\", line 543, in reraise\n    raise exception\n"
       "RuntimeError: Caught RuntimeError in DataLoader worker process 0.\n"
       "Original Traceback (most recent call last):\n"
       "  File \"/usr/lib/python3/dist-packages/torch/utils/data/_utils/worker.py\", line 302, in _worker_loop\n"
       "    data = fetcher.fetch(index)\n"
       "RuntimeError: Trying to resize storage that is not resizable\n\n",
       "python-exception", "RuntimeError: Trying to resize storage that is not resizable (in DataLoader worker process 0)"},
      // the worker's own chained exception: its last, still the worker's
      {"Traceback (most recent call last):\n  File \"train.py\", line 16, in <module>\n"
       "ValueError: Caught ValueError in DataLoader worker process 1.\n"
       "Original Traceback (most recent call last):\n  File \"data.py\", line 8, in __getitem__\n"
       "KeyError: 'label'\n\nDuring handling of the above exception, another exception occurred:\n\n"
       "Traceback (most recent call last):\n  File \"data.py\", line 10, in __getitem__\n"
       "ValueError: record 37 has no label\n",
       "python-exception", "ValueError: record 37 has no label (in DataLoader worker process 1)"},
      {"Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\n"
       "KeyError: Caught KeyError in pin memory thread for device 0.\n"
       "Original Traceback (most recent call last):\n  File \"pin_memory.py\", line 3, in do_one_step\n"
       "KeyError: 'image'\n",
       "python-exception", "KeyError: 'image' (in pin memory thread for device 0)"},
  };
  for (const auto& c : cases) {
    INFO(c.stderrText);
    auto k = classifyExit(1, 0, "", c.stderrText);
    CHECK(k.id == c.id);
    CHECK(k.evidence.find(c.evidence) != std::string::npos);
  }
  CHECK(classifyExit(-1, SIGSEGV, "", "").id == "signal");
  CHECK(classifyExit(-1, SIGSEGV, "", "").evidence == "killed by SIGSEGV");
  CHECK(classifyExit(3, 0, "", "").id == "exit-nonzero");
  CHECK(classifyExit(3, 0, "", "").evidence == "exit status 3");
  CHECK(classifyExit(0, 0, "all good\n", "").id.empty());
  // Found on stdout too (some trainers log errors there).
  CHECK(classifyExit(1, 0, "ERROR: CUDA error: an illegal memory access was encountered\n", "").id == "cuda-illegal-address");
}

TEST_CASE("crashcap run classifies real PyTorch failures in real Python trainings", "[run][python]") {
  // Debian's python3-torch: the messages PyTorch itself prints, from processes it runs.
  const std::string python = "/usr/bin/python3";
  if (test::run({python, "-c", "import torch"}, 120).exitCode != 0) {
    WARN("no PyTorch for " << python << ": the real-Python cases are skipped");
    return;
  }
  struct Case {
    const char* name;
    const char* script;
    int exitCode;
    const char* id;
    const char* evidence;
  };
  const std::vector<Case> cases = {
      {"out-of-range label", R"(
import torch, torch.nn as nn
m = nn.Linear(8, 10)
for step in range(10):
    y = torch.randint(0, 10, (4,))
    if step == 7: y[2] = 12
    nn.functional.cross_entropy(m(torch.randn(4, 8)), y).backward()
)",
       1, "python-exception", "IndexError: Target 12 is out of bounds."},
      // The workers hand back plain lists: a tensor would cross by file descriptor, and a worker
      // killed mid-handover makes PyTorch raise ConnectionResetError instead of naming the
      // worker (a race of PyTorch's, seen here once; crashcap classifies what the run prints).
      {"DataLoader worker killed", R"(
import os, signal, torch
from torch.utils.data import DataLoader, Dataset
class D(Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        if i == 37: os.kill(os.getpid(), signal.SIGKILL)
        return i
for batch in DataLoader(D(), batch_size=4, num_workers=2, collate_fn=list): pass
)",
       1, "dataloader-worker-died", "RuntimeError: DataLoader worker (pid"},
      // A worker's own exception: PyTorch raises it again in the main process, and the evidence is
      // the worker's line, not PyTorch's "Caught ValueError in DataLoader worker process N."
      {"DataLoader worker raises", R"(
import torch
from torch.utils.data import DataLoader, Dataset
class D(Dataset):
    def __len__(self): return 64
    def __getitem__(self, i):
        if i == 37: raise ValueError(f"corrupt record {i}")
        return i
for batch in DataLoader(D(), batch_size=4, num_workers=2): pass
)",
       1, "python-exception", "ValueError: corrupt record 37 (in DataLoader worker process "},
      {"segfault in native code", R"(
import ctypes, torch
torch.zeros(3).sum()
ctypes.string_at(0)
)",
       128 + SIGSEGV, "signal", "killed by SIGSEGV"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    test::TempDir dir;
    std::string script = dir.file("train.py");
    std::ofstream(script) << c.script;
    auto runDir = dir.file("runs");
    auto r = test::run({test::binPath("crashcap"), "run", "--dir", runDir, "--", python, script}, 300);
    INFO(r.err);
    CHECK(r.exitCode == c.exitCode);
    auto bundles = test::bundlesIn(runDir);
    REQUIRE(bundles.size() == 1);
    CHECK(verifies(bundles[0]));
    auto j = inspectJson(bundles[0]);
    CHECK(j["crash"]["classification"] == c.id);
    CHECK(j["crash"]["evidence"].get<std::string>().find(c.evidence) != std::string::npos);
  }
}

TEST_CASE("crashcap run over an uninstrumented command: a classified bundle that says why there is no trace",
          "[run]") {
  test::TempDir dir;
  auto r = runShell(dir.path(), "echo step 1; echo 'RuntimeError: CUDA error: an illegal instruction was encountered' >&2; exit 1");
  INFO(r.err);
  CHECK(r.exitCode == 1);                              // the command's status
  CHECK(r.out.find("step 1") != std::string::npos);    // its output passes through
  CHECK(r.err.find("cuda-illegal-instruction") != std::string::npos);
  auto bundles = test::bundlesIn(dir.path());
  REQUIRE(bundles.size() == 1);
  CHECK(verifies(bundles[0]));
  auto j = inspectJson(bundles[0]);
  CHECK(j["crash"]["classification"] == "cuda-illegal-instruction");
  CHECK(j["crash"]["kind"] == "exit");
  CHECK(j["supervision"]["exit_code"] == 1);
  CHECK(j["supervision"]["trace"].get<std::string>().rfind("unavailable: ", 0) == 0);
  CHECK(j["supervision"]["stderr_tail"].get<std::string>().find("illegal instruction") != std::string::npos);
  CHECK(j["supervision"]["stdout_tail"] == "step 1\n");
  CHECK(j["supervision"]["command"][0] == "/bin/sh");
  CHECK(j["supervision"]["environment"][0].get<std::string>().rfind("CRASHCAP_DIR=", 0) == 0);
  CHECK(!j["env"].is_null());  // the environment the command ran in
}

TEST_CASE("crashcap run: each fatal signal is the exit status 128+N and a bundle", "[run]") {
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGKILL}) {
    test::TempDir dir;
    const char* name = formats::signalName(sig);
    INFO(name);
    auto r = runShell(dir.path(), std::string("kill -") + (name + 3) + " $$");
    CHECK(r.exitCode == 128 + sig);
    auto bundles = test::bundlesIn(dir.path());
    REQUIRE(bundles.size() == 1);
    auto j = inspectJson(bundles[0]);
    CHECK(j["crash"]["classification"] == "signal");
    CHECK(j["crash"]["signal_name"] == name);
    CHECK(j["supervision"]["exit_code"].is_null());
  }
}

TEST_CASE("crashcap run over a recorded sample: one bundle, the recorder's steps plus the run's record", "[run]") {
  test::TempDir dir;
  if (!fs::exists(test::binPath("crashcap-sample-seg"))) { WARN("built without LibTorch: no sample to run"); return; }
  auto r = test::run({test::binPath("crashcap"), "run", "--dir", dir.path(), "--", test::binPath("crashcap-sample-seg"),
                      "--steps", "12", "--fault", "nan-sample", "--fault-step", "6", "--keyframe-every", "4"},
                     300);
  INFO(r.err);
  CHECK(r.exitCode == 1);
  CHECK(r.err.find("crashcap triage") != std::string::npos);  // the next command, since it has steps
  auto bundles = test::bundlesIn(dir.path());
  REQUIRE(bundles.size() == 1);  // the recorder's crash bundle, with the supervision added: not two
  CHECK(verifies(bundles[0]));
  auto j = inspectJson(bundles[0]);
  CHECK(j["crash"]["kind"] == "nonfinite");
  CHECK(j["crash"]["step"] == 6);
  CHECK(j["crash"]["classification"] == "nonfinite-loss");
  CHECK(j["steps"]["last"] == 6);
  auto replay = test::run({test::binPath("crashcap"), "replay", bundles[0], "--json"}, 300);
  REQUIRE(replay.exitCode == 0);
  CHECK(json::parse(replay.out)["verdict"] == "reproduced-bitwise");
}

TEST_CASE("crashcap run: a crash bundle it cannot add its record to stays as it was, and the record goes beside it",
          "[run]") {
  // The command leaves a crash bundle that is not one (a recorder killed mid-write, a full
  // disk): the run's record and its output tails must not be lost with it.
  test::TempDir dir;
  auto r = runShell(dir.path(), "printf 'not a bundle' > \"$CRASHCAP_DIR/crash-20990101T000000Z-1.ccap\"; "
                                "echo 'Traceback (most recent call last):' >&2; "
                                "echo 'RuntimeError: step failed' >&2; exit 1");
  INFO(r.err);
  CHECK(r.exitCode == 1);
  CHECK(r.err.find("could not add the run's record to") != std::string::npos);
  auto broken = (fs::path(dir.path()) / "crash-20990101T000000Z-1.ccap").string();
  CHECK(r.err.find("also      " + broken) != std::string::npos);
  std::ifstream in(broken);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  CHECK(bytes == "not a bundle");  // untouched
  std::string own;
  for (const auto& b : test::bundlesIn(dir.path()))
    if (b != broken) own = b;
  REQUIRE(!own.empty());
  CHECK(verifies(own));
  auto j = inspectJson(own);
  CHECK(j["crash"]["classification"] == "python-exception");
  CHECK(j["supervision"]["stderr_tail"].get<std::string>().find("RuntimeError: step failed") != std::string::npos);
}

TEST_CASE("crashcap run seals the recording of a child killed with SIGKILL", "[run]") {
  test::TempDir dir;
  std::string sample = test::binPath("crashcap-sample-cls");
  if (!fs::exists(sample)) { WARN("built without LibTorch: no sample to run"); return; }
  auto r = runShell(dir.path(),
                    "'" + sample + "' --steps 1000000 --keyframe-every 5 > /dev/null & pid=$!; sleep 3; kill -9 $pid; exit 9");
  INFO(r.err);
  CHECK(r.exitCode == 9);
  auto bundles = test::bundlesIn(dir.path());
  REQUIRE(bundles.size() == 1);
  CHECK(verifies(bundles[0]));
  auto j = inspectJson(bundles[0]);
  CHECK(j["status"] == "interrupted");
  CHECK(j["steps"]["count"].get<int>() > 0);
  CHECK(j["crash"]["classification"] == "exit-nonzero");
  // No recording left: the bundle, and the run log's line.
  for (const auto& e : fs::directory_iterator(dir.path()))
    CHECK((e.path().extension() == ".ccap" || e.path().filename() == "runs.jsonl"));
}

TEST_CASE("crashcap run --restart: one bundle per crash, and --max-consecutive stops early", "[run]") {
  {
    test::TempDir dir;
    auto r = runShell(dir.path(), "echo run >> '" + dir.file("count") + "'; exit 3", {"--restart", "2", "--backoff", "0"});
    CHECK(r.exitCode == 3);
    CHECK(test::readText(dir.file("count")) == "run\nrun\nrun\n");  // N restarts: N+1 runs
    CHECK(test::bundlesIn(dir.path()).size() == 3);
    CHECK(r.err.find("2 restarts used") != std::string::npos);
  }
  {
    test::TempDir dir;
    auto r = runShell(dir.path(), "exit 3", {"--restart", "5", "--max-consecutive", "2", "--backoff", "0"});
    CHECK(r.exitCode == 3);
    CHECK(test::bundlesIn(dir.path()).size() == 2);
    CHECK(r.err.find("2 crashes in a row classified exit-nonzero") != std::string::npos);
  }
  {
    test::TempDir dir;  // a run that succeeds ends the supervision
    auto r = runShell(dir.path(), "exit 0", {"--restart", "3"});
    CHECK(r.exitCode == 0);
    CHECK(test::bundlesIn(dir.path()).empty());
  }
}

TEST_CASE("Ctrl-C stops the command and still seals; a child that ignores SIGTERM is killed after the grace",
          "[run]") {
  struct Case {
    std::string script;
    int expectedStatus;
  };
  test::TempDir dir;
  std::string started = dir.file("started");
  const std::vector<Case> cases = {
      {"touch '" + started + "'; sleep 30", 128 + SIGINT},
      {"trap '' INT TERM; touch '" + started + "'; while :; do sleep 0.1; done", 128 + SIGKILL},
  };
  for (const auto& c : cases) {
    INFO(c.script);
    test::TempDir out;
    fs::remove(started);
    pid_t pid = fork();
    if (pid == 0) {
      int devnull = open("/dev/null", O_WRONLY);
      dup2(devnull, 1);
      dup2(devnull, 2);
      execl(test::binPath("crashcap").c_str(), "crashcap", "run", "--dir", out.path().c_str(), "--grace", "1", "--",
            "/bin/sh", "-c", c.script.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    auto t0 = std::chrono::steady_clock::now();
    while (!fs::exists(started) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    REQUIRE(fs::exists(started));
    kill(pid, SIGINT);
    int status = 0;
    waitpid(pid, &status, 0);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(seconds < 15);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == c.expectedStatus);
    auto bundles = test::bundlesIn(out.path());
    REQUIRE(bundles.size() == 1);
    auto j = inspectJson(bundles[0]);
    CHECK(j["supervision"]["interrupted"] == true);
    CHECK(j["crash"]["classification"] == "signal");
  }
}

TEST_CASE("crashcap run: a command that cannot start is a usage error", "[run]") {
  test::TempDir dir;
  auto r = test::run({test::binPath("crashcap"), "run", "--dir", dir.path(), "--", "/nonexistent/train"});
  CHECK(r.exitCode == 2);
  CHECK(r.err.find("cannot run '/nonexistent/train'") != std::string::npos);
  auto none = test::run({test::binPath("crashcap"), "run", "--dir", dir.path()});
  CHECK(none.exitCode == 2);
}

TEST_CASE("crashcap run: an option it does not know is a usage error, never dropped or run as the command", "[run]") {
  test::TempDir dir;
  const std::string marker = dir.path() + "/ran";
  const std::vector<std::string> touch = {"/usr/bin/touch", marker};
  // Before --: the option and its value were parsed into nothing, and the command ran.
  std::vector<std::string> before = {test::binPath("crashcap"), "run", "--dir", dir.path(), "--out", "elsewhere", "--"};
  before.insert(before.end(), touch.begin(), touch.end());
  auto r = test::run(before);
  CHECK(r.exitCode == 2);
  CHECK(r.err.find("does not know `--out elsewhere` (before --)") != std::string::npos);
  // Without --: the first word that is not an option would start the command `--out elsewhere ...`.
  std::vector<std::string> without = {test::binPath("crashcap"), "run", "--dir", dir.path(), "--out", "elsewhere"};
  without.insert(without.end(), touch.begin(), touch.end());
  auto w = test::run(without);
  CHECK(w.exitCode == 2);
  CHECK(w.err.find("does not know the option `--out`") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(marker));
  // A command with a -- of its own (`uv run -- python train.py`) keeps it.
  auto own = test::run({test::binPath("crashcap"), "run", "--dir", dir.path(), "/usr/bin/env", "--", "/usr/bin/true"});
  CHECK(own.exitCode == 0);
  CHECK(own.err.find("`/usr/bin/env -- /usr/bin/true` exited 0") != std::string::npos);
  // The command's own options after its first word stay the command's.
  auto ok = test::run({test::binPath("crashcap"), "run", "--dir", dir.path(), "/usr/bin/touch", "--no-create", marker});
  CHECK(ok.exitCode == 0);
  CHECK(ok.err.find("`/usr/bin/touch --no-create " + marker + "` exited 0") != std::string::npos);
}

TEST_CASE("crashcap doctor explains the missing GPU stack the way crashcap run does", "[run][doctor]") {
  auto r = test::run({test::binPath("crashcap"), "doctor", "--json"});
  INFO(r.out << r.err);
  auto j = json::parse(r.out);
  std::map<std::string, json> byId;
  for (const auto& c : j["checks"]) byId[c["id"]] = c;
  for (const char* id : {"driver", "cuda-runtime", "cudnn", "cupti", "gpu-visible", "wsl2", "mp-start-method", "cuda-env"}) {
    INFO(id);
    REQUIRE(byId.count(id));
    std::string v = byId[id]["status"];
    CHECK((v == "ok" || v == "warn" || v == "fail" || v == "info"));
  }
  CHECK(byId["mp-start-method"]["advice"].get<std::string>().find("spawn") != std::string::npos);
  CHECK(r.exitCode == (j["failed"].get<int>() > 0 ? 1 : 0));
  CHECK(j["trace"].get<std::string>().rfind("unavailable: ", 0) == 0);
  if (!fs::exists("/dev/nvidia0") && byId["driver"]["status"] == "fail") {
    // This machine (and CI): the same reason `crashcap run` writes into its bundles.
    CHECK(byId["driver"]["detail"].get<std::string>().find("libcuda.so") != std::string::npos);
    CHECK(j["trace"].get<std::string>().find("no NVIDIA driver") != std::string::npos);
  }
}

TEST_CASE("crashcap run copies the traced processes' kernel traces into the bundle and classifies by the first sticky CUDA error",
          "[run][trace]") {
  // The command stands in for a Python training whose libcrashcap_inject.so wrote its trace
  // file (that library needs a GPU to trace; the file protocol is what is tested here) and
  // which died with an error text that names no CUDA failure. A soft error came first: an
  // allocation failure the caching allocator recovered from; the sticky one decides.
  test::TempDir dir, prepared;
  formats::KernelTraceData t;
  t.status = "recorded";
  t.pid = 4242;
  formats::KernelLaunchData l;
  l.index = 17;
  l.symbol = "_Z6kernelPf";
  l.api = "cudaLaunchKernel";
  l.grid[0] = 64, l.block[0] = 256;
  l.returnCode = 0;
  l.opIndex = 12;
  t.launches.push_back(l);
  t.totalLaunches = 18;
  formats::ApiErrorData e;
  e.domain = "runtime";
  e.api = "cudaLaunchKernel";
  e.code = 715;
  e.name = "cudaErrorIllegalInstruction";
  e.symbol = "_Z6kernelPf";
  formats::ApiErrorData oom = recoveredOom();
  t.firstError = oom;
  t.stickyError = e;
  std::string traceFile = prepared.file("trace.cctrace");
  cupti::writeTraceFile(traceFile, t, "test");

  auto r = runShell(dir.path(), "echo \"inject=$CUDA_INJECTION64_PATH\"; cp '" + traceFile +
                                    "' \"$CRASHCAP_DIR/trace-$$.cctrace\"; "
                                    "echo 'Traceback (most recent call last):' >&2; echo 'RuntimeError: step failed' >&2; exit 1");
  INFO(r.out << r.err);
  CHECK(r.exitCode == 1);
  if (cupti::builtWithCupti()) CHECK(r.out.find("inject=" + test::binPath("libcrashcap_inject.so")) != std::string::npos);
  auto bundles = test::bundlesIn(dir.path());
  REQUIRE(bundles.size() == 1);
  CHECK(verifies(bundles[0]));
  for (const auto& entry : fs::directory_iterator(dir.path()))  // in the bundle now, not beside it
    CHECK(entry.path().extension() != ".cctrace");
  auto reader = formats::BundleReader::open(bundles[0]);
  auto view = formats::readRecords(*reader);
  REQUIRE(view.kernelTraces.size() == 1);
  CHECK(view.kernelTraces[0].pid == 4242);
  REQUIRE(view.kernelTraces[0].launches.size() == 1);
  CHECK(view.kernelTraces[0].launches[0].symbol == "_Z6kernelPf");
  REQUIRE(view.supervision);
  CHECK(view.supervision->classification == "cuda-illegal-instruction");  // not python-exception
  CHECK(view.supervision->evidence.find("first sticky CUDA error cudaErrorIllegalInstruction (715) in cudaLaunchKernel "
                                        "launching _Z6kernelPf") != std::string::npos);
  CHECK(view.supervision->trace ==
        "recorded: 1 process, 18 kernel launches, first sticky error cudaErrorIllegalInstruction in cudaLaunchKernel");
  REQUIRE(view.kernelTraces[0].firstError);
  CHECK(view.kernelTraces[0].firstError->code == 2);
  REQUIRE(view.kernelTraces[0].stickyError);
  CHECK(view.kernelTraces[0].stickyError->code == 715);
  CHECK(r.err.find("crashcap inspect " + bundles[0] + " --trace") != std::string::npos);
}

TEST_CASE("crashcap run: a soft CUDA error in a trace does not reclassify a crash", "[run][trace]") {
  // A recovered cudaMalloc failure, then the training died of a Python error: the trace says
  // so, and the classification stays the text's.
  test::TempDir dir, prepared;
  formats::KernelTraceData t;
  t.status = "recorded";
  t.pid = 4243;
  t.totalLaunches = 5;
  formats::ApiErrorData oom = recoveredOom();
  t.firstError = oom;
  std::string traceFile = prepared.file("trace.cctrace");
  cupti::writeTraceFile(traceFile, t, "test");
  auto r = runShell(dir.path(), "cp '" + traceFile + "' \"$CRASHCAP_DIR/trace-$$.cctrace\"; "
                                "echo 'Traceback (most recent call last):' >&2; echo 'KeyError: label' >&2; exit 1");
  INFO(r.out << r.err);
  auto bundles = test::bundlesIn(dir.path());
  REQUIRE(bundles.size() == 1);
  auto reader = formats::BundleReader::open(bundles[0]);
  auto view = formats::readRecords(*reader);
  REQUIRE(view.supervision);
  CHECK(view.supervision->classification == "python-exception");
  CHECK(view.supervision->evidence == "KeyError: label");
  CHECK(view.supervision->trace == "recorded: 1 process, 5 kernel launches, first error cudaErrorMemoryAllocation in "
                                   "cudaMalloc (not sticky: the context survived it)");
}

TEST_CASE("crashcap run --cudnn-log keeps the tail of cuDNN's API log in the bundle", "[run][trace]") {
  // The command writes where cuDNN would (CUDNN_LOGDEST_DBG) far more than the tail keeps.
  test::TempDir dir;
  auto r = runShell(dir.path(),
                    "test \"$CUDNN_LOGLEVEL_DBG\" = 3 || exit 9; "
                    "i=0; while [ $i -lt 6000 ]; do echo \"I! CuDNN (v90100) function cudnnBackendExecute() called: call $i "
                    "engine 7 knobs (padding to make the line long enough to matter)\"; i=$((i+1)); done > \"$CUDNN_LOGDEST_DBG\"; "
                    "echo 'E! CuDNN (v90100) function cudnnBackendExecute() returned CUDNN_STATUS_EXECUTION_FAILED' > \"$CUDNN_LOGDEST_DBG\"; "
                    "echo 'RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED' >&2; exit 1",
                    {"--cudnn-log"});
  INFO(r.out << r.err);
  CHECK(r.exitCode == 1);
  auto bundles = test::bundlesIn(dir.path());
  REQUIRE(bundles.size() == 1);
  auto reader = formats::BundleReader::open(bundles[0]);
  auto view = formats::readRecords(*reader);
  REQUIRE(view.supervision);
  CHECK(view.supervision->classification == "cudnn-execution-failed");
  const auto& tail = view.supervision->cudnnLogTail;
  CHECK(tail.size() <= 256 * 1024);
  CHECK(tail.size() > 100 * 1024);  // 6,000 lines of ~130 bytes: the tail is full
  CHECK(tail.find("call 5999 engine 7") != std::string::npos);
  CHECK(tail.find("call 10 engine") == std::string::npos);  // the head is gone
  CHECK(tail.find("returned CUDNN_STATUS_EXECUTION_FAILED") != std::string::npos);
  for (const auto& entry : fs::directory_iterator(dir.path()))  // the pipe is gone
    CHECK(entry.path().filename().string().find("cudnn-log") == std::string::npos);
}
