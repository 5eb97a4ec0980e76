#pragma once
// `crashcap run`: supervises a training command from outside. A CUDA error corrupts the
// process's context (every later call fails) and some failures kill it outright, so the
// evidence must already be on the host and the process must be watched, classified and
// restarted by another process (docs/RUN.md).
//
// Per run of the command: set up its environment (the recording directory for an in-process
// Recorder, optional CUDA_LAUNCH_BLOCKING / TORCH_USE_CUDA_DSA), pass its output through while
// keeping the tails, wait, classify the death, and seal exactly one bundle per crash,
// <dir>/crash-<time>-<pid>.ccap, holding what the in-process recorder wrote plus a
// `supervision` record; and one line per run, crashed or not, in <dir>/runs.jsonl (run_log.hpp).
// No LibTorch here.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "crashcap/formats/records.hpp"
#include "crashcap/supervisor/classify.hpp"

namespace crashcap::supervisor {

struct SuperviseOptions {
  std::vector<std::string> command;     ///< argv; argv[0] searched in PATH
  std::string dir = "crashcap-runs";    ///< where bundles go; CRASHCAP_DIR for the child
  int restarts = 0;                     ///< restart after a crash up to this many times
  int maxConsecutive = 0;               ///< stop after this many crashes in a row of one classification; 0 off
  double backoffSeconds = 1;            ///< before the first restart; doubles, at most 60 s
  bool launchBlocking = false;          ///< CUDA_LAUNCH_BLOCKING=1
  bool deviceSideAssertions = false;    ///< TORCH_USE_CUDA_DSA=1
  bool kernelTrace = true;              ///< CUDA_INJECTION64_PATH=libcrashcap_inject.so (unless the user set one)
  bool cudnnLog = false;                ///< cuDNN's API log into a pipe; its tail goes into the bundle
  size_t cudnnLogTailBytes = 256 * 1024;
  double stopGraceSeconds = 10;         ///< after Ctrl-C: SIGINT, then SIGTERM at half, SIGKILL at the end
  size_t tailBytes = 64 * 1024;         ///< of stdout and of stderr, per run
  /// `--record`: record a Python training from PyTorch's own seams, with no change to it: the
  /// crashcap package's bootstrap goes first on the child's PYTHONPATH (pythonPackage()) and
  /// `observePolicy` (the Recorder's keywords, JSON) into CRASHCAP_OBSERVE (docs/PYTHON.md).
  bool observePython = false;
  std::string observePolicy = "{}";
  /// With observePython: keep the recording of a run that exits 0 (for `crashcap seal`); by
  /// default crashcap removes the recordings it started when their run ends cleanly.
  bool keepRecording = false;
  /// `--nproc N`: the command is one rank of a torch.distributed job, started N times on this
  /// machine with the variables a launcher sets (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
  /// MASTER_ADDR, MASTER_PORT); 0: the command is started once as it is.
  int nproc = 0;
  int masterPort = 0;                   ///< with nproc: MASTER_PORT; 0 picks a free one
  /// With nproc: once a rank has failed, how long the others may take to end on their own (they
  /// usually fail in their next collective) before they are stopped: SIGTERM, then SIGKILL after
  /// half of stopGraceSeconds. Their recordings are sealed either way.
  double hangSeconds = 30;
  /// Lines for the user (on stderr in the CLI): what is happening between runs.
  std::function<void(const std::string&)> say;
};

/// One rank of a job started with nproc.
struct RankReport {
  int rank = 0;
  uint32_t pid = 0;
  int exitCode = -1;                    ///< -1 when a signal ended it
  int signal = 0;
  Classification classification;        ///< id "" for a clean exit
  bool stopped = false;                 ///< crashcap run stopped it after another rank failed
  double seconds = 0;                   ///< from the job's start to this rank's end
  std::string bundle;                   ///< its sealed bundle ("" for a clean exit)
};

struct AttemptReport {
  int attempt = 1;
  uint32_t pid = 0;
  int exitCode = -1;                    ///< -1 when a signal ended it
  int signal = 0;
  Classification classification;        ///< id "" for a clean exit
  std::string bundle;                   ///< the sealed crash bundle ("" for a clean exit)
  std::string trace;                    ///< the kernel trace in one line (SupervisionData::trace)
  /// From the start to the end of the command's last process (what its bundle's supervision
  /// record says), not counting what crashcap run did after (waiting for the training's
  /// orphaned workers to close their output, collecting traces).
  double seconds = 0;
  /// More crash bundles the run left: several recorders' or, after a clean exit, those of crashes
  /// the program recorded and went on from.
  std::vector<std::string> otherBundles;
  /// "NAME=VALUE": the run's hyperparameters (run_log.hpp), in its bundle and its runs.jsonl line.
  std::vector<std::string> params;
  /// With nproc: every rank, in rank order. The attempt's pid, exit, classification and bundle
  /// are then those of the rank that failed first.
  std::vector<RankReport> ranks;
  int firstFailedRank = -1;
};

struct SuperviseReport {
  std::vector<AttemptReport> attempts;
  bool interrupted = false;             ///< crashcap run was stopped (Ctrl-C, SIGTERM)
  std::string stoppedBecause;           ///< why no further restart ("" when the last run exited 0)
  std::string trace;                    ///< before the run: traceStatus()
  /// The status to exit with: the last run's exit status, or 128 + its signal.
  int exitStatus() const;
};

/// Runs the command under supervision. Throws crashcap::Error (NotFound: the command cannot be
/// executed; Io: the directory cannot be made).
SuperviseReport supervise(const SuperviseOptions& options);

/// Whether `crashcap run` can trace kernels in its children here: "available: ..." or
/// "unavailable: <reason>" (no driver, no device, no CUPTI in this build, no injection library).
std::string traceStatus();

/// libcrashcap_inject.so next to this executable (the build) or in the installed library
/// directory beside its bin/; "" when there is none.
/// CRASHCAP_INJECT_LIBRARY overrides.
std::string injectionLibrary();

/// The directory of the crashcap Python package whose bootstrap `--record` puts into a Python
/// child: $CRASHCAP_PYTHON_PACKAGE, else the build's (python/crashcap beside bin/), else the
/// installed one. Throws crashcap::Error{NotFound} saying how to build it when there is none.
std::string pythonPackage();

/// A free TCP port on the loopback interface, for a job's rendezvous (MASTER_PORT). Throws
/// Error{Io} when there is none.
int freePort();

}  // namespace crashcap::supervisor
