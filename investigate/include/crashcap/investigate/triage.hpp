#pragma once
// `crashcap triage`: a fixed plan of experiments (replay, bisect steps, samples, ops and config,
// and the batch without its culprit rows), then a table of hypotheses, each judged by one rule:
// a pure function of the typed facts the experiments established. A rule reads structs, never
// JSON, and never another rule's output; `judge` applies them in table order.
//
// Adding a hypothesis: write its rule (Hypothesis fn(const TriageFacts&)), add a row to the table
// in triage_rules.cpp, give it confirmed, refuted and inconclusive unit tests
// (tests/investigate/triage_rules_test.cpp) and a line in docs/REPLAY.md. CONTRIBUTING.md.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "crashcap/investigate/bisect.hpp"
#include "crashcap/investigate/experiments.hpp"
#include "crashcap/replayer/replay.hpp"

namespace crashcap::investigate {

/// What a rule concludes about its hypothesis.
enum class HypothesisVerdict { Confirmed, Refuted, Inconclusive };
/// "confirmed", "refuted", "inconclusive".
const char* verdictName(HypothesisVerdict verdict);

struct Hypothesis {
  std::string id;                          ///< "invalid-data", "loss-numerics", ...
  HypothesisVerdict verdict = HypothesisVerdict::Inconclusive;
  std::vector<std::string> evidence;       ///< sentences, most telling first
  std::string rerun;                       ///< the crashcap command behind the evidence
};

/// Something odd in one culprit row of one batch tensor.
struct RowFinding {
  enum class Kind {
    NonFinite,  ///< holds NaN or Inf values (nanCount, infCount)
    AllZeros,   ///< every element is zero
    Value,      ///< a one-element integer row: its value (a label, a token id)
  };
  int64_t row = 0;
  std::string tensor;                      ///< the bundle's tensor name, "steps/6/batch/label"
  Kind kind = Kind::Value;
  uint64_t nanCount = 0, infCount = 0;
  int64_t value = 0;
};

/// The number of classes a classification loss saw, from the op trace.
struct LossClasses {
  int64_t classes = 0;
  std::vector<int64_t> logitsShape;
};

/// Everything the rules judge from. Each experiment's result is absent when it did not run or
/// did not finish (its Experiment says why).
struct TriageFacts {
  std::string bundle;
  std::optional<replayer::ReplayResult> replay;      ///< the failing step, as recorded
  std::string replayOutcome;                         ///< the replay experiment's outcome when it gave no result
  std::optional<StepBisection> steps;
  std::optional<SampleBisection> samples;
  std::optional<replayer::ReplayResult> withoutRows; ///< the failing step without the culprit rows
  std::optional<OpBisection> ops;
  std::optional<ConfigBisection> config;
  std::vector<RowFinding> rowFindings;               ///< of the culprit rows
  std::optional<LossClasses> lossClasses;

  /// The replay brought the recorded failure back.
  bool reproduced() const { return replay && replayer::reproduces(replay->verdict); }
  /// The culprit rows sample bisection found (empty when it found none or did not run).
  std::vector<int64_t> culpritRows() const;
  /// The failing step (-1 unknown).
  int64_t step() const { return replay ? replay->step : -1; }
  /// Why replay could not test the failing step at all (it did not run, or the recording lost a
  /// step on the way), as evidence; nullopt when it could. A rule that needs the failing step
  /// says this instead of reading an absence of failure as a finding.
  std::optional<std::string> replayBlocked() const;
};

// The rules, one per hypothesis.
/// The failure needs these rows and goes away without them; what is odd in them.
Hypothesis judgeInvalidData(const TriageFacts& f);
/// The first non-finite value is made by an op from finite inputs.
Hypothesis judgeLossNumerics(const TriageFacts& f);
/// The weights run away over the steps before the failure.
Hypothesis judgeOptimizerDivergence(const TriageFacts& f);
/// Another device makes the failure come or go.
Hypothesis judgeDeviceSpecific(const TriageFacts& f);
/// A single setting change makes the failure come or go.
Hypothesis judgeConfigDependent(const TriageFacts& f);
/// Replay departs from the recording before the failing step.
Hypothesis judgeNondeterminism(const TriageFacts& f);

/// One row of the rule table.
struct TriageRule {
  const char* id;
  Hypothesis (*judge)(const TriageFacts&);
};
/// The rules in the order the table prints them.
const std::vector<TriageRule>& triageRules();
/// Every rule applied to `facts`, in table order.
std::vector<Hypothesis> judge(const TriageFacts& facts);

/// Where the failure is: step, rows (only when invalid-data is confirmed: any single row fails a
/// run that diverged), op, and the changes that make it come or go.
struct Culprit {
  std::optional<int64_t> step;
  std::optional<std::vector<int64_t>> rows, datasetIndices;
  std::optional<std::string> op, phase;
  std::optional<std::vector<std::string>> changes;
};
Culprit findCulprit(const TriageFacts& facts, const std::vector<Hypothesis>& hypotheses);

struct Triage {
  TriageFacts facts;
  std::vector<Hypothesis> hypotheses;
  Culprit culprit;
  std::vector<Experiment> experiments;
};

struct TriageOptions {
  ExperimentOptions experiments;
};

/// Runs the plan on `bundle` and judges it. Throws crashcap::Error when the bundle cannot be
/// read; a failed experiment is a missing fact, not an error.
Triage runTriage(const std::string& bundle, const TriageOptions& options = {});

/// What is odd in `rows` of step `step`'s batch (the dataset index tensor excluded).
std::vector<RowFinding> findRowOddities(const std::string& bundle, int64_t step, const std::vector<int64_t>& rows);
/// The classes the newest classification loss in the bundle's op trace saw; nullopt when none.
std::optional<LossClasses> findLossClasses(const std::string& bundle);

/// `crashcap triage --json`: bundle, reproduced, verdict, step, hypotheses [{id, verdict,
/// evidence, rerun}], culprit {step, rows, dataset_indices, op, phase, changes}, experiments.
/// `withReplay` adds the replay result (the report uses it).
nlohmann::json toJson(const Triage& t, bool withReplay = false);
nlohmann::json toJson(const Hypothesis& h);

}  // namespace crashcap::investigate
