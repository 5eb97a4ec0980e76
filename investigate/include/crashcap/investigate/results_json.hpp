#pragma once
// The child-process boundary: every result an experiment prints with --json, written and read
// back here (replays: crashcap/replayer/replay_json.hpp) and nowhere else, so the JSON a script
// sees and the struct a rule reads cannot drift apart. Non-finite numbers are written as the
// strings "nan", "inf", "-inf" (JSON has none). Readers throw Error{Corrupt} naming the key that
// is missing or has the wrong type.

#include <nlohmann/json.hpp>

#include "crashcap/investigate/bisect.hpp"
#include "crashcap/investigate/replays.hpp"
#include "crashcap/replayer/replay_json.hpp"

namespace crashcap::investigate {

using replayer::replayResultFromJson;
using replayer::toJson;

/// `crashcap replay --json` of a job's rank. Keys: job_id, world_size, rank (the bundle's, the one
/// --rows cut), step, keyframe, notes, ranks [{rank, bundle, verdict, replay (as a replay's, or
/// null), error}].
nlohmann::json toJson(const JobReplay& job);
JobReplay jobReplayFromJson(const nlohmann::json& j);

/// What an experiment's `crashcap replay B --json` says of B: its replay, or, for a job's rank
/// (the output has "ranks"), that rank's within its job's (askedRankReplay, which throws
/// Error{Unsupported} when the rank gave none).
replayer::ReplayResult bundleReplayFromJson(const nlohmann::json& j);

/// `crashcap bisect steps --json`. Keys: kind "steps", from_keyframe, target, first_failing_step,
/// reason, diverged_at, lost_steps, steps (as in replay; they stop before the first lost step).
nlohmann::json toJson(const StepBisection& b);
StepBisection stepBisectionFromJson(const nlohmann::json& j);

/// `crashcap bisect ops --json`. Keys: kind "ops", step, first_nonfinite_op, first_departing_op,
/// tolerance, ops_compared, stopped_because, replay, reference ({verdict, device, dtype, error,
/// first_nonfinite_op}), fails_in_float64, reference_narrowed (null, or {dtype, op, past_range}:
/// the reference's first non-finite output was narrower than float64).
nlohmann::json toJson(const OpBisection& b);
OpBisection opBisectionFromJson(const nlohmann::json& j);

/// `crashcap bisect samples --json`. Keys: kind "samples", step, batch_size, reproduced, rows,
/// dataset_indices, replays, replay_bound_single_row, lost_steps (non-empty: the step cannot be
/// reached, nothing was bisected), experiments [{rows, fails, outcome, seconds, command}].
nlohmann::json toJson(const SampleBisection& b);
SampleBisection sampleBisectionFromJson(const nlohmann::json& j);

/// `crashcap bisect config --json`. Keys: kind "config", step, baseline {device,
/// recorded_device, settings, fails, error, diverged_at, command}, flips [{setting, recorded, value, fails, other_failure,
/// outcome, error, command, seconds}], devices [{device, ...}], changes_outcome, experiments.
nlohmann::json toJson(const ConfigBisection& b);
ConfigBisection configBisectionFromJson(const nlohmann::json& j);

}  // namespace crashcap::investigate
