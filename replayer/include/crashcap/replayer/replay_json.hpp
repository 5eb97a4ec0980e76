#pragma once
// Replay results as JSON, written and read back here and nowhere else: `crashcap replay --json`
// prints them, investigations read them back from their child replays, and a program that serves
// a replay request (program_replay.hpp) hands its result to crashcap through them. Non-finite
// numbers are written as the strings "nan", "inf", "-inf" (JSON has none). Readers throw
// Error{Corrupt} naming the key that is missing or has the wrong type.

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "crashcap/replayer/replay.hpp"

namespace crashcap::replayer {

/// `crashcap replay --json`. Keys: verdict, step, keyframe, error, recorded_error, diverged_at,
/// first_nonfinite_op, raising_op (both {name, phase, seq, index, inputs, outputs, after_given_infinity, unalignable, empty_mean} or null), steps [{step, loss, grad_norm, recorded_loss, recorded_grad_norm, bitwise,
/// error, lr, weight_norm, weights_finite}], steps_replayed, batch_size, rows, lost_steps (verdict
/// "recording-incomplete": the steps of the window the recording lost), load_ms, replay_ms, device,
/// recorded_device, dtype, settings, recorded_settings, same_setup, threads, keyframe_written (the
/// step of the keyframe ReplayOptions::keyframeOut asked for, or null), keyframe_not_written (why not).
nlohmann::json toJson(const ReplayResult& r);
ReplayResult replayResultFromJson(const nlohmann::json& j);

/// The per-step list of a replay ("steps" above).
nlohmann::json toJson(const std::vector<StepReplay>& steps);
std::vector<StepReplay> stepReplaysFromJson(const nlohmann::json& j, const char* key);

/// Keys: step, instrument, device, dtype, settings, rows, from_earliest_keyframe,
/// allow_changed_sources, keyframe_out.
nlohmann::json toJson(const ReplayOptions& o);
ReplayOptions replayOptionsFromJson(const nlohmann::json& j);

/// Keys: name, phase, index, error, elements, replayed, reference.
nlohmann::json toJson(const std::optional<DepartingOp>& op);
std::optional<DepartingOp> departingOpFromJson(const nlohmann::json& j, const char* key);

/// Keys: replay, reference (each as toJson(ReplayResult)), ops_compared, first_departing_op,
/// stopped_because, tolerance.
nlohmann::json toJson(const ReferenceComparison& c);
ReferenceComparison referenceComparisonFromJson(const nlohmann::json& j);

nlohmann::json toJson(const ValueStats& v);
ValueStats valueStatsFromJson(const nlohmann::json& j);
nlohmann::json toJson(const std::optional<ProbedOp>& op);
std::optional<ProbedOp> probedOpFromJson(const nlohmann::json& j, const char* key);
/// Keys: indices, dataset_indices, error, culprits ([{position, index, dataset_index, error}]),
/// culprits_by, searched; null for none.
nlohmann::json toJson(const std::optional<BatchLoad>& load);
std::optional<BatchLoad> batchLoadFromJson(const nlohmann::json& j, const char* key);
nlohmann::json toJson(const std::optional<RowOrder>& order);
std::optional<RowOrder> rowOrderFromJson(const nlohmann::json& j, const char* key);

/// A number as JSON: finite as is, NaN and infinities as "nan", "inf", "-inf".
nlohmann::json number(double v);
/// The inverse of number().
double numberFrom(const nlohmann::json& j);

/// Typed field readers over a JSON object, each throwing Error{Corrupt} that names the key; the
/// `opt` forms take a missing key or null as none. Shared by every reader of crashcap's JSON.
namespace json_fields {
const nlohmann::json& at(const nlohmann::json& j, const char* key);
std::string text(const nlohmann::json& j, const char* key);
std::string optText(const nlohmann::json& j, const char* key);
int64_t integer(const nlohmann::json& j, const char* key);
std::optional<int64_t> optInteger(const nlohmann::json& j, const char* key);
double real(const nlohmann::json& j, const char* key);
std::optional<double> optReal(const nlohmann::json& j, const char* key);
bool flag(const nlohmann::json& j, const char* key);
std::vector<int64_t> integers(const nlohmann::json& v, const char* key);
std::map<std::string, std::string> stringMap(const nlohmann::json& j, const char* key);
Verdict verdict(const nlohmann::json& j, const char* key);
/// `key` names what was expected and is missing or has the wrong type.
[[noreturn]] void bad(const std::string& key, const char* expected);
/// "" and nullopt as null.
nlohmann::json nullable(const std::string& s);
template <typename T>
nlohmann::json nullable(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}
}  // namespace json_fields

}  // namespace crashcap::replayer
