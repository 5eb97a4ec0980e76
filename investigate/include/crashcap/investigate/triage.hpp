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
#include <string_view>
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

/// The values an op accepts in an index input, read from the op trace (an embedding's rows, a
/// classification loss's classes, the positions a gather or a scatter indexes) or from the step's
/// error ("index 9 is out of bounds for dimension 1 with size 4"). Valid values are 0..size-1.
struct IndexDomain {
  std::string op;                          ///< "aten::embedding"; empty when read from the error
  int64_t size = 0;
  std::vector<int64_t> indexShape;         ///< the shape of the op's index input; empty from the error
  std::vector<int64_t> sourceShape;        ///< the table's, the logits' or the indexed tensor's shape
  /// A loss's ignore_index, a value outside 0..size-1 that it skips (the op trace keeps no scalar
  /// values: PyTorch's default, -100, unless the batch's rows that work share one other negative
  /// value, which is then the program's); none for an embedding.
  std::optional<int64_t> ignoreIndex;
  /// Read from the step's error: the index value it names and the dimension it indexed (-1 for a
  /// loss's target, whose wording names none). Such a domain has no index shape, so it applies
  /// only to a tensor whose culprit rows hold that value.
  std::optional<int64_t> raisedValue{};
  int64_t raisedDim = -1;
  /// Set where the domain was applied to a batch tensor of this shape, of which the op's index
  /// input is only a part by shape (a slice, `tokens[:, :-1]`, or a column, `labels[:, 0]`).
  std::vector<int64_t> wholeShape{};
  /// Judging a batch no step took (another loader's, findOtherBatchOddities): a negative value is
  /// taken for padding (-100, -1), not an index outside; one the error names is its own domain's.
  bool negativesInside = false;
  /// "the embedding has 32 rows (table [32,8])", "the loss sees 10 classes (logits [32,10])".
  std::string describe() const;
};

/// At most this many untested findings (TriageFacts::untestedRowFindings) are kept.
inline constexpr size_t kListedUntestedFindings = 8;

/// The index domain the text of an error names, as PyTorch's index checks word it ("index 9 is out
/// of bounds for dimension 1 with size 4": gather, scatter, advanced indexing), or a classification
/// loss's ("Target 9 is out of bounds.": nll_loss, cross_entropy), whose wording has no size: that
/// is the newest loss domain among `traced` (the op trace's, newest first), the loss that raised;
/// nullopt otherwise.
std::optional<IndexDomain> domainOfError(const std::string& error, const std::vector<IndexDomain>& traced = {});

/// The step's first non-finite op when it has no finite result below 0 (aten::log, log2, log10,
/// sqrt, rsqrt) and the replay saw it given a negative value: the lowest it was given. A culprit
/// row whose lowest value is that very value, where the batch's other rows hold no negative, is
/// what the op took; it is judged so even in a batch too small for the batch's own evidence that
/// the tensor is never negative (RowFinding::Negative).
struct ValueFloor {
  std::string op;                          ///< "aten::log"
  double given = 0;                        ///< the lowest value of its inputs, < 0
};
std::optional<ValueFloor> valueFloorOf(const replayer::ProbedOp& op);

/// The step's first op to go non-finite where it has no finite result at 0 (a division, a log, a
/// reciprocal, a negative power) and the input it cannot take 0 in (a division's divisor, the
/// others' first) reaches 0 (its lowest or highest value is 0): a 0 of the data may be what it was
/// given.
struct ZeroGiven {
  std::string op;     ///< "aten::div"
  std::string phase;  ///< "backward"
};
std::optional<ZeroGiven> zeroGivenOf(const replayer::ProbedOp& op);

/// Something in one culprit row of one batch tensor, judged against the op's domain and the
/// batch's other rows: ordinary values are never findings.
struct RowFinding {
  enum class Kind {
    NonFinite,    ///< holds NaN or Inf values (nanCount, infCount)
    OutOfDomain,  ///< an integer value outside an op's IndexDomain (value, domain)
    Outlier,      ///< its largest magnitude (value) far beyond every other row's (othersMax), in the
                  ///< whole row or in one feature (column)
    AllZeros,     ///< every element is zero where the other rows are not: a trait, not invalid
    Negative,     ///< holds negative values (value: the lowest) where every other row is >= 0
    LoneZero,     ///< a single integer 0 where every other row's is positive (othersMin..othersMax),
                  ///< in a tensor no op indexes with: an empty length or count; a trait, not invalid
    ZeroGiven,    ///< floating values exactly 0 (count in `value`, the first in `column`) where no
                  ///< value of the other rows is, and the step's first NaN/Inf is an op's that was
                  ///< given a 0 (`zero`): what it may have divided by; a trait, not invalid
  };
  int64_t row = 0;
  std::string tensor;                      ///< the bundle's tensor name, "steps/6/batch/label"
  Kind kind = Kind::NonFinite;
  uint64_t nanCount = 0, infCount = 0;
  double value = 0;
  double othersMax = 0;
  double othersMin = 0;                    ///< LoneZero: the other rows' smallest value
  int64_t column = -1;                     ///< Outlier in one feature of a [rows, features] tensor
  std::optional<IndexDomain> domain;
  /// Negative: the step's ValueFloor whose op was given this row's lowest value, where the batch
  /// alone was too small to tell.
  std::optional<ValueFloor> floor;
  std::optional<ZeroGiven> zero;           ///< ZeroGiven: the op given a 0
  /// OutOfDomain: other ops whose index input has this tensor's shape too, each with the row's
  /// first value outside its domain (none: the row fits it). The op trace keeps shapes, not which
  /// tensor an op took, so where a batch holds inputs and targets of one shape (a language
  /// model's tokens and next tokens) the row may feed either; the finding says so.
  std::vector<std::pair<IndexDomain, std::optional<double>>> otherDomains;
  bool oneElement = false;                 ///< the row is a single value (a label), not a vector
  /// The row's dataset index, set where no sample bisection names it (an untested finding).
  std::optional<int64_t> datasetIndex;
  /// A value the training cannot have meant: non-finite, outside an op's domain, a far outlier.
  bool invalid() const { return kind != Kind::AllZeros && kind != Kind::LoneZero && kind != Kind::ZeroGiven; }
};

/// A rank of a multi-process job, triaged with its job: every experiment replays all the job's
/// ranks together (replayJob), and the rows it cuts are this rank's.
struct JobTriage {
  std::string jobId;
  int worldSize = 0;
  int rank = -1;                           ///< the rank triaged: the one whose rows are bisected
  int askedRank = -1;                      ///< the rank of the bundle asked for
  std::string askedBundle;
  int firstFailed = -1;                    ///< the rank that failed first on its own, by the job's story; -1 unknown
  /// Every rank's verdict in the replay that reproduces the failure ("" when it gave none).
  std::vector<std::pair<int, std::string>> verdicts;
};

/// A step's batch with fewer rows than the batches before it had: often the last, partial batch of
/// an epoch whose dataset the batch size does not divide (DataLoader's drop_last=False).
struct ShortBatch {
  int64_t rows = 0;         ///< the step's
  int64_t usualRows = 0;    ///< the rows most of the earlier recorded steps had
  int64_t stepsUsual = 0;   ///< how many earlier recorded steps had usualRows
};

/// One row of a padded batch that alone reaches further along a dimension than every other row,
/// which is zero beyond: the batch's padded size is that row's. Cutting rows from the recorded
/// batch cannot shrink it, so a failure of that size (a sequence longer than the position table,
/// a sample with more columns than the model takes) fails without the row too.
struct PaddingRow {
  std::string tensor;
  int dim = 0;             ///< the dimension it reaches along
  int64_t row = 0;
  int64_t extent = 0;      ///< the row's: one past its last non-zero index along `dim`
  int64_t othersExtent = 0;  ///< the other rows' largest
  std::optional<int64_t> datasetIndex;  ///< the row's, when the batch carries an index tensor
};

/// A value outside an op's IndexDomain in a batch tensor that holds the batch's samples
/// concatenated (formats::concatenatedBatchTensors: a ragged batch's tokens); with the row whose
/// span holds it, when the batch's lengths or offsets tell the rows' spans (formats::raggedSpans).
struct ConcatenatedValue {
  std::string tensor;                      ///< "steps/6/batch/1"
  int64_t element = 0;                     ///< its flat index in the tensor
  int64_t position = 0;                    ///< its index along the concatenated dimension (0)
  double value = 0;
  IndexDomain domain;
  std::string spansBy;                     ///< the batch tensor of lengths or offsets (or list of lengths, replayer::perRowLists) that places it, "" when none does
  bool byOffsets = false;                  ///< `spansBy` holds each row's first position, not its length
  std::optional<int64_t> row;              ///< the row whose span holds it, by `spansBy`
  std::optional<int64_t> datasetIndex;     ///< that row's, when the batch carries an index tensor
};

/// Everything the rules judge from. Each experiment's result is absent when it did not run or
/// did not finish (its Experiment says why).
struct TriageFacts {
  std::string bundle;
  std::optional<replayer::ReplayResult> replay;      ///< the failing step, as recorded
  std::string replayOutcome;                         ///< why replay gave no result (the experiment's outcome)
  std::string samplesOutcome;                        ///< why sample bisection gave no result
  int64_t crashStep = -1;                            ///< the recorded crash's step (-1: none recorded)
  std::string crashPhase;                            ///< the recorded crash's phase ("" unknown, "between-steps", ...)
  std::optional<StepBisection> steps;
  std::optional<SampleBisection> samples;
  std::optional<replayer::ReplayResult> withoutRows; ///< the failing step without the culprit rows
  std::string withoutRowsOutcome;                    ///< why that replay, when it ran, gave no result
  std::optional<OpBisection> ops;
  std::optional<ConfigBisection> config;
  std::vector<RowFinding> rowFindings;               ///< of the culprit rows
  /// Where no part of the batch could run (SampleBisection::cutsFail), or the search gave no result
  /// (samplesOutcome: a batch it cannot cut, a timeout): the NaN/Inf and the index the error names
  /// in any row of the recorded batch, none of them tested by leaving rows out.
  std::vector<RowFinding> untestedRowFindings;
  size_t untestedFindingsLeftOut = 0;               ///< beyond kListedUntestedFindings
  std::optional<PaddingRow> paddingRow;              ///< of the failing step's batch
  std::optional<ShortBatch> shortBatch;              ///< the failing step's batch, when short
  std::vector<ConcatenatedValue> concatenatedValues; ///< of the failing step's batch
  /// The failing step's whole batch's dataset indices, read where the batch as a whole is the
  /// finding (emptyMean()); nullopt when not read or the batch has no index tensor.
  std::optional<std::vector<int64_t>> batchDatasetIndices;
  std::optional<JobTriage> job;                      ///< the bundle is a rank of a multi-process job
  /// A crash between steps while the program held a batch of another DataLoader than the
  /// training's (a validation pass's; Crash.otherBatch): that loader's number (-1: none kept), and
  /// what the rows of its batch hold (findOtherBatchOddities), with their dataset indices.
  int32_t otherLoader = -1;
  bool otherBatchJudged = false;  ///< its rows were read and judged (the findings below are all)
  std::vector<RowFinding> otherBatchFindings;
  /// The crash's error text (the last line compared with what an index error says).
  std::string crashError;

  /// The replay brought the recorded failure back (replayer::showsFailure).
  bool reproduced() const { return replay && replayer::showsFailure(*replay); }
  /// The culprit rows sample bisection found (empty when it found none or did not run).
  std::vector<int64_t> culpritRows() const;
  /// The culprit rows trigger the failure: it needs them and goes away without them.
  bool rowsTrigger() const;
  /// Whether any finding in the culprit rows is an invalid value.
  bool rowsInvalid() const;
  /// The concatenatedValues that lie in the culprit rows' spans.
  std::vector<const ConcatenatedValue*> culpritValuesInRows() const;
  /// The first non-finite op's CTC targets that cannot be aligned, in the culprit rows (its batch's
  /// elements are the step batch's rows).
  std::vector<replayer::UnalignableTarget> unalignableRows() const;
  /// The reproduced failure's first NaN is a mean of nothing (replayer::EmptyMean); null otherwise.
  const replayer::EmptyMean* emptyMean() const;
  /// The failing step: the replayed one, else the recorded crash's (-1 unknown).
  int64_t step() const { return replay ? replay->step : crashStep; }
  /// The recorded error came where a replay does not run, and the replay of the step ran clean:
  /// after the step's update, in the loop's own code between steps (a validation pass, a
  /// checkpoint), or after the step's backward() (phase optimizer: the update, gradient clipping,
  /// logging), where a replay ends the failing step.
  bool failedOutsideReplay() const;
  /// The recorded error came while the DataLoader loaded the batch after the step, and the replay
  /// could not load that batch again (no indices to load its samples by: an IterableDataset),
  /// after the steps before it replayed without an error of their own.
  bool loadingNotRepeated() const;
  /// Why replay could not test the failing step at all (it did not run, the recording lost a
  /// step on the way, or the failure came while loading a batch the replay could not load
  /// again), as evidence; nullopt when it could. A rule that needs the failing step
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

/// Where the failure is: step, rows (only when they trigger it: needed and sufficient; any single
/// row fails a run that diverged), op, and the changes that make it come or go.
struct Culprit {
  std::optional<int> rank;                 ///< a job's: the rank triaged (its batch holds the rows)
  std::optional<int64_t> step;
  std::optional<std::vector<int64_t>> rows, datasetIndices;
  std::optional<std::string> op, phase;
  std::optional<std::string> node;         ///< the autograd node of a backward op ("SqrtBackward0")
  std::optional<std::vector<std::string>> changes;
  /// Without rows: the value outside the domain of the op that raised, in a tensor of the
  /// samples concatenated, and the row it lies in when the batch's offsets say.
  std::optional<ConcatenatedValue> value;
  /// Without rows, what the whole batch is: short (where invalid-data is not refuted), or giving
  /// the loss nothing to average (`datasetIndices` then are the whole batch's).
  std::optional<ShortBatch> shortBatch;
  std::optional<replayer::EmptyMean> emptyMean;
  /// The rows are of the batch another DataLoader (this number) gave between steps, not of a
  /// step's (TriageFacts::otherBatchFindings); `step` is the step the crash came after.
  std::optional<int> loader;
};
Culprit findCulprit(const TriageFacts& facts);

/// "none of its 16 targets counts (all are ignore_index -100)", "it averages an empty tensor":
/// why a mean of nothing is NaN, said of the op that took it.
std::string emptyMeanText(const replayer::EmptyMean& m);

/// ", in SqrtBackward0, the gradient of sqrt" for a backward op's autograd node (", in MyFnBackward"
/// for a node that names no native op); "" for none. Follows an op's phase: "(backward, in ...)".
std::string nodeText(const std::string& node);

/// What the culprit says of its whole batch, where no rows are named: "the whole batch, which gives
/// the loss no target to count (all 16 are ignore_index -100)", "its short batch of 1 row (earlier
/// steps had 16)"; nullopt when it says nothing of it.
std::optional<std::string> culpritBatchText(const Culprit& c);

/// "96,97,98", or for a list longer than 24 its first 24 and how many in all ("0,1,...,23,... (512
/// in all)"): a whole batch's dataset indices in a line of text (--json keeps the list whole).
std::string leadingIndicesText(const std::vector<int64_t>& indices);

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
/// read; a failed experiment is a missing fact, not an error. A rank of a job is triaged with its
/// job; when its own failure reached it from a peer, the rank that failed first is triaged instead
/// (facts.job says which was asked for).
Triage runTriage(const std::string& bundle, const TriageOptions& options = {});

/// The index domains of the ops in the bundle's op trace (the newest call of each op), and the one
/// the crash's error names, if it names one. `beyondRing`: also those of the index ops the recorder
/// kept beyond the ring (OpTraceData::indexOps, the newest step's), for a crash after the steps'
/// ops left the ring (findOtherBatchOddities). A failing step's batch is judged by the ring's
/// alone: an earlier step's ops there would be rivals of the step's own by shape, and a domain
/// that applies to a tensor keeps its rows from being judged as lengths (RowFinding::LoneZero).
std::vector<IndexDomain> findIndexDomains(const std::string& bundle, bool beyondRing = false);

/// What is invalid or odd in `rows` of step `step`'s batch (the dataset index tensor excluded):
/// NaN/Inf, integers outside one of `domains` (matched to the tensor by shape), magnitudes far
/// beyond every other row's, rows all zeros where the others are not, negative values where the
/// others have none (against `floor` where given), zeros where the others have none and the
/// step's first NaN/Inf is an op given a 0 (`zero`).
std::vector<RowFinding> findRowOddities(const std::string& bundle, int64_t step, const std::vector<int64_t>& rows,
                                        const std::vector<IndexDomain>& domains,
                                        const std::optional<ValueFloor>& floor = std::nullopt,
                                        const std::optional<ZeroGiven>& zero = std::nullopt);

/// What is invalid in the batch of another DataLoader than the training's that a crash between
/// steps kept (Crash.otherBatch; step formats::kCrashBatchStep), whose rows no sample bisection
/// can test (a replay of the steps does not run the code that took it): the few rows that hold
/// NaN/Inf or a value outside one of `domains` where the rest fit it, judged as findRowOddities
/// judges culprit rows, against the batch's other rows. A domain of the training's steps whose
/// index input has the steps' row count in its first dimension applies to this batch's row count
/// too. Each finding carries its row's dataset index where the batch has them. nullopt when there
/// is nothing to judge (no such batch, no rows, no tensor of its samples).
std::optional<std::vector<RowFinding>> findOtherBatchOddities(const std::string& bundle,
                                                              const std::vector<IndexDomain>& domains);

/// The values of step `step`'s batch tensors that hold the samples concatenated
/// (formats::concatenatedBatchTensors) outside one of `domains` (matched by the tensor's shape at
/// that step), the first of each tensor and domain, placed in the row whose span holds it when a
/// batch tensor of lengths or offsets tells the spans (formats::raggedSpans: an EmbeddingBag's
/// offsets, a CTC loss's target lengths).
/// A row's dataset index follows `order` (datasetIndices).
std::vector<ConcatenatedValue> findConcatenatedValues(const std::string& bundle, int64_t step,
                                                      const std::vector<IndexDomain>& domains,
                                                      const std::optional<replayer::RowOrder>& order = std::nullopt);

/// The PaddingRow of step `step`'s batch, when one row's extent along a dimension is above every
/// other's and is the tensor's size there, that size is larger than in every earlier step the
/// bundle holds, and the rows are padding, not sparse data: each row is non-zero in 90% of its own
/// extent (a one-hot row is not). nullopt when no tensor shows one, or the batch has fewer than 3
/// rows. Its dataset index follows `order` (datasetIndices).
std::optional<PaddingRow> findPaddingRow(const std::string& bundle, int64_t step,
                                         const std::optional<replayer::RowOrder>& order = std::nullopt);

/// The ShortBatch of step `step`, when at least 3 earlier steps whose batches the bundle holds
/// had more rows than it, and more than half of those earlier steps had one count.
std::optional<ShortBatch> findShortBatch(const std::string& bundle, int64_t step);

/// A culprit's value as the triage table and the report name it: "the value 53 at element 64 of
/// steps/6/batch/1 (batch row 10 by its offsets, dataset index 150)"; `quote` wraps the tensor's
/// name ("`" in Markdown).
std::string culpritValueText(const ConcatenatedValue& v, std::string_view quote = "");

/// `crashcap triage --json`: bundle, reproduced, verdict, step, hypotheses [{id, verdict,
/// evidence, rerun}], culprit {rank, step, rows, dataset_indices, op, phase, changes, value (null,
/// or {tensor, element, value, spans_by, spans, row, dataset_index})}, notes (the
/// replay's: what differs from the recording, what bounds the replay), job (null, or
/// {job_id, world_size, rank, asked_rank, asked_bundle, first_failed, ranks [{rank, verdict}]}),
/// experiments.
/// `withReplay` adds the replay result (the report uses it).
nlohmann::json toJson(const Triage& t, bool withReplay = false);
nlohmann::json toJson(const Hypothesis& h);

}  // namespace crashcap::investigate
