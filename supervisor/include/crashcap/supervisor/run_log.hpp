#pragma once
// What `crashcap run` keeps of every run, crashed or not, so that many runs can be compared
// (`crashcap summary`): the run's hyperparameters, and one line per run in <dir>/runs.jsonl.
//
// Hyperparameters come from two places: the command line's own options (`--lr 3e-4`,
// `--label-smoothing=0.1`, `--amp`), and what the program declares while it runs
// (crashcap.hyperparameters in Python writes a JSON object to the file kParamsFileVariable
// names; an Optuna trial's parameters arrive that way). Declared values win over the command
// line's of the same name. No LibTorch here.

#include <string>
#include <vector>

#include "crashcap/formats/records.hpp"

namespace crashcap::supervisor {

/// Names the file a supervised program may write its hyperparameters to (a JSON object).
inline constexpr const char* kParamsFileVariable = "CRASHCAP_PARAMS_FILE";
/// The run log in a `crashcap run` directory: one JSON object per line, one line per run.
inline constexpr const char* kRunLogName = "runs.jsonl";

/// "NAME=VALUE" for each `--name value`, `--name=value` and lone `--flag` ("true") of a command
/// line (argv[0] and positional arguments skipped; a value that starts with '-' only when it is a
/// number). The first occurrence of a name wins.
std::vector<std::string> commandLineParams(const std::vector<std::string>& argv);

/// The program's declared hyperparameters from `path` (a JSON object of strings, numbers, bools),
/// as "NAME=VALUE" (numbers and bools as JSON writes them). A missing file is no parameters; a
/// file that is not such an object is none either, and `problem` says why. At most 256 entries,
/// each cut to 4 KiB; the file is read up to 1 MiB.
std::vector<std::string> declaredParams(const std::string& path, std::string* problem = nullptr);

/// `declared` over `commandLine`: one entry per name, declared values winning, in first-seen order.
std::vector<std::string> mergeParams(const std::vector<std::string>& commandLine, const std::vector<std::string>& declared);

/// One run as <dir>/runs.jsonl keeps it.
/// One rank of a job (`crashcap run --nproc N`), as the run log keeps it.
struct RunLogRank {
  int rank = 0;
  uint32_t pid = 0;
  int exitCode = -1;                  ///< -1 when a signal ended it
  int signal = 0;
  std::string classification;         ///< "" for a clean exit
  bool stopped = false;               ///< stopped by crashcap run after another rank failed
  std::string bundle;                 ///< "" for a clean exit
};

struct RunLogEntry {
  std::vector<std::string> command;   ///< secrets redacted
  uint32_t attempt = 1;
  uint32_t pid = 0;
  int64_t startNs = 0, endNs = 0;     ///< Unix time
  int exitCode = -1;                  ///< -1 when a signal ended it
  int signal = 0;
  std::string classification;         ///< "" for a clean exit
  std::string evidence;
  std::string bundle;                 ///< the crash bundle ("" for a clean exit), absolute
  std::vector<std::string> otherBundles;
  std::vector<std::string> params;    ///< "NAME=VALUE"
  std::string jobId;                  ///< the job id the run's processes were given
  std::vector<RunLogRank> ranks;      ///< a job's ranks (`--nproc`); empty otherwise
  int firstFailedRank = -1;           ///< the job's rank that failed first; -1 none
};

/// Appends `entry` as one line to <dir>/runs.jsonl (created when missing). Keys: command,
/// attempt, pid, start, end ("2026-11-25 09:17:42 UTC"), seconds, exit_code, signal, classification,
/// evidence, bundle, other_bundles, params ({name: value}, values as text), job_id, and for a job
/// ranks [{rank, pid, exit_code, signal, classification, stopped, bundle}] and first_failed_rank
/// (null when none failed). Throws
/// crashcap::Error{Io} when the line cannot be written.
void appendRunLog(const std::string& dir, const RunLogEntry& entry);

}  // namespace crashcap::supervisor
