#include "crashcap/investigate/results_json.hpp"

#include <fmt/format.h>

#include "crashcap/formats/error.hpp"

namespace crashcap::investigate {

using nlohmann::json;
using namespace replayer::json_fields;
using replayer::toJson;

namespace {

json sideJson(const ReplaySide& s) {
  return {{"verdict", replayer::verdictName(s.verdict)},
          {"device", s.device},
          {"dtype", s.dtype},
          {"error", nullable(s.error)},
          {"first_nonfinite_op", toJson(s.firstNonFiniteOp)}};
}

ReplaySide sideFrom(const json& j) {
  ReplaySide s;
  s.verdict = verdict(j, "verdict");
  s.device = text(j, "device");
  s.dtype = text(j, "dtype");
  s.error = optText(j, "error");
  s.firstNonFiniteOp = replayer::probedOpFromJson(j, "first_nonfinite_op");
  return s;
}

/// A list of texts under `key`.
std::vector<std::string> strings(const json& j, const char* key) {
  const json& v = at(j, key);
  if (!v.is_array()) bad(key, "an array");
  std::vector<std::string> out;
  for (const auto& x : v) {
    if (!x.is_string()) bad(key, "an array of strings");
    out.push_back(x.get<std::string>());
  }
  return out;
}

json trialJson(const Trial& t) {
  return {{"fails", t.fails},     {"passes", t.passes},   {"outcome", t.outcome},
          {"seconds", t.seconds}, {"command", t.command}, {"other_failure", nullable(t.otherFailure)}};
}

Trial trialFrom(const json& j) {
  Trial t;
  t.fails = flag(j, "fails");
  t.outcome = text(j, "outcome");
  t.passes = j.contains("passes") ? flag(j, "passes") : t.outcome == "passes";  // older results: by its outcome
  t.seconds = real(j, "seconds");
  t.command = text(j, "command");
  if (j.contains("other_failure")) t.otherFailure = optText(j, "other_failure");
  return t;
}

json configTrialJson(const ConfigTrial& t) {
  json j = {{"command", t.command}, {"seconds", t.seconds}, {"outcome", t.outcome},
            {"fails", t.fails},     {"error", nullable(t.error)}, {"other_failure", nullable(t.otherFailure)}};
  if (!t.setting.empty()) {
    j["setting"] = t.setting;
    j["recorded"] = t.recorded;
    j["value"] = t.value;
  } else {
    j["device"] = t.device;
  }
  return j;
}

ConfigTrial configTrialFrom(const json& j) {
  ConfigTrial t;
  t.command = text(j, "command");
  t.seconds = real(j, "seconds");
  t.outcome = text(j, "outcome");
  t.fails = flag(j, "fails");
  t.error = optText(j, "error");
  t.otherFailure = optText(j, "other_failure");
  if (j.contains("setting")) {
    t.setting = text(j, "setting");
    t.recorded = text(j, "recorded");
    t.value = text(j, "value");
  } else {
    t.device = text(j, "device");
  }
  return t;
}

std::vector<ConfigTrial> configTrialsFrom(const json& j, const char* key) {
  const json& v = at(j, key);
  if (!v.is_array()) bad(key, "an array");
  std::vector<ConfigTrial> out;
  for (const auto& t : v) out.push_back(configTrialFrom(t));
  return out;
}

}  // namespace

json toJson(const StepBisection& b) {
  return {{"kind", "steps"},
          {"from_keyframe", b.fromKeyframe},
          {"target", b.target},
          {"first_failing_step", b.firstFailure ? json(b.firstFailure->step) : json(nullptr)},
          {"reason", b.firstFailure ? json(b.firstFailure->reason) : json(nullptr)},
          {"diverged_at", nullable(b.divergedAt)},
          {"lost_steps", b.lostSteps},
          {"steps", toJson(b.steps)},
          {"replays", b.replays}};
}

StepBisection stepBisectionFromJson(const json& j) {
  StepBisection b;
  b.fromKeyframe = integer(j, "from_keyframe");
  b.target = integer(j, "target");
  if (auto s = optInteger(j, "first_failing_step")) b.firstFailure = replayer::FirstFailure{*s, text(j, "reason")};
  b.divergedAt = optInteger(j, "diverged_at");
  b.lostSteps = integers(at(j, "lost_steps"), "lost_steps");
  b.steps = replayer::stepReplaysFromJson(j, "steps");
  b.replays = static_cast<int>(optInteger(j, "replays").value_or(0));  // absent before it was counted
  return b;
}

json toJson(const OpBisection& b) {
  const auto narrowed = b.referenceNarrowedTo();
  return {{"kind", "ops"},
          {"step", b.step},
          {"first_nonfinite_op", toJson(b.replay.firstNonFiniteOp)},
          {"first_departing_op", toJson(b.firstDeparting)},
          {"tolerance", b.tolerance},
          {"ops_compared", b.opsCompared},
          {"stopped_because", nullable(b.stoppedBecause)},
          {"replay", sideJson(b.replay)},
          {"reference", sideJson(b.reference)},
          {"fails_in_float64", b.failsInFloat64()},
          {"reference_narrowed", narrowed ? json{{"dtype", *narrowed},
                                                 {"op", b.reference.firstNonFiniteOp->name},
                                                 {"past_range", b.referenceNarrowsPastRange()}}
                                          : json(nullptr)}};
}

OpBisection opBisectionFromJson(const json& j) {
  OpBisection b;
  b.step = integer(j, "step");
  b.replay = sideFrom(at(j, "replay"));
  b.reference = sideFrom(at(j, "reference"));
  b.firstDeparting = replayer::departingOpFromJson(j, "first_departing_op");
  b.tolerance = real(j, "tolerance");
  b.opsCompared = static_cast<uint64_t>(integer(j, "ops_compared"));
  b.stoppedBecause = optText(j, "stopped_because");
  return b;
}

json toJson(const SampleBisection& b) {
  json trials = json::array();
  for (const auto& [rows, t] : b.trials) {
    json e = trialJson(t);
    e["rows"] = rows;
    trials.push_back(e);
  }
  return {{"kind", "samples"},
          {"step", b.step},
          {"batch_size", b.batchSize},
          {"reproduced", b.reproduced},
          {"rows", b.rows},
          {"triggers", b.triggers},
          {"other_sets", b.otherSets},
          {"rest_fails", b.restFails},
          {"culprits", b.culprits()},
          {"dataset_indices", nullable(b.datasetIndices)},
          {"row_order", replayer::toJson(b.rowOrder)},
          {"replays", b.replays},
          {"replay_bound_single_row", b.replayBound},
          {"lost_steps", b.lostSteps},
          {"cuts_fail", nullable(b.cutsFail)},
          {"filled_because", nullable(b.filledBecause)},
          {"experiments", trials}};
}

SampleBisection sampleBisectionFromJson(const json& j) {
  SampleBisection b;
  b.step = integer(j, "step");
  b.batchSize = integer(j, "batch_size");
  b.reproduced = flag(j, "reproduced");
  b.rows = integers(at(j, "rows"), "rows");
  if (j.contains("triggers")) b.triggers = integers(j["triggers"], "triggers");
  if (j.contains("other_sets"))
    for (const auto& set : j["other_sets"]) b.otherSets.push_back(integers(set, "other_sets"));
  b.restFails = j.contains("rest_fails") && flag(j, "rest_fails");
  if (!at(j, "dataset_indices").is_null()) b.datasetIndices = integers(j["dataset_indices"], "dataset_indices");
  b.rowOrder = replayer::rowOrderFromJson(j, "row_order");
  b.replays = static_cast<int>(integer(j, "replays"));
  b.replayBound = static_cast<int>(integer(j, "replay_bound_single_row"));
  b.lostSteps = integers(at(j, "lost_steps"), "lost_steps");
  if (j.contains("cuts_fail")) b.cutsFail = optText(j, "cuts_fail");
  if (j.contains("filled_because")) b.filledBecause = optText(j, "filled_because");  // absent before it existed
  const json& trials = at(j, "experiments");
  if (!trials.is_array()) bad("experiments", "an array");
  for (const auto& e : trials) b.trials.emplace_back(integers(at(e, "rows"), "rows"), trialFrom(e));
  return b;
}

json toJson(const ConfigBisection& b) {
  json flips = json::array(), devices = json::array();
  for (const auto& t : b.flips) flips.push_back(configTrialJson(t));
  for (const auto& t : b.devices) devices.push_back(configTrialJson(t));
  return {{"kind", "config"},
          {"step", b.step},
          {"baseline",
           {{"device", b.baseline.device},
            {"recorded_device", nullable(b.baseline.recordedDevice)},
            {"settings", b.baseline.settings},
            {"fails", b.baseline.fails},
            {"error", nullable(b.baseline.error)},
            {"diverged_at", nullable(b.baseline.divergedAt)},
            {"command", b.baseline.command}}},
          {"flips", flips},
          {"flips_at_target", b.flipsAtTarget},
          {"devices", devices},
          {"not_tried", b.notTried},
          {"changes_outcome", b.changesOutcome},
          {"experiments", experimentLogJson(b.experiments)}};
}

ConfigBisection configBisectionFromJson(const json& j) {
  ConfigBisection b;
  b.step = integer(j, "step");
  const json& base = at(j, "baseline");
  b.baseline.device = text(base, "device");
  b.baseline.recordedDevice = optText(base, "recorded_device");
  b.baseline.settings = stringMap(base, "settings");
  b.baseline.fails = flag(base, "fails");
  b.baseline.error = optText(base, "error");
  b.baseline.command = text(base, "command");
  b.baseline.divergedAt = optInteger(base, "diverged_at");
  b.flips = configTrialsFrom(j, "flips");
  b.flipsAtTarget = j.is_object() && j.value("flips_at_target", false);  // absent before it existed
  b.devices = configTrialsFrom(j, "devices");
  if (j.contains("not_tried")) b.notTried = strings(j, "not_tried");  // absent before it existed
  b.changesOutcome = strings(j, "changes_outcome");
  return b;
}

json toJson(const JobReplay& job) {
  json ranks = json::array();
  for (const auto& r : job.ranks)
    ranks.push_back({{"rank", r.rank},
                     {"bundle", r.bundle},
                     {"verdict", nullable(r.verdict)},
                     {"replay", r.result ? toJson(*r.result) : json(nullptr)},
                     {"error", nullable(r.error)},
                     {"died_in_step", nullable(r.diedInStep)},
                     {"stopped_in_step", nullable(r.stoppedInStep)}});
  return {{"job_id", job.jobId}, {"world_size", job.worldSize}, {"rank", job.rank},   {"step", job.step},
          {"keyframe", job.keyframe}, {"notes", job.notes},         {"ranks", ranks}};
}

JobReplay jobReplayFromJson(const json& j) {
  JobReplay job;
  job.jobId = text(j, "job_id");
  job.worldSize = static_cast<int>(integer(j, "world_size"));
  job.rank = static_cast<int>(integer(j, "rank"));
  job.step = integer(j, "step");
  job.keyframe = integer(j, "keyframe");
  job.notes = strings(j, "notes");
  const auto& ranks = at(j, "ranks");
  if (!ranks.is_array()) bad("ranks", "an array");
  for (const auto& r : ranks) {
    RankReplay rr;
    rr.rank = static_cast<int>(integer(r, "rank"));
    rr.bundle = text(r, "bundle");
    rr.verdict = optText(r, "verdict");
    if (r.contains("replay") && !r["replay"].is_null()) rr.result = replayResultFromJson(r["replay"]);
    rr.error = optText(r, "error");
    rr.diedInStep = optInteger(r, "died_in_step");  // absent before it existed
    rr.stoppedInStep = optInteger(r, "stopped_in_step");
    job.ranks.push_back(std::move(rr));
  }
  return job;
}

replayer::ReplayResult bundleReplayFromJson(const json& j) {
  return j.is_object() && j.contains("ranks") ? askedRankReplay(jobReplayFromJson(j)) : replayResultFromJson(j);
}

}  // namespace crashcap::investigate
