#pragma once
// Experiments: each one a `crashcap` command run as a child process with a timeout. A CUDA error
// poisons the process that meets it and a segfault ends it, so every experiment that could do
// either runs in a fresh process, and its crash or hang is a result, not the end of the
// investigation. The child prints JSON (results_json.hpp); this is the only place investigations
// read JSON back.

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

namespace crashcap::investigate {

/// One finished experiment.
struct Experiment {
  std::string name;                   ///< what it tests: "reproduce", "rows [0,3]", "cudnn.benchmark=false"
  std::string command;                ///< as a user would type it: "crashcap replay B --rows 0,3 --json"
  /// "ok", "timeout after 300 s", "child killed by signal 11", "failed: <last line of stderr>",
  /// "unreadable output: ...": the experiment log's words.
  std::string outcome;
  double seconds = 0;
  int exitCode = 0;                   ///< the exit status, or -signal
  bool timedOut = false;
  std::optional<nlohmann::json> output;  ///< stdout parsed, when the child exited 0
  /// The child died of a signal (not of the timeout): the failure under test in another form
  /// (a segfault where the recording saw an exception), not a broken experiment.
  bool killed() const { return exitCode < 0 && !timedOut; }
};

struct ExperimentOptions {
  double timeoutSeconds = 300;        ///< per experiment (a bisection gets a multiple, see run())
  bool progress = false;              ///< one line per experiment on stderr, when it is a terminal
  /// The crashcap executable the children run; "": this process's own executable.
  std::string executable;
  /// Pass --allow-damaged to every child: the caller found the bundle damaged and was told to go on.
  bool allowDamaged = false;
  /// Pass --allow-changed-source to every child (set from allowChangedSources(), replays.hpp).
  bool allowChangedSources = false;
};

/// Runs experiments one after another and keeps their log. Not thread-safe.
class ExperimentRunner {
 public:
  explicit ExperimentRunner(ExperimentOptions options);

  /// Runs `crashcap ARGS...`. `scale`: the experiment is itself a series of experiments (a
  /// bisection), each with the timeout; it gets that many timeouts in all.
  Experiment run(const std::string& name, const std::vector<std::string>& args, double scale = 1);

  /// Every experiment run so far, in order.
  const std::vector<Experiment>& log() const { return log_; }
  double timeoutSeconds() const { return options_.timeoutSeconds; }

 private:
  ExperimentOptions options_;
  std::vector<Experiment> log_;
};

/// The log as JSON: [{name, command, outcome, seconds}].
nlohmann::json experimentLogJson(const std::vector<Experiment>& log);

}  // namespace crashcap::investigate
