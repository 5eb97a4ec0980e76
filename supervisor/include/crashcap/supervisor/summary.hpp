#pragma once
// `crashcap summary DIR`: many runs' crashes at once (a hyperparameter study, a week of
// restarts). Reads every bundle under DIR and every runs.jsonl that `crashcap run` wrote there,
// groups the crashes by classification and signature (the error's words with numbers and
// addresses blanked, the op that was running, the phase), and, when the runs carry
// hyperparameters, names those that separate a group's failing runs from the healthy ones.
// A damaged or foreign file is listed, never fatal. No LibTorch here.

#include <nlohmann/json.hpp>

#include "crashcap/formats/records.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace crashcap::supervisor {

/// One run: a runs.jsonl line (crashed or healthy), or a crash bundle no line names.
struct SummaryRun {
  std::string name;             ///< where it is under DIR: "trial-0007", "runs.jsonl:3", "crash-....ccap"
  bool failed = false;
  std::string classification;   ///< "" for a healthy run
  std::string error;            ///< the error's own line, as recorded
  std::string op;               ///< the last ATen op of the crash step ("" unknown)
  std::string phase;            ///< of the crash ("" unknown)
  std::string bundle;           ///< "" for a healthy run (or a bundle that is gone)
  int64_t timeNs = 0;           ///< when it ended (Unix ns; 0 unknown)
  std::map<std::string, std::string> params;
};

/// A condition on one hyperparameter that every failing run of a group meets.
struct Separator {
  std::string rule;             ///< "num_classes = 10", "lr >= 0.05", "amp = true and lr >= 0.05"
  size_t failing = 0;           ///< the group's runs that meet it (all of them)
  size_t healthy = 0;           ///< healthy runs that meet it too
  size_t healthyTotal = 0;      ///< healthy runs that have the parameter(s)
};

struct CrashGroup {
  std::string classification;
  std::string signature;        ///< normalised error | op | phase
  std::string error;            ///< the first run's error line, as recorded
  std::string op, phase;
  std::vector<const SummaryRun*> runs;  ///< oldest first
  int64_t firstNs = 0, lastNs = 0;
  std::vector<Separator> separatedBy;   ///< best first; empty when nothing separates
};

struct CrashSummary {
  std::string dir;
  std::vector<SummaryRun> runs;          ///< every run found (stable: groups point into it)
  std::vector<CrashGroup> groups;        ///< largest first
  size_t healthy = 0, failed = 0;
  /// (path, why): files that could not be read, bundles whose crash did not survive damage, log lines
  std::vector<std::pair<std::string, std::string>> unreadable;
  std::vector<std::pair<std::string, std::string>> damaged;  ///< (path, what was lost): counted all the same
  std::vector<std::string> skipped;      ///< files that are neither bundles nor run logs
  std::vector<std::string> unsealed;     ///< recording directories nobody sealed (`crashcap seal`)
};

/// What a directory of runs holds: what `crashcap summary` and `crashcap inspect DIR` read.
struct RunDirListing {
  std::vector<std::string> bundles;      ///< *.ccap, absolute, sorted
  std::vector<std::string> logs;         ///< runs.jsonl files, absolute, sorted
  std::vector<std::string> unsealed;     ///< recording directories nobody sealed, relative to DIR
  std::vector<std::string> skipped;      ///< files that are neither, relative to DIR
  std::vector<std::pair<std::string, std::string>> unreadable;  ///< (path, why)
};

/// Lists DIR recursively (at most 8 levels; recording directories are listed, not entered;
/// hidden files and directories, a tool's own, are passed over; links to directories are not
/// followed). A subdirectory that cannot be listed goes into `unreadable` (path relative to DIR,
/// why) and the walk goes on. Throws crashcap::Error{NotFound} when DIR is not a directory.
RunDirListing listRunDir(const std::string& dir);

/// The lines of a runs.jsonl, each a JSON object with "_line" (1-based) added; lines that are no
/// JSON object go into `unreadable` as ("<log relative to root>:<line>", why).
std::vector<nlohmann::json> readRunLog(const std::string& log, const std::string& root,
                                       std::vector<std::pair<std::string, std::string>>& unreadable);

/// The line of an error text that names it: the last "Type: message" line (a Python exception's
/// own, after its traceback and the exceptions it came from), else the last line (a TorchScript
/// error ends with the original message).
std::string errorLine(const std::string& text);

/// The error's own line (the last "Type: message" line, else the last line) with what differs from
/// run to run blanked: numbers become N, hex addresses ADDR, -nan nan; cut to 200 characters.
/// "IndexError: Target 12 is out of bounds." -> "IndexError: Target N is out of bounds."
std::string normalizeError(const std::string& error);

/// A recorder's crash classified when no `crashcap run` classified it: its crash kind, refined by
/// the words of its error (a CUDA error in an exception's text); "nonfinite-loss" for a NaN loss.
std::string classificationOf(const formats::CrashData& crash);

/// Reads DIR (recursively, at most 8 levels; recording directories are listed, not entered;
/// hidden files and directories, a tool's own, are passed over).
/// Throws crashcap::Error{NotFound} when DIR is not a directory; everything inside that cannot
/// be read is listed in `unreadable`.
CrashSummary summarizeCrashes(const std::string& dir);

/// {"dir", "runs", "healthy", "failed", "groups": [{"classification", "signature", "error", "op",
/// "phase", "count", "runs", "bundles", "first", "last", "separated_by": [{"rule", "failing",
/// "healthy", "healthy_total"}]}], "unreadable": [{"path", "error"}], "damaged": [{"path",
/// "error"}], "skipped", "unsealed"}.
nlohmann::json crashSummaryJson(const CrashSummary& summary);
std::string crashSummaryText(const CrashSummary& summary);

}  // namespace crashcap::supervisor
