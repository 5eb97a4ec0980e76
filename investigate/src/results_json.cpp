#include "crashcap/investigate/results_json.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "crashcap/formats/error.hpp"

namespace crashcap::investigate {

using nlohmann::json;
using replayer::NonFiniteOp;
using replayer::ReplayResult;
using replayer::StepReplay;
using replayer::ValueStats;

namespace {

[[noreturn]] void bad(const std::string& key, const char* expected) {
  throw Error(ErrorCode::Corrupt, fmt::format("experiment result: '{}' is missing or not {}", key, expected),
              "the child crashcap and this one must be the same build");
}

const json& at(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) bad(key, "present");
  return j[key];
}

std::string text(const json& j, const char* key) {
  const json& v = at(j, key);
  if (!v.is_string()) bad(key, "a string");
  return v.get<std::string>();
}

/// A string that may be null ("" then).
std::string optText(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return "";
  return text(j, key);
}

int64_t integer(const json& j, const char* key) {
  const json& v = at(j, key);
  if (!v.is_number_integer()) bad(key, "an integer");
  return v.get<int64_t>();
}

std::optional<int64_t> optInteger(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return integer(j, key);
}

double real(const json& j, const char* key) {
  const json& v = at(j, key);
  if (!v.is_number() && !v.is_string()) bad(key, "a number");
  return numberFrom(v);
}

std::optional<double> optReal(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return real(j, key);
}

bool flag(const json& j, const char* key) {
  const json& v = at(j, key);
  if (!v.is_boolean()) bad(key, "true or false");
  return v.get<bool>();
}

std::vector<int64_t> integers(const json& v, const char* key) {
  if (!v.is_array()) bad(key, "an array");
  std::vector<int64_t> out;
  for (const auto& x : v) {
    if (!x.is_number_integer()) bad(key, "an array of integers");
    out.push_back(x.get<int64_t>());
  }
  return out;
}

std::map<std::string, std::string> stringMap(const json& j, const char* key) {
  const json& v = at(j, key);
  if (!v.is_object()) bad(key, "an object");
  std::map<std::string, std::string> out;
  for (const auto& [k, x] : v.items()) {
    if (!x.is_string()) bad(key, "an object of strings");
    out[k] = x.get<std::string>();
  }
  return out;
}

json nullable(const std::string& s) { return s.empty() ? json(nullptr) : json(s); }
template <typename T>
json nullable(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

replayer::Verdict verdictFrom(const json& j, const char* key) {
  auto v = replayer::parseVerdict(text(j, key));
  if (!v) bad(key, "a replay verdict");
  return *v;
}

ValueStats valueStatsFrom(const json& j) {
  ValueStats v;
  v.dtype = text(j, "dtype");
  v.shape = integers(at(j, "shape"), "shape");
  v.nanCount = integer(j, "nan_count");
  v.infCount = integer(j, "inf_count");
  v.min = optReal(j, "min");
  v.max = optReal(j, "max");
  return v;
}

std::vector<ValueStats> valueStatsListFrom(const json& j, const char* key) {
  const json& v = at(j, key);
  if (!v.is_array()) bad(key, "an array");
  std::vector<ValueStats> out;
  for (const auto& x : v) out.push_back(valueStatsFrom(x));
  return out;
}

json statsListJson(const std::vector<ValueStats>& values) {
  json out = json::array();
  for (const auto& v : values) out.push_back(toJson(v));
  return out;
}

std::optional<NonFiniteOp> nonFiniteOpFrom(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const json& o = j[key];
  NonFiniteOp op;
  op.name = text(o, "name");
  op.phase = text(o, "phase");
  op.seq = integer(o, "seq");
  op.index = static_cast<uint64_t>(integer(o, "index"));
  op.inputs = valueStatsListFrom(o, "inputs");
  op.outputs = valueStatsListFrom(o, "outputs");
  return op;
}

json stepJson(const StepReplay& s) {
  return {{"step", s.step},
          {"loss", number(s.loss)},
          {"grad_norm", s.hasGradNorm ? number(s.gradNorm) : json(nullptr)},
          {"recorded_loss", s.recorded ? number(s.recordedLoss) : json(nullptr)},
          {"recorded_grad_norm", s.recorded ? number(s.recordedGradNorm) : json(nullptr)},
          {"bitwise", s.bitwise},
          {"error", nullable(s.error)},
          {"lr", number(s.learningRate)},
          {"weight_norm", s.weightNorm ? number(*s.weightNorm) : json(nullptr)},
          {"weights_finite", s.weightsFinite}};
}

StepReplay stepFrom(const json& j) {
  StepReplay s;
  s.step = integer(j, "step");
  s.loss = real(j, "loss");
  if (auto g = optReal(j, "grad_norm")) {
    s.hasGradNorm = true;
    s.gradNorm = *g;
  }
  if (auto l = optReal(j, "recorded_loss")) {
    s.recorded = true;
    s.recordedLoss = *l;
    s.recordedGradNorm = optReal(j, "recorded_grad_norm").value_or(0);
  }
  s.bitwise = flag(j, "bitwise");
  s.error = optText(j, "error");
  s.learningRate = real(j, "lr");
  s.weightNorm = optReal(j, "weight_norm");
  s.weightsFinite = flag(j, "weights_finite");
  return s;
}

json stepsJson(const std::vector<StepReplay>& steps) {
  json out = json::array();
  for (const auto& s : steps) out.push_back(stepJson(s));
  return out;
}

std::vector<StepReplay> stepsFrom(const json& j, const char* key) {
  const json& v = at(j, key);
  if (!v.is_array()) bad(key, "an array");
  std::vector<StepReplay> out;
  for (const auto& s : v) out.push_back(stepFrom(s));
  return out;
}

json sideJson(const ReplaySide& s) {
  return {{"verdict", replayer::verdictName(s.verdict)},
          {"device", s.device},
          {"dtype", s.dtype},
          {"error", nullable(s.error)},
          {"first_nonfinite_op", toJson(s.firstNonFiniteOp)}};
}

ReplaySide sideFrom(const json& j) {
  ReplaySide s;
  s.verdict = verdictFrom(j, "verdict");
  s.device = text(j, "device");
  s.dtype = text(j, "dtype");
  s.error = optText(j, "error");
  s.firstNonFiniteOp = nonFiniteOpFrom(j, "first_nonfinite_op");
  return s;
}

json trialJson(const Trial& t) {
  return {{"fails", t.fails}, {"outcome", t.outcome}, {"seconds", t.seconds}, {"command", t.command}};
}

Trial trialFrom(const json& j) {
  Trial t;
  t.fails = flag(j, "fails");
  t.outcome = text(j, "outcome");
  t.seconds = real(j, "seconds");
  t.command = text(j, "command");
  return t;
}

json configTrialJson(const ConfigTrial& t) {
  json j = {{"command", t.command}, {"seconds", t.seconds}, {"outcome", t.outcome},
            {"fails", t.fails},     {"error", nullable(t.error)}};
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

json number(double v) { return std::isfinite(v) ? json(v) : json(fmt::format("{}", v)); }

double numberFrom(const json& j) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    if (s == "nan" || s == "-nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  throw Error(ErrorCode::Corrupt, fmt::format("experiment result: {} is not a number", j.dump()));
}

json toJson(const ValueStats& v) {
  return {{"dtype", v.dtype},
          {"shape", v.shape},
          {"nan_count", v.nanCount},
          {"inf_count", v.infCount},
          {"min", v.min ? number(*v.min) : json(nullptr)},
          {"max", v.max ? number(*v.max) : json(nullptr)}};
}

json toJson(const std::optional<NonFiniteOp>& op) {
  if (!op) return nullptr;
  return {{"name", op->name},
          {"phase", op->phase},
          {"seq", op->seq},
          {"index", op->index},
          {"inputs", statsListJson(op->inputs)},
          {"outputs", statsListJson(op->outputs)}};
}

json toJson(const ReplayResult& r) {
  return {{"verdict", replayer::verdictName(r.verdict)},
          {"step", r.step},
          {"keyframe", r.keyframe},
          {"error", nullable(r.error)},
          {"recorded_error", nullable(r.recordedError)},
          {"diverged_at", nullable(r.divergedAt)},
          {"first_nonfinite_op", toJson(r.firstNonFiniteOp)},
          {"steps", stepsJson(r.steps)},
          {"steps_replayed", r.steps.size()},
          {"batch_size", r.batchSize},
          {"rows", r.rows.empty() ? json(nullptr) : json(r.rows)},
          {"lost_steps", r.lostSteps},
          {"load_ms", r.loadMs},
          {"replay_ms", r.replayMs},
          {"device", r.device},
          {"recorded_device", nullable(r.recordedDevice)},
          {"dtype", r.dtype},
          {"settings", r.settings},
          {"recorded_settings", r.recordedSettings},
          {"same_setup", r.sameSetup},
          {"threads", r.threads}};
}

ReplayResult replayResultFromJson(const json& j) {
  ReplayResult r;
  r.verdict = verdictFrom(j, "verdict");
  r.step = integer(j, "step");
  r.keyframe = integer(j, "keyframe");
  r.error = optText(j, "error");
  r.recordedError = optText(j, "recorded_error");
  r.divergedAt = optInteger(j, "diverged_at");
  r.firstNonFiniteOp = nonFiniteOpFrom(j, "first_nonfinite_op");
  r.steps = stepsFrom(j, "steps");
  r.batchSize = integer(j, "batch_size");
  if (!at(j, "rows").is_null()) r.rows = integers(j["rows"], "rows");
  r.lostSteps = integers(at(j, "lost_steps"), "lost_steps");
  r.loadMs = real(j, "load_ms");
  r.replayMs = real(j, "replay_ms");
  r.device = text(j, "device");
  r.recordedDevice = optText(j, "recorded_device");
  r.dtype = text(j, "dtype");
  r.settings = stringMap(j, "settings");
  r.recordedSettings = stringMap(j, "recorded_settings");
  r.sameSetup = flag(j, "same_setup");
  r.threads = static_cast<int>(integer(j, "threads"));
  return r;
}

json toJson(const StepBisection& b) {
  return {{"kind", "steps"},
          {"from_keyframe", b.fromKeyframe},
          {"target", b.target},
          {"first_failing_step", b.firstFailure ? json(b.firstFailure->step) : json(nullptr)},
          {"reason", b.firstFailure ? json(b.firstFailure->reason) : json(nullptr)},
          {"diverged_at", nullable(b.divergedAt)},
          {"lost_steps", b.lostSteps},
          {"steps", stepsJson(b.steps)}};
}

StepBisection stepBisectionFromJson(const json& j) {
  StepBisection b;
  b.fromKeyframe = integer(j, "from_keyframe");
  b.target = integer(j, "target");
  if (auto s = optInteger(j, "first_failing_step")) b.firstFailure = replayer::FirstFailure{*s, text(j, "reason")};
  b.divergedAt = optInteger(j, "diverged_at");
  b.lostSteps = integers(at(j, "lost_steps"), "lost_steps");
  b.steps = stepsFrom(j, "steps");
  return b;
}

json toJson(const OpBisection& b) {
  json departing = nullptr;
  if (b.firstDeparting) {
    const auto& d = *b.firstDeparting;
    departing = {{"name", d.name},         {"phase", d.phase},
                 {"index", d.index},       {"error", number(d.error)},
                 {"elements", d.elements}, {"replayed", toJson(d.replayed)},
                 {"reference", toJson(d.reference)}};
  }
  return {{"kind", "ops"},
          {"step", b.step},
          {"first_nonfinite_op", toJson(b.replay.firstNonFiniteOp)},
          {"first_departing_op", departing},
          {"tolerance", b.tolerance},
          {"ops_compared", b.opsCompared},
          {"stopped_because", nullable(b.stoppedBecause)},
          {"replay", sideJson(b.replay)},
          {"reference", sideJson(b.reference)},
          {"fails_in_float64", b.failsInFloat64()}};
}

OpBisection opBisectionFromJson(const json& j) {
  OpBisection b;
  b.step = integer(j, "step");
  b.replay = sideFrom(at(j, "replay"));
  b.reference = sideFrom(at(j, "reference"));
  if (!at(j, "first_departing_op").is_null()) {
    const json& d = j["first_departing_op"];
    replayer::DepartingOp op;
    op.name = text(d, "name");
    op.phase = text(d, "phase");
    op.index = static_cast<uint64_t>(integer(d, "index"));
    op.error = real(d, "error");
    op.elements = integer(d, "elements");
    op.replayed = valueStatsFrom(at(d, "replayed"));
    op.reference = valueStatsFrom(at(d, "reference"));
    b.firstDeparting = op;
  }
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
          {"dataset_indices", nullable(b.datasetIndices)},
          {"replays", b.replays},
          {"replay_bound_single_row", b.replayBound},
          {"lost_steps", b.lostSteps},
          {"experiments", trials}};
}

SampleBisection sampleBisectionFromJson(const json& j) {
  SampleBisection b;
  b.step = integer(j, "step");
  b.batchSize = integer(j, "batch_size");
  b.reproduced = flag(j, "reproduced");
  b.rows = integers(at(j, "rows"), "rows");
  if (!at(j, "dataset_indices").is_null()) b.datasetIndices = integers(j["dataset_indices"], "dataset_indices");
  b.replays = static_cast<int>(integer(j, "replays"));
  b.replayBound = static_cast<int>(integer(j, "replay_bound_single_row"));
  b.lostSteps = integers(at(j, "lost_steps"), "lost_steps");
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
            {"command", b.baseline.command}}},
          {"flips", flips},
          {"devices", devices},
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
  b.flips = configTrialsFrom(j, "flips");
  b.devices = configTrialsFrom(j, "devices");
  const json& changes = at(j, "changes_outcome");
  if (!changes.is_array()) bad("changes_outcome", "an array");
  for (const auto& c : changes) {
    if (!c.is_string()) bad("changes_outcome", "an array of strings");
    b.changesOutcome.push_back(c.get<std::string>());
  }
  return b;
}

}  // namespace crashcap::investigate
