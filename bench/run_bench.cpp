// crashcap-bench-run: what `crashcap run` costs a training command. Runs the same recorded
// sample training bare (`crashcap-sample-cls --record DIR`) and wrapped (`crashcap run --dir DIR
// -- crashcap-sample-cls`, which records into the same kind of directory through CRASHCAP_DIR),
// interleaved round by round so machine noise hits both alike. Each ratio is wrapped ÷ bare
// wall time of one whole process (start, training, exit); the report is the median ratio with
// its min and max, its 95% interval (ratios.hpp) and whether that interval shows the target met.
// The CPU time of the process and every process it waited for (DataLoader workers, the wrapped
// command), user and system, gives a second ratio, less moved by what else the machine runs.
// Also: what deciding that no kernel trace can be taken costs (traceStatus).
//
// With --record PYTHON SCRIPT: the Python sample (samples/python/train.py, DataLoader workers
// included) bare, unrecorded, against `crashcap run --record -- PYTHON SCRIPT`, which records it
// from PyTorch's seams with no change to it: what recording an unmodified training costs.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "crashcap/formats/directory.hpp"
#include "crashcap/supervisor/supervisor.hpp"
#include "machine.hpp"
#include "ratios.hpp"

extern char** environ;
namespace fs = std::filesystem;

namespace {

double median(std::vector<double> v) { return crashcap::bench::medianInterval(std::move(v)).median; }

struct Timing {
  double wall = 0;  ///< seconds from spawn to exit
  double cpu = 0;   ///< user + system seconds of the process and of every descendant it waited for
};

/// One process, its output thrown away. Exits the bench when it fails.
Timing timed(const std::vector<std::string>& argv) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid;
  if (posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ) != 0) {
    std::fprintf(stderr, "crashcap-bench-run: cannot run %s\n", args[0]);
    std::exit(1);
  }
  int status = 0;
  struct rusage usage {};
  wait4(pid, &status, 0, &usage);
  Timing t;
  t.wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  posix_spawn_file_actions_destroy(&actions);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "crashcap-bench-run: %s failed (status %d)\n", args[0], status);
    std::exit(1);
  }
  auto seconds = [](const timeval& tv) { return double(tv.tv_sec) + double(tv.tv_usec) / 1e6; };
  t.cpu = seconds(usage.ru_utime) + seconds(usage.ru_stime);
  return t;
}

nlohmann::json intervalJson(const crashcap::bench::MedianInterval& m) {
  return {{"low", m.low}, {"high", m.high}, {"confidence", m.confidence}};
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  int rounds = 10;
  int steps = 60;
  std::string python, script;  // --record
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") json = true;
    else if (a == "--record" && i + 2 < argc) {
      python = argv[++i];
      script = argv[++i];
    }
    else if (a == "--rounds" && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
    else if (a == "--steps" && i + 1 < argc) steps = std::max(10, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: crashcap-bench-run [--json] [--rounds N] [--steps N] [--record PYTHON SCRIPT]\n");
      return 2;
    }
  }
  fs::path bin = fs::canonical("/proc/self/exe").parent_path();
  std::string sample = (bin / "crashcap-sample-cls").string(), crashcap = (bin / "crashcap").string();
  fs::path scratch = fs::temp_directory_path() / fmt::format("crashcap-bench-run-{}", ::getpid());
  // A run that starts on the last one's files would measure something else: stop instead.
  auto clean = [&] {
    const std::string error = crashcap::formats::removeTree(scratch.string());
    if (error.empty()) return;
    std::fprintf(stderr, "crashcap-bench-run: cannot clean its scratch directory: %s\n", error.c_str());
    std::exit(1);
  };
  std::vector<double> bare, wrapped, ratios, cpuRatios;
  for (int r = 0; r < rounds; ++r) {
    // Alternate which goes first, so neither always runs on a warmer machine.
    auto runBare = [&] {
      clean();
      if (!python.empty()) return timed({python, script, "--steps", std::to_string(steps), "--quiet"});
      return timed({sample, "--steps", std::to_string(steps), "--record", (scratch / "bare").string()});
    };
    auto runWrapped = [&] {
      clean();
      if (!python.empty())
        return timed({crashcap, "run", "--record", "--dir", (scratch / "wrapped").string(), "--", python, script,
                      "--steps", std::to_string(steps), "--quiet"});
      return timed({crashcap, "run", "--dir", (scratch / "wrapped").string(), "--", sample, "--steps", std::to_string(steps)});
    };
    Timing tb, tw;
    if (r % 2 == 0) {
      tb = runBare();
      tw = runWrapped();
    } else {
      tw = runWrapped();
      tb = runBare();
    }
    const double b = tb.wall, w = tw.wall;
    bare.push_back(b);
    wrapped.push_back(w);
    ratios.push_back(w / b);
    cpuRatios.push_back(tw.cpu / tb.cpu);
    if (!json)
      std::fprintf(stderr, "round %2d: bare %.3f s, wrapped %.3f s, ratio %.3f (CPU %.2f s / %.2f s, ratio %.3f)\n",
                   r + 1, b, w, w / b, tw.cpu, tb.cpu, tw.cpu / tb.cpu);
  }
  clean();
  // The tracer's cost when it cannot run: deciding why (a dlopen of the driver that fails).
  const int probes = 200;
  auto t0 = std::chrono::steady_clock::now();
  std::string status;
  for (int i = 0; i < probes; ++i) status = crashcap::supervisor::traceStatus();
  double traceUs = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / probes;
  const double target = python.empty() ? 1.02 : 1.03;
  const auto wall = crashcap::bench::medianInterval(ratios), cpu = crashcap::bench::medianInterval(cpuRatios);
  nlohmann::json j = {{"task", python.empty() ? "cls" : "python-record"},
                      {"steps", steps},
                      {"rounds", rounds},
                      {"bare_s", median(bare)},
                      {"wrapped_s", median(wrapped)},
                      {"overhead_ratio", wall.median},
                      {"overhead_ratio_min", *std::min_element(ratios.begin(), ratios.end())},
                      {"overhead_ratio_max", *std::max_element(ratios.begin(), ratios.end())},
                      {"overhead_ratio_interval", intervalJson(wall)},
                      {"target", target},
                      {"target_verdict", crashcap::bench::targetVerdict(wall, target)},
                      {"cpu_ratio", cpu.median},
                      {"cpu_ratio_interval", intervalJson(cpu)},
                      {"trace_status", status},
                      {"trace_status_us", traceUs},
                      {"machine", crashcap::bench::machine()}};
  std::cout << (json ? j.dump(2)
                     : fmt::format("overhead_ratio {:.3f} (min {:.3f}, max {:.3f}; {:.0f}% interval {:.3f}..{:.3f}: "
                                   "target {} {}) over {} rounds; CPU ratio {:.3f} ({:.3f}..{:.3f}); trace: {} ({:.0f} us)",
                                   wall.median, j["overhead_ratio_min"].get<double>(),
                                   j["overhead_ratio_max"].get<double>(), 100 * wall.confidence, wall.low, wall.high,
                                   target, j["target_verdict"].get<std::string>(), rounds, cpu.median, cpu.low,
                                   cpu.high, status, traceUs))
            << "\n";
  return 0;
}
