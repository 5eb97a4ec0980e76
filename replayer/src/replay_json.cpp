#include "crashcap/replayer/replay_json.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "crashcap/formats/error.hpp"

namespace crashcap::replayer {

using nlohmann::json;

namespace json_fields {

[[noreturn]] void bad(const std::string& key, const char* expected) {
  throw Error(ErrorCode::Corrupt, fmt::format("result JSON: '{}' is missing or not {}", key, expected),
              "the process that wrote it and this one must be the same crashcap build");
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

Verdict verdict(const json& j, const char* key) {
  auto v = parseVerdict(text(j, key));
  if (!v) bad(key, "a replay verdict");
  return *v;
}

}  // namespace json_fields

using namespace json_fields;

ValueStats valueStatsFromJson(const json& j) {
  ValueStats v;
  v.dtype = text(j, "dtype");
  v.shape = integers(at(j, "shape"), "shape");
  v.nanCount = integer(j, "nan_count");
  v.infCount = integer(j, "inf_count");
  v.min = optReal(j, "min");
  v.max = optReal(j, "max");
  return v;
}

namespace {

std::vector<ValueStats> valueStatsListFrom(const json& j, const char* key) {
  const json& v = at(j, key);
  if (!v.is_array()) bad(key, "an array");
  std::vector<ValueStats> out;
  for (const auto& x : v) out.push_back(valueStatsFromJson(x));
  return out;
}

json statsListJson(const std::vector<ValueStats>& values) {
  json out = json::array();
  for (const auto& v : values) out.push_back(toJson(v));
  return out;
}

}  // namespace

std::optional<ProbedOp> probedOpFromJson(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const json& o = j[key];
  ProbedOp op;
  op.name = text(o, "name");
  op.phase = text(o, "phase");
  if (o.contains("node") && o["node"].is_string()) op.node = o["node"].get<std::string>();  // absent before it existed
  op.seq = integer(o, "seq");
  op.index = static_cast<uint64_t>(integer(o, "index"));
  if (o.contains("began_at")) op.began = static_cast<uint64_t>(integer(o, "began_at"));  // absent before it existed
  op.inputs = valueStatsListFrom(o, "inputs");
  op.outputs = valueStatsListFrom(o, "outputs");
  op.afterGivenInfinity = o.contains("after_given_infinity") && o["after_given_infinity"].is_boolean() &&
                          o["after_given_infinity"].get<bool>();  // absent before it existed
  if (o.contains("unalignable")) {  // absent before it existed
    if (!o["unalignable"].is_array())
      throw Error(ErrorCode::Corrupt, fmt::format("result JSON: {}.unalignable is not a list", key));
    for (const auto& t : o["unalignable"])
      op.unalignable.push_back({integer(t, "element"), integer(t, "target_length"), integer(t, "frames_needed"),
                                integer(t, "input_length")});
  }
  if (o.contains("empty_mean") && !o["empty_mean"].is_null()) {  // absent before it existed
    const json& m = o["empty_mean"];
    if (!m.is_object()) throw Error(ErrorCode::Corrupt, fmt::format("result JSON: {}.empty_mean is not an object", key));
    EmptyMean e;
    e.empty = m.contains("empty") && m["empty"].is_boolean() && m["empty"].get<bool>();
    e.targets = integer(m, "targets");
    e.ignored = integer(m, "ignored");
    if (m.contains("ignore_index") && !m["ignore_index"].is_null()) e.ignoreIndex = integer(m, "ignore_index");
    if (m.contains("of") && m["of"].is_string()) e.of = m["of"].get<std::string>();
    op.emptyMean = e;
  }
  return op;
}

namespace {

json stepJson(const StepReplay& s) {
  return {{"step", s.step},
          {"loss", s.hasLoss ? number(s.loss) : json(nullptr)},
          {"grad_norm", s.hasGradNorm ? number(s.gradNorm) : json(nullptr)},
          {"recorded_loss", s.recorded ? number(s.recordedLoss) : json(nullptr)},
          {"recorded_grad_norm", s.recorded ? number(s.recordedGradNorm) : json(nullptr)},
          {"bitwise", s.bitwise},
          {"untrained", s.untrained},
          {"error", nullable(s.error)},
          {"lr", number(s.learningRate)},
          {"weight_norm", s.weightNorm ? number(*s.weightNorm) : json(nullptr)},
          {"weights_finite", s.weightsFinite},
          {"later_backward", s.laterBackward ? json{{"backward", s.laterBackward}, {"loss", number(s.laterLoss)}} : json(nullptr)}};
}

StepReplay stepFrom(const json& j) {
  StepReplay s;
  s.step = integer(j, "step");
  if (auto l = optReal(j, "loss")) {
    s.hasLoss = true;
    s.loss = *l;
  }
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
  s.untrained = j.contains("untrained") && flag(j, "untrained");
  s.error = optText(j, "error");
  s.learningRate = real(j, "lr");
  s.weightNorm = optReal(j, "weight_norm");
  s.weightsFinite = flag(j, "weights_finite");
  if (j.contains("later_backward") && j["later_backward"].is_object()) {
    s.laterBackward = static_cast<int32_t>(integer(j["later_backward"], "backward"));
    s.laterLoss = real(j["later_backward"], "loss");
  }
  return s;
}

}  // namespace

json toJson(const std::vector<StepReplay>& steps) {
  json out = json::array();
  for (const auto& s : steps) out.push_back(stepJson(s));
  return out;
}

std::vector<StepReplay> stepReplaysFromJson(const json& j, const char* key) {
  const json& v = at(j, key);
  if (!v.is_array()) bad(key, "an array");
  std::vector<StepReplay> out;
  for (const auto& s : v) out.push_back(stepFrom(s));
  return out;
}

json number(double v) { return std::isfinite(v) ? json(v) : json(fmt::format("{}", v)); }

double numberFrom(const json& j) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    if (s == "nan" || s == "-nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  throw Error(ErrorCode::Corrupt, fmt::format("result JSON: {} is not a number", j.dump()));
}

json toJson(const ValueStats& v) {
  return {{"dtype", v.dtype},
          {"shape", v.shape},
          {"nan_count", v.nanCount},
          {"inf_count", v.infCount},
          {"min", v.min ? number(*v.min) : json(nullptr)},
          {"max", v.max ? number(*v.max) : json(nullptr)}};
}

json unalignableJson(const std::vector<UnalignableTarget>& targets) {
  json out = json::array();
  for (const auto& t : targets)
    out.push_back({{"element", t.element},
                   {"target_length", t.targetLength},
                   {"frames_needed", t.framesNeeded},
                   {"input_length", t.inputLength}});
  return out;
}

json toJson(const std::optional<ProbedOp>& op) {
  if (!op) return nullptr;
  return {{"name", op->name},
          {"phase", op->phase},
          {"node", op->node.empty() ? json(nullptr) : json(op->node)},
          {"seq", op->seq},
          {"index", op->index},
          {"began_at", op->began},
          {"inputs", statsListJson(op->inputs)},
          {"outputs", statsListJson(op->outputs)},
          {"after_given_infinity", op->afterGivenInfinity},
          {"unalignable", unalignableJson(op->unalignable)},
          {"empty_mean", op->emptyMean ? json{{"empty", op->emptyMean->empty},
                                              {"targets", op->emptyMean->targets},
                                              {"ignored", op->emptyMean->ignored},
                                              {"ignore_index", op->emptyMean->ignoreIndex ? json(*op->emptyMean->ignoreIndex) : json(nullptr)},
                                              {"of", op->emptyMean->of.empty() ? json(nullptr) : json(op->emptyMean->of)}}
                                       : json(nullptr)}};
}

json toJson(const std::optional<BatchLoad>& load) {
  if (!load) return nullptr;
  json culprits = json::array();
  for (const auto& c : load->culprits)
    culprits.push_back({{"position", c.position}, {"index", c.index}, {"dataset_index", c.datasetIndex}, {"error", c.error}});
  return {{"indices", load->indices},
          {"dataset_indices", load->datasetIndices},
          {"error", nullable(load->error)},
          {"culprits", culprits},
          {"culprits_by", nullable(load->culpritsBy)},
          {"searched", load->searched}};
}

std::optional<BatchLoad> batchLoadFromJson(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;  // absent before it existed
  const json& b = j[key];
  BatchLoad load;
  load.indices = integers(at(b, "indices"), "indices");
  load.datasetIndices = integers(at(b, "dataset_indices"), "dataset_indices");
  load.error = optText(b, "error");
  load.culpritsBy = optText(b, "culprits_by");
  load.searched = flag(b, "searched");
  if (!at(b, "culprits").is_array()) bad("culprits", "an array");
  for (const auto& c : b["culprits"]) {
    LoadCulprit lc;
    lc.position = integer(c, "position");
    lc.index = integer(c, "index");
    lc.datasetIndex = integer(c, "dataset_index");
    lc.error = text(c, "error");
    load.culprits.push_back(std::move(lc));
  }
  return load;
}

json toJson(const std::optional<RowOrder>& order) {
  if (!order) return nullptr;
  return {{"order", order->order},
          {"dataset_indices", order->datasetIndices},
          {"why", nullable(order->why)}};
}

std::optional<RowOrder> rowOrderFromJson(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;  // absent before it existed
  const json& o = j[key];
  RowOrder order;
  order.order = text(o, "order");
  if (order.order != "sampler" && order.order != "reordered" && order.order != "partial" && order.order != "unchecked")
    bad("order", "\"sampler\", \"reordered\", \"partial\" or \"unchecked\"");
  order.datasetIndices = integers(at(o, "dataset_indices"), "dataset_indices");
  order.why = optText(o, "why");
  return order;
}

json toJson(const ReplayResult& r) {
  return {{"verdict", verdictName(r.verdict)},
          {"step", r.step},
          {"keyframe", r.keyframe},
          {"error", nullable(r.error)},
          {"recorded_error", nullable(r.recordedError)},
          {"diverged_at", nullable(r.divergedAt)},
          {"died_in_step", nullable(r.diedInStep)},
          {"stopped_in_step", nullable(r.stoppedInStep)},
          {"first_nonfinite_op", toJson(r.firstNonFiniteOp)},
          {"raising_op", toJson(r.raisingOp)},
          {"steps", toJson(r.steps)},
          {"steps_replayed", r.steps.size()},
          {"batch_size", r.batchSize},
          {"rows", r.rows.empty() ? json(nullptr) : json(r.rows)},
          {"lost_steps", r.lostSteps},
          {"notes", r.notes},
          {"load_ms", r.loadMs},
          {"replay_ms", r.replayMs},
          {"device", r.device},
          {"recorded_device", nullable(r.recordedDevice)},
          {"dtype", r.dtype},
          {"settings", r.settings},
          {"settings_at_target", r.settingsAtTarget},
          {"recorded_settings", r.recordedSettings},
          {"same_setup", r.sameSetup},
          {"threads", r.threads},
          {"keyframe_written", nullable(r.keyframeWritten)},
          {"keyframe_not_written", nullable(r.keyframeNotWritten)},
          {"batch_load", toJson(r.batchLoad)},
          {"row_order", toJson(r.rowOrder)},
          {"skipped_keyframe", r.skippedKeyframe ? json{{"step", r.skippedKeyframe->step},
                                                        {"diverged_at", r.skippedKeyframe->divergedAt}}
                                                  : json(nullptr)}};
}

ReplayResult replayResultFromJson(const json& j) {
  ReplayResult r;
  r.verdict = verdict(j, "verdict");
  r.step = integer(j, "step");
  r.keyframe = integer(j, "keyframe");
  r.error = optText(j, "error");
  r.recordedError = optText(j, "recorded_error");
  r.divergedAt = optInteger(j, "diverged_at");
  r.diedInStep = optInteger(j, "died_in_step");  // absent before it existed
  r.stoppedInStep = optInteger(j, "stopped_in_step");
  r.firstNonFiniteOp = probedOpFromJson(j, "first_nonfinite_op");
  r.raisingOp = probedOpFromJson(j, "raising_op");
  r.steps = stepReplaysFromJson(j, "steps");
  r.batchSize = integer(j, "batch_size");
  if (!at(j, "rows").is_null()) r.rows = integers(j["rows"], "rows");
  r.lostSteps = integers(at(j, "lost_steps"), "lost_steps");
  if (j.contains("notes") && j["notes"].is_array())
    for (const auto& n : j["notes"])
      if (n.is_string()) r.notes.push_back(n.get<std::string>());
  r.loadMs = real(j, "load_ms");
  r.replayMs = real(j, "replay_ms");
  r.device = text(j, "device");
  r.recordedDevice = optText(j, "recorded_device");
  r.dtype = text(j, "dtype");
  r.settings = stringMap(j, "settings");
  r.settingsAtTarget = j.is_object() && j.value("settings_at_target", false);  // absent before it existed
  r.recordedSettings = stringMap(j, "recorded_settings");
  r.sameSetup = flag(j, "same_setup");
  r.threads = static_cast<int>(integer(j, "threads"));
  r.keyframeWritten = optInteger(j, "keyframe_written");  // both absent before they existed
  r.keyframeNotWritten = optText(j, "keyframe_not_written");
  r.batchLoad = batchLoadFromJson(j, "batch_load");
  r.rowOrder = rowOrderFromJson(j, "row_order");
  if (j.is_object() && j.contains("skipped_keyframe") && !j["skipped_keyframe"].is_null()) {  // absent before it existed
    const auto& k = j["skipped_keyframe"];
    r.skippedKeyframe = ReplayResult::SkippedKeyframe{integer(k, "step"), integer(k, "diverged_at")};
  }
  return r;
}

json toJson(const ReplayOptions& o) {
  return {{"step", o.step},         {"instrument", o.instrument}, {"device", o.device},
          {"dtype", o.dtype},       {"settings", o.settings},     {"rows", o.rows},
          {"settings_at_target", o.settingsAtTarget},
          {"from_earliest_keyframe", o.fromEarliestKeyframe}, {"allow_changed_sources", o.allowChangedSources},
          {"keyframe_out", o.keyframeOut}, {"keyframe", o.keyframe},
          {"progress_path", o.progressPath}};
}

ReplayOptions replayOptionsFromJson(const json& j) {
  ReplayOptions o;
  o.step = integer(j, "step");
  o.instrument = flag(j, "instrument");
  o.device = text(j, "device");
  o.dtype = text(j, "dtype");
  o.settings = stringMap(j, "settings");
  o.settingsAtTarget = j.is_object() && j.value("settings_at_target", false);  // absent before it existed
  o.rows = integers(at(j, "rows"), "rows");
  o.fromEarliestKeyframe = flag(j, "from_earliest_keyframe");
  o.allowChangedSources = j.is_object() && j.value("allow_changed_sources", false);  // absent before it existed
  o.keyframeOut = optText(j, "keyframe_out");
  o.keyframe = j.is_object() && j.contains("keyframe") && j["keyframe"].is_number_integer() ? j["keyframe"].get<int64_t>() : -1;
  o.progressPath = optText(j, "progress_path");  // absent before it existed
  return o;
}

json toJson(const std::optional<DepartingOp>& op) {
  if (!op) return nullptr;
  const auto& d = *op;
  return {{"name", d.name},         {"phase", d.phase},
          {"index", d.index},       {"error", number(d.error)},
          {"elements", d.elements}, {"replayed", toJson(d.replayed)},
          {"reference", toJson(d.reference)}};
}

std::optional<DepartingOp> departingOpFromJson(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const json& d = j[key];
  DepartingOp op;
  op.name = text(d, "name");
  op.phase = text(d, "phase");
  op.index = static_cast<uint64_t>(integer(d, "index"));
  op.error = real(d, "error");
  op.elements = integer(d, "elements");
  op.replayed = valueStatsFromJson(at(d, "replayed"));
  op.reference = valueStatsFromJson(at(d, "reference"));
  return op;
}

json toJson(const ReferenceComparison& c) {
  return {{"replay", toJson(c.replay)},
          {"reference", toJson(c.reference)},
          {"ops_compared", c.opsCompared},
          {"first_departing_op", toJson(c.firstDeparting)},
          {"stopped_because", nullable(c.stoppedBecause)},
          {"tolerance", c.tolerance}};
}

ReferenceComparison referenceComparisonFromJson(const json& j) {
  ReferenceComparison c;
  c.replay = replayResultFromJson(at(j, "replay"));
  c.reference = replayResultFromJson(at(j, "reference"));
  c.opsCompared = static_cast<uint64_t>(integer(j, "ops_compared"));
  c.firstDeparting = departingOpFromJson(j, "first_departing_op");
  c.stoppedBecause = optText(j, "stopped_because");
  c.tolerance = real(j, "tolerance");
  return c;
}

}  // namespace crashcap::replayer
