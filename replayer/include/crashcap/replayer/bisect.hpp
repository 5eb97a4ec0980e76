#pragma once
// Bisection drivers. Each experiment is a callback so that the CLI can run it in a fresh
// child process (a CUDA error poisons a process, a segfault must not end a bisection) and
// tests can drive the algorithm with a predicate.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace crashcap::replayer {

/// One experiment's result.
struct Trial {
  bool fails = false;         ///< the failure showed up
  std::string outcome;        ///< "fails: non-finite loss", "passes", "child killed by SIGSEGV", "timeout"
  double seconds = 0;
};

struct RowBisection {
  bool reproduced = false;              ///< the whole batch fails
  std::vector<int64_t> rows;            ///< a 1-minimal failing subset (every single row removed passes)
  int replays = 0;                      ///< experiments run
  std::vector<std::pair<std::vector<int64_t>, Trial>> log;
};

/// Delta debugging (Zeller's ddmin) over the rows 0..batchSize-1: the smallest set of rows
/// that still fails. For a single culprit row it halves: at most 2*ceil(log2 B) + 1 replays.
RowBisection bisectRows(int64_t batchSize, const std::function<Trial(const std::vector<int64_t>&)>& test);

/// Runs `argv` (argv[0] a path) with stdout and stderr captured, killing it after `timeout`
/// seconds. exitCode is the status, or -signal.
struct ChildResult {
  int exitCode = -1;
  bool timedOut = false;
  std::string out, err;
  double seconds = 0;
};
ChildResult runChild(const std::vector<std::string>& argv, double timeoutSeconds);

}  // namespace crashcap::replayer
