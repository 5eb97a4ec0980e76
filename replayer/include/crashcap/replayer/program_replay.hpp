#pragma once
// Replay inside the recording's own program. A recording made with Recorder::setModel holds no
// step program: its forward and loss are the user's code, compiled into the user's program. So
// crashcap replays it there: `crashcap replay` (and every bisection and triage, which replay) runs
// the recorded command line again, in the recorded working directory, with
// CRASHCAP_REPLAY_REQUEST naming a request file. The program's Recorder sees the variable,
// records nothing, and as soon as it has the model (setModel) and the step function (setStep)
// serves the request with the engine of replay_module.hpp: it writes the result file and ends the
// process, before the training loop would start. Any front end that holds a model and a step
// function serves requests through serveReplayRequest; the request and result are JSON.

#include <nlohmann/json.hpp>

#include <optional>
#include <string>

#include "crashcap/formats/error.hpp"
#include "crashcap/replayer/replay.hpp"
#include "crashcap/replayer/replay_module.hpp"

namespace crashcap::replayer {

/// Names the request file of a program started to serve a replay.
inline constexpr const char* kReplayRequestVariable = "CRASHCAP_REPLAY_REQUEST";

/// What crashcap asks of the program.
struct ReplayRequest {
  std::string bundle;        ///< absolute path
  ReplayOptions options;
  bool compare = false;      ///< ops bisection (compareWithReference) instead of a replay
  double tolerance = 1e-3;   ///< of the comparison
  /// The part of the ops bisection asked for: a module program serves Both in one process; a
  /// Python program, whose loop runs once per process, one side per request.
  ComparisonSide side = ComparisonSide::Both;
  std::string referenceOutputs;  ///< the file the Reference side writes and the Replay side reads
  std::string resultPath;    ///< where the program writes its result (absolute)
};
/// Keys: crashcap_version (of the writer), bundle, options (toJson(ReplayOptions)), compare,
/// tolerance, side (comparisonSideName; "both" when absent), reference_outputs, result_path.
nlohmann::json toJson(const ReplayRequest& r);
ReplayRequest replayRequestFromJson(const nlohmann::json& j);

/// The request of this process: read from the file kReplayRequestVariable names; nullopt when the
/// variable is not set. Throws Error (Io, Corrupt) when the file cannot be read or parsed.
std::optional<ReplayRequest> replayRequestOfThisProcess();

/// What the program hands back: exactly one of a replay, a comparison or an error.
struct ReplayOutcome {
  std::optional<ReplayResult> replay;
  std::optional<ReferenceComparison> comparison;
  std::optional<Error> error;
};
/// Keys: crashcap_version (of the program), and "replay" | "comparison" | "error" {code
/// (errorCodeName), message, hint, context}.
nlohmann::json toJson(const ReplayOutcome& o);
ReplayOutcome replayOutcomeFromJson(const nlohmann::json& j);

/// Serves `request` with the model's named tensors and its step function, and writes the outcome
/// to request.resultPath (a crashcap::Error becomes an error outcome; a C++ exception from the
/// step is a step error inside the replay, as in any replay). Returns false when the result file
/// cannot be written (said on stderr). Ends no process: the caller does.
bool serveReplayRequest(const ReplayRequest& request, const NamedTensors& parameters, const NamedTensors& buffers,
                        const StepFunction& step);

/// Writes an error outcome for a request the program cannot serve (it began a step before giving
/// its step function). Returns false when the file cannot be written.
bool writeReplayOutcome(const ReplayRequest& request, const ReplayOutcome& outcome);

}  // namespace crashcap::replayer
