// The triage rules: one pure function of the typed facts per hypothesis, and the table that
// orders them. docs/REPLAY.md ("Triage") states each rule in words; keep the two in step.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <regex>
#include <string_view>

#include "crashcap/formats/records.hpp"
#include "crashcap/investigate/triage.hpp"

namespace crashcap::investigate {
namespace {

using V = HypothesisVerdict;

std::string joinRows(const std::vector<int64_t>& rows) { return fmt::format("{}", fmt::join(rows, ",")); }
const char* describe(bool fails) { return fails ? "fails" : "runs clean"; }

/// Which other devices make the step's outcome differ from the baseline's, as evidence; nullopt
/// when none does.
std::optional<std::string> deviceChange(const ConfigBisection& c) {
  std::vector<std::string> differ;
  for (const auto& d : c.devices)
    if (d.fails != c.baseline.fails && d.otherFailure.empty()) differ.push_back(d.device);
  if (differ.empty()) return std::nullopt;
  return fmt::format("the step {} on {} and {} on {}", describe(c.baseline.fails), c.baseline.device,
                     describe(!c.baseline.fails), fmt::join(differ, ", "));
}

/// Which single setting flips make the step's outcome differ from the baseline's, as evidence;
/// nullopt when none does. A flip that breaks the replay another way changes nothing here.
std::optional<std::string> settingChange(const ConfigBisection& c) {
  std::vector<std::string> changes;
  for (const auto& f : c.flips)
    if (f.fails != c.baseline.fails && f.otherFailure.empty())
      changes.push_back(fmt::format("{}={} (recorded {})", f.setting, f.value, f.recorded));
  if (changes.empty()) return std::nullopt;
  return fmt::format("the step {} as recorded and {} with {}{}", describe(c.baseline.fails), describe(!c.baseline.fails),
                     fmt::join(changes, "; "),
                     c.flipsAtTarget ? fmt::format(", changed for step {} alone from the state the recorded settings give it",
                                                   c.step)
                                     : "");
}

std::string rowFindingText(const RowFinding& r) {
  switch (r.kind) {
    case RowFinding::Kind::NonFinite:
      return fmt::format("row {} of {} holds {} NaN and {} Inf values", r.row, r.tensor, r.nanCount, r.infCount);
    case RowFinding::Kind::OutOfDomain: {
      const IndexDomain& d = *r.domain;
      std::string s = fmt::format("row {} of {} {} {:.0f}, outside 0..{}: {}", r.row, r.tensor,
                                  r.oneElement ? "is" : "holds", r.value, d.size - 1, d.describe());
      if (!d.wholeShape.empty())
        s += fmt::format("; the op's index input [{}] is shaped like a part of this [{}] tensor (a slice or a column of "
                         "it), which may not hold the {:.0f}",
                         fmt::join(d.indexShape, ","), fmt::join(d.wholeShape, ","), r.value);
      for (const auto& [other, bad] : r.otherDomains)
        s += bad ? fmt::format("; its shape fits another op's input as well: {}, and {:.0f} is outside 0..{} there too",
                               other.describe(), *bad, other.size - 1)
                 : fmt::format("; its shape fits another op's input as well: {}, and its values are within 0..{} there",
                               other.describe(), other.size - 1);
      return s;
    }
    case RowFinding::Kind::Outlier:
      if (r.column >= 0)
        return fmt::format("row {} of {} reaches {:.3g} in magnitude in feature {}, while the batch's other rows stay "
                           "within {:.3g} there",
                           r.row, r.tensor, r.value, r.column, r.othersMax);
      return fmt::format("row {} of {} reaches {:.3g} in magnitude, while the batch's other rows stay within {:.3g}", r.row,
                         r.tensor, r.value, r.othersMax);
    case RowFinding::Kind::AllZeros:
      return fmt::format("row {} of {} is all zeros, unlike the batch's other rows", r.row, r.tensor);
    case RowFinding::Kind::LoneZero:
      return fmt::format("row {} of {} is 0, while the batch's other rows are {:.0f}..{:.0f}: a length or count of "
                         "nothing?",
                         r.row, r.tensor, r.othersMin, r.othersMax);
    case RowFinding::Kind::ZeroGiven:
      return fmt::format("row {} of {} holds {}{}, while no value of the batch's other rows is 0, and the step's first "
                         "NaN/Inf is {}'s ({}), which was given a 0: what it divided by, or took the log of?",
                         r.row, r.tensor, r.value == 1 ? "an exact 0" : fmt::format("{:.0f} exact zeros", r.value),
                         r.column >= 0 ? fmt::format(" (feature {})", r.column) : "", r.zero->op, r.zero->phase);
    case RowFinding::Kind::Negative:
      if (r.floor)
        return fmt::format("row {} of {} {} {:.3g}, while every value of the batch's other rows is >= 0, and the step's "
                           "first NaN is {}'s, which has no finite result below 0",
                           r.row, r.tensor, r.oneElement ? "is" : "holds negative values down to", r.value, r.floor->op);
      return fmt::format("row {} of {} holds negative values (down to {:.3g}), while every value of the batch's other "
                         "rows is >= 0",
                         r.row, r.tensor, r.value);
  }
  return "";
}

/// "element 64 of steps/6/batch/1 is 53, outside 0..49: the embedding (...) has 50 rows (...)"
/// "row 4: its CTC target of 33 labels needs 35 input frames ... and has 23: ..."
std::string unalignableText(const replayer::UnalignableTarget& t, const std::string& who) {
  return fmt::format("{}: its CTC target of {} label{} needs {} input frames (a blank between repeated labels) and has {}: "
                     "no alignment exists, so its loss is infinite whatever the weights (zero_infinity=True makes it 0)",
                     who, t.targetLength, t.targetLength == 1 ? "" : "s", t.framesNeeded, t.inputLength);
}

std::string concatenatedValueText(const ConcatenatedValue& v) {
  return fmt::format("element {} of {} is {:.0f}, outside 0..{}: {}", v.element, v.tensor, v.value, v.domain.size - 1,
                     v.domain.describe());
}

/// "by the offsets in steps/6/batch/2 it is in row 10's span (dataset index 150)"
std::string concatenatedRowText(const ConcatenatedValue& v) {
  if (!v.row) return "no tensor of lengths or offsets in the batch places it in a row";
  return fmt::format("by the {} in {} it is in row {}'s span{}", v.byOffsets ? "offsets" : "lengths", v.spansBy, *v.row,
                     v.datasetIndex ? fmt::format(" (dataset index {})", *v.datasetIndex) : "");
}

/// "batch row 3 triggers it with values in range: the loss cannot handle a legitimate edge case
/// of its input"; `what` is what cannot ("loss", "step").
std::string edgeCaseRowsText(const TriageFacts& f, const char* what) {
  const auto rows = f.culpritRows();
  return fmt::format("batch row{} [{}] trigger{} it with values in range: the {} cannot handle a legitimate edge case of "
                     "its input",
                     rows.size() == 1 ? "" : "s", joinRows(rows), rows.size() == 1 ? "s" : "", what);
}

/// The concatenated value outside the domain of the op that raised the replayed error, if any.
const ConcatenatedValue* raisingOpValue(const TriageFacts& f) {
  if (!f.reproduced() || !f.replay->raisingOp) return nullptr;
  const auto& raising = *f.replay->raisingOp;
  for (const auto& v : f.concatenatedValues)
    if (v.domain.op == raising.name &&
        std::any_of(raising.inputs.begin(), raising.inputs.end(),
                    [&](const replayer::ValueStats& in) { return in.shape == v.domain.indexShape; }))
      return &v;
  return nullptr;
}

/// The op that raised was given a NaN, or an infinity no mask wrote on purpose, that an op before it
/// made (multinomial of probabilities gone NaN): the error is about a value the raising op only
/// found. Not when a value outside its domain is its error (a label out of range), and not for an
/// op that went non-finite inside it (its own max() of the NaN probabilities).
bool raisedAboutNonFinite(const TriageFacts& f) {
  if (!f.replay || !f.replay->raisingOp || !f.replay->firstNonFiniteOp) return false;
  const auto& raising = *f.replay->raisingOp;
  const auto& made = *f.replay->firstNonFiniteOp;
  if (made.index >= raising.began) return false;
  const bool given = std::any_of(raising.inputs.begin(), raising.inputs.end(), [&](const replayer::ValueStats& in) {
    return in.nanCount > 0 || (in.infCount > 0 && !made.afterGivenInfinity);
  });
  return given && !raisingOpValue(f);
}

/// How the dataset indices named for rows were matched to them: "" in the sampler's order, which
/// default_collate keeps.
std::string rowOrderText(const std::optional<replayer::RowOrder>& order) {
  if (!order) return "";
  if (order->order == "reordered" || order->order == "partial")
    return ", matched to the rows after the collate function reordered the samples the sampler drew";
  if (order->order == "sampler") return ", the rows in the sampler's order, checked against the program's collate function";
  return fmt::format("; unchecked: the collate function is the program's, and it may have put the samples in another "
                     "order than the sampler drew them, since {}",
                     order->why);
}

std::string paddingRowText(const PaddingRow& p) {
  return fmt::format("row {}{} of {} reaches index {} along dimension {}, while every other row is zero beyond index {}; "
                     "the batch's padded size is that row's, which cutting rows from the recorded batch cannot "
                     "shrink, so its sample may still be the cause (train once without it to tell)",
                     p.row, p.datasetIndex ? fmt::format(" (dataset index {})", *p.datasetIndex) : "", p.tensor,
                     p.extent - 1, p.dim, p.othersExtent - 1);
}

/// "step 6 fails with batch row [3] alone and passes without it (7 replays)"; of a job's rank,
/// "step 6 fails with rank 2's batch row [3] alone, every other rank's whole batch, and passes ...".
std::string triggerText(const TriageFacts& f) {
  const auto rows = f.culpritRows();
  if (!f.samples->otherSets.empty()) {
    // Several sets, each failing without the ones before it: "with batch row [9] alone, and
    // without it with row [15] alone".
    std::string sets = fmt::format("[{}]", joinRows(f.samples->triggers.empty() ? f.samples->rows : f.samples->triggers));
    for (const auto& set : f.samples->otherSets) sets += fmt::format(", [{}]", joinRows(set));
    return fmt::format("step {} fails with each of {}batch rows {} alone{} (each found without the ones before it) "
                       "and passes without rows [{}] ({} replays{})",
                       f.step(), f.job ? fmt::format("rank {}'s ", f.job->rank) : "", sets,
                       f.job ? ", every other rank feeding its whole batch," : "", joinRows(rows), f.samples->replays + 1,
                       f.job ? fmt::format(" of all {} ranks", f.job->worldSize) : "");
  }
  if (!f.samples->triggers.empty())  // alone they fail another way: others let the step run
    return fmt::format("step {} fails with {}batch rows [{}]{} and passes without row{} [{}] ({} replays{})", f.step(),
                       f.job ? fmt::format("rank {}'s ", f.job->rank) : "", joinRows(f.samples->rows),
                       f.job ? ", every other rank feeding its whole batch," : "", rows.size() == 1 ? "" : "s",
                       joinRows(rows), f.samples->replays + 1, f.job ? fmt::format(" of all {} ranks", f.job->worldSize) : "");
  return fmt::format("step {} fails with {}batch row{} [{}] alone{} and passes without {} ({} replays{})", f.step(),
                     f.job ? fmt::format("rank {}'s ", f.job->rank) : "", rows.size() == 1 ? "" : "s", joinRows(rows),
                     f.job ? ", every other rank feeding its whole batch," : "", rows.size() == 1 ? "it" : "them",
                     f.samples->replays + 1, f.job ? fmt::format(" of all {} ranks", f.job->worldSize) : "");
}

/// "the recorded error came after step 1's update, between steps (...)", or after its backward().
std::string outsideReplayText(const TriageFacts& f) {
  if (f.crashPhase == "optimizer")
    return fmt::format("the recorded error came in step {} after its backward() (in the optimizer's update, or in what "
                       "the loop runs before it: gradient clipping, logging, a file it writes), and step {} replays "
                       "clean up to its backward()",
                       f.step(), f.step());
  return fmt::format("the recorded error came after step {}'s update, between steps (in what the loop runs after "
                     "optimizer.step(): a scheduler, a validation pass, a checkpoint, logging), and step {} replays "
                     "clean",
                     f.step(), f.step());
}

/// The forward op whose gradient a native autograd node computes: "SqrtBackward0" -> "sqrt",
/// "LinalgVectorNormBackward0" -> "linalg_vector_norm"; "" for another node (AccumulateGrad, a
/// Python autograd.Function's "MyFnBackward").
std::string forwardOf(const std::string& node) {
  static const std::string kBackward = "Backward";
  const auto end = node.rfind(kBackward);
  if (end == std::string::npos || end == 0 || end + kBackward.size() == node.size()) return "";
  const auto digit = [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; };
  const auto alnum = [](char ch) { return std::isalnum(static_cast<unsigned char>(ch)) != 0; };
  const std::string_view name(node);
  const auto op = name.substr(0, end), number = name.substr(end + kBackward.size());
  if (!std::all_of(number.begin(), number.end(), digit) || !std::all_of(op.begin(), op.end(), alnum)) return "";
  std::string out;
  for (size_t i = 0; i < end; ++i) {
    const auto ch = static_cast<unsigned char>(node[i]);
    // Torch title-cases the op's name: "Log1PBackward0" is log1p's, "MaxPool2DWith..." max_pool2d_with...
    if (std::isupper(ch) && i > 0 && !std::isdigit(static_cast<unsigned char>(node[i - 1]))) out += '_';
    out += static_cast<char>(std::tolower(ch));
  }
  return out;
}

}  // namespace

std::string nodeText(const std::string& node) {
  if (node.empty()) return "";
  const auto forward = forwardOf(node);
  return forward.empty() ? ", in " + node : fmt::format(", in {}, the gradient of {}", node, forward);
}

namespace {

/// A NaN/Inf made in the gradient of an op whose derivative is infinite at a point where the op
/// itself is finite: the forward ran clean and backward() did not. nullopt for other nodes; said
/// only of an op given a 0 (the root's value, 1 - x^2 of an arccosine). (Torch's
/// own norms, distances and std give 0 as their gradient at 0, and are not among them.)
std::optional<std::string> infiniteDerivativeText(const std::string& node) {
  const auto forward = forwardOf(node);
  // PowBackward0 is a power by a number; PowBackward1's exponent is a tensor, whose gradient takes
  // the log of the base.
  if (forward == "sqrt" || node == "PowBackward0")
    return fmt::format("the derivative of {} is infinite at 0, where its value is finite: a distance or norm taken by "
                       "hand, sqrt(sum(d * d)), of a zero difference (two equal rows, a row of zeros), or a fractional "
                       "power of 0; the forward ran clean and its gradient did not (an epsilon under the root, "
                       "sqrt(x + 1e-12), or torch.linalg.vector_norm, whose gradient at 0 is 0, mends it)",
                       forward == "pow" ? "a fractional power (x ** 0.5)" : "sqrt");
  if (forward == "acos" || forward == "asin")
    return fmt::format("the derivative of {} is infinite at -1 and 1, where its value is finite (the angle of two "
                       "parallel vectors, a cosine of exactly 1); the forward ran clean and its gradient did not "
                       "(clamp the input to (-1 + eps, 1 - eps))",
                       forward);
  return std::nullopt;
}

/// A floating dtype's name as the docs write it, and its largest finite value.
std::optional<std::pair<const char*, double>> floatRange(const std::string& dtype) {
  if (dtype == "Float") return std::pair{"float32", 3.4028234663852886e38};
  if (dtype == "BFloat16") return std::pair{"bfloat16", 3.3895313892515355e38};
  if (dtype == "Half") return std::pair{"float16", 65504.0};
  return std::nullopt;
}

/// The first op departing from float64 is non-finite as replayed and finite in float64, where its
/// value passes the largest the replay's dtype holds: an overflow, the dtype's range and not its
/// rounding. (A float32 value that rounding alone turns non-finite, a denominator rounded to 0,
/// has a float64 value within float32's range.) The text, or nullopt.
std::optional<std::string> departsPastRange(const OpBisection& ops) {
  const auto& d = ops.firstDeparting;
  if (!d || d->replayed.nanCount + d->replayed.infCount == 0 || d->reference.nanCount + d->reference.infCount > 0 ||
      !d->reference.min || !d->reference.max)
    return std::nullopt;
  const auto range = floatRange(d->replayed.dtype);
  const double magnitude = std::max(std::abs(*d->reference.min), std::abs(*d->reference.max));
  if (!range || magnitude <= range->second) return std::nullopt;
  return fmt::format("the float64 CPU replay of the step runs clean, where {} ({}) reaches {:.3g}, past {}'s largest "
                     "{:.3g}: {}'s range is involved, not its rounding",
                     d->name, d->phase, magnitude, range->first, range->second, range->first);
}

}  // namespace

const char* verdictName(HypothesisVerdict verdict) {
  switch (verdict) {
    case V::Confirmed: return "confirmed";
    case V::Refuted: return "refuted";
    case V::Inconclusive: return "inconclusive";
  }
  return "inconclusive";
}

std::optional<std::string> TriageFacts::replayBlocked() const {
  if (!replay)
    return replayOutcome.empty() ? std::string("replay did not run")
                                 : fmt::format("replay could not run ({}), so nothing was tested", replayOutcome);
  if (replay->verdict == replayer::Verdict::RecordingIncomplete)
    return fmt::format("the recording lost step{} {} of the replay window (keyframe {} to step {}): replay cannot test the "
                       "failing step, which says nothing about the training",
                       replay->lostSteps.size() == 1 ? "" : "s", joinRows(replay->lostSteps), replay->keyframe,
                       replay->step);
  // The batch that never arrived, which this replay could not load again (an IterableDataset's:
  // no indices to load its samples by): the failure was in loading, and nothing was run that
  // could bring it back. Not a finding that it does not reproduce.
  if (loadingNotRepeated())
    return fmt::format("the recorded error came from the DataLoader while it loaded the batch after step {}{}, and the "
                       "replay could not load that batch again (crashcap replay says why): nothing that could bring "
                       "the error back was run, and its traceback (crashcap inspect) is the evidence there is",
                       replay->step, replay->recordedError.empty() ? "" : " (" + lastLine(replay->recordedError) + ")");
  return std::nullopt;
}

std::vector<int64_t> TriageFacts::culpritRows() const {
  return samples && samples->reproduced && samples->cutsFail.empty() ? samples->culprits() : std::vector<int64_t>{};
}

bool TriageFacts::loadingNotRepeated() const {
  return replay && replayer::loadNotRepeated(*replay, crashPhase);
}

bool TriageFacts::failedOutsideReplay() const {
  return (crashPhase == "between-steps" || crashPhase == "optimizer") && replay && !replayer::showsFailure(*replay) && replay->error.empty() &&
         !replay->divergedAt;
}

bool TriageFacts::rowsTrigger() const {
  return !culpritRows().empty() && withoutRows && !replayer::showsFailure(*withoutRows);
}

bool TriageFacts::rowsInvalid() const {
  if (std::any_of(rowFindings.begin(), rowFindings.end(), [](const RowFinding& r) { return r.invalid(); })) return true;
  return !culpritValuesInRows().empty() || !unalignableRows().empty();
}

std::vector<replayer::UnalignableTarget> TriageFacts::unalignableRows() const {
  std::vector<replayer::UnalignableTarget> out;
  if (!replay || !replay->firstNonFiniteOp) return out;
  const auto rows = culpritRows();
  for (const auto& t : replay->firstNonFiniteOp->unalignable)
    if (std::find(rows.begin(), rows.end(), t.element) != rows.end()) out.push_back(t);
  return out;
}

const replayer::EmptyMean* TriageFacts::emptyMean() const {
  if (!reproduced() || !replay->firstNonFiniteOp || !replay->firstNonFiniteOp->emptyMean) return nullptr;
  return &*replay->firstNonFiniteOp->emptyMean;
}

std::vector<const ConcatenatedValue*> TriageFacts::culpritValuesInRows() const {
  std::vector<const ConcatenatedValue*> out;
  const auto rows = culpritRows();
  for (const auto& v : concatenatedValues)
    if (v.row && std::find(rows.begin(), rows.end(), *v.row) != rows.end()) out.push_back(&v);
  return out;
}

namespace {

constexpr size_t kListedLoadCulprits = 8;

std::string loadedBatchText(const TriageFacts& f) {
  const auto& load = *f.replay->batchLoad;
  return fmt::format("the batch after step {} never came: loaded again from its {} recorded dataset indices as the "
                     "program's loader loads it, it raises the recorded error",
                     f.step(), load.indices.size());
}

std::string loadCulpritText(const replayer::LoadCulprit& c, const std::string& by) {
  return fmt::format("dataset index {} (sample {} of the batch) fails {}: {}", c.datasetIndex, c.position, by,
                     lastLine(c.error));
}

/// Whether `error` is an index's out of its range, in PyTorch's words: an embedding's "index out of
/// range in self", a classification loss's "Target 9 is out of bounds", an indexing op's "index 7 is
/// out of bounds for dimension 0 with size 5", a device's "device-side assert triggered" (not the
/// hint every CUDA error of torch 2 ends with, "...to enable device-side assertions").
bool indexError(const std::string& error) {
  static const std::regex words(
      R"(index out of range in self|Target -?[0-9]+ is out of bounds|is out of bounds for dimension|device-side assert triggered)");
  return std::regex_search(error, words);
}

/// Whether `error`'s own words (its last line) are about a NaN or an infinity (a program's own
/// check of its values, anomaly mode's "returned nan values").
bool nonFiniteError(const std::string& error) {
  static const std::regex words(R"(\b(nans?|infs?|infinite|infinity|non-?finite)\b)", std::regex::icase);
  return std::regex_search(lastLine(error), words);
}

/// Whether the error's own words tie a finding of another loader's batch to the crash: an index
/// out of its range and a row holding the value it names or one outside a domain the batch's other
/// rows fit, or a NaN/Inf and a row holding one.
bool tiedToError(const RowFinding& r, const TriageFacts& f) {
  if (r.kind == RowFinding::Kind::OutOfDomain && r.domain) return r.domain->raisedValue || indexError(f.crashError);
  return r.kind == RowFinding::Kind::NonFinite && nonFiniteError(f.crashError);
}

/// What the batch another loader gave between steps holds (TriageFacts::otherBatchFindings), for a
/// crash the steps' replay does not run: no experiment can leave its rows out, so invalid-data is
/// confirmed only where the error's own words tie a row to it (tiedToError).
void addOtherBatch(const TriageFacts& f, Hypothesis& h) {
  if (f.otherLoader < 0) return;
  if (!f.otherBatchJudged) {
    h.evidence.push_back(fmt::format("the batch the program took last from DataLoader #{} is kept (crash/batch/ in the "
                                     "bundle), but triage could not judge its rows",
                                     f.otherLoader));
    return;
  }
  if (f.otherBatchFindings.empty()) {
    h.evidence.push_back(fmt::format("the batch the program took last from DataLoader #{} (crash/batch/ in the bundle) "
                                     "holds no NaN/Inf and no index outside a domain the op trace or the error shows "
                                     "in a few rows where its other rows fit it",
                                     f.otherLoader));
    return;
  }
  const RowFinding* tied = nullptr;
  for (const auto& r : f.otherBatchFindings) {
    h.evidence.push_back(fmt::format("in the batch the program took last from DataLoader #{}, not a step's (kept at the "
                                     "crash), {}{}",
                                     f.otherLoader, rowFindingText(r),
                                     r.datasetIndex ? fmt::format("; dataset index {}", *r.datasetIndex) : ""));
    if (!tied && tiedToError(r, f)) tied = &r;
  }
  if (std::any_of(f.otherBatchFindings.begin(), f.otherBatchFindings.end(),
                  [](const RowFinding& r) { return r.domain && !r.domain->op.empty(); }))
    h.evidence.push_back("the ops named are the training steps', as the op trace holds them (what runs between steps is "
                         "not traced), taken to index this batch alike");
  if (tied) {
    h.verdict = V::Confirmed;
    h.rerun = fmt::format("crashcap show {} {}", f.bundle, tied->tensor);
  } else {
    h.evidence.push_back("not tested: the code that takes that loader's batches is not replayed, and the error's own "
                         "words do not tie it to what the rows hold");
  }
}

}  // namespace

Hypothesis judgeInvalidData(const TriageFacts& f) {
  Hypothesis h{"invalid-data", V::Inconclusive, {}, fmt::format("crashcap bisect samples {}", f.bundle)};
  const auto rows = f.culpritRows();
  const bool withoutRowsFails = f.withoutRows && replayer::showsFailure(*f.withoutRows);
  const std::string whose = f.job ? fmt::format("rank {}'s ", f.job->rank) : "";  // the rows' batch, in a job
  // What rows hold where none could be tested by leaving it out.
  auto addUntested = [&] {
    for (const auto& r : f.untestedRowFindings)
      h.evidence.push_back(fmt::format("in the batch as recorded, {} (not tested{})", rowFindingText(r),
                                       r.datasetIndex ? fmt::format("; dataset index {}", *r.datasetIndex) : ""));
    if (f.untestedFindingsLeftOut)
      h.evidence.push_back(fmt::format("and {} more such rows", f.untestedFindingsLeftOut));
  };
  if (auto why = f.replayBlocked()) {
    h.evidence.push_back(*why);
    addOtherBatch(f, h);
  } else if (f.failedOutsideReplay()) {
    h.evidence.push_back(outsideReplayText(f) + ": the batches the steps consumed are not where it failed");
    addOtherBatch(f, h);
  } else if (!f.reproduced()) {
    h.evidence.push_back("the crash does not reproduce on replay, so its data cannot be tested");
  } else if (const auto& load = f.replay->batchLoad) {
    // The batch that never came, loaded again: its samples are the data, not the recorded rows.
    h.rerun = fmt::format("crashcap replay {} --json", f.bundle);
    h.evidence.push_back(loadedBatchText(f));
    for (size_t i = 0; i < load->culprits.size() && i < kListedLoadCulprits; ++i)
      h.evidence.push_back(loadCulpritText(load->culprits[i], load->culpritsBy));
    if (load->culprits.size() > kListedLoadCulprits)
      h.evidence.push_back(fmt::format("and {} more (crashcap replay --json: batch_load)",
                                       load->culprits.size() - kListedLoadCulprits));
    if (load->culprits.empty() && !load->searched)
      h.evidence.push_back("but this replay did not search its samples (crashcap replay does)");
    else if (load->culprits.empty())
      h.evidence.push_back("but no sample fails loaded alone or collated alone, and none differs in structure from the "
                           "rest: the batch fails as a whole (its size, its collate function)");
    else
      h.verdict = V::Confirmed;
  } else if (f.rowsTrigger()) {
    // The rows trigger the failure; they are invalid data only when they hold an invalid value.
    h.evidence.push_back(triggerText(f));
    if (!f.samples->filledBecause.empty())
      h.evidence.push_back(fmt::format(
          "cut to fewer rows the step fails another way ({}), so every experiment fed a batch of the whole {} rows, "
          "those it left out replaced by copies of those it kept",
          f.samples->filledBecause, f.samples->batchSize));
    if (f.samples->datasetIndices)
      h.evidence.push_back(fmt::format("dataset index {} ({}batch's {} tensor{})", joinRows(*f.samples->datasetIndices),
                                       f.job ? whose : "the ", formats::kDatasetIndexName,
                                       rowOrderText(f.samples->rowOrder)));
    else if (f.samples->rowOrder && f.samples->rowOrder->order == "partial")
      h.evidence.push_back(fmt::format("no dataset index: the collate function reordered the samples the sampler drew, "
                                       "and {}, so the rows are named by their place in the batch",
                                       f.samples->rowOrder->why));
    else
      h.evidence.push_back(fmt::format("no dataset index: {}batch has no {} tensor (an IterableDataset, or a sampler "
                                       "that draws no integers), so the rows are named by their place in the batch",
                                       f.job ? whose : "the ", formats::kDatasetIndexName));
    for (const auto& r : f.rowFindings)
      if (r.invalid()) h.evidence.push_back(rowFindingText(r));
    for (const auto* v : f.culpritValuesInRows())
      h.evidence.push_back(fmt::format("{}{}; {}", concatenatedValueText(*v), v == raisingOpValue(f) ? ", the op that raised" : "",
                                       concatenatedRowText(*v)));
    for (const auto& t : f.unalignableRows()) h.evidence.push_back(unalignableText(t, fmt::format("row {}", t.element)));
    if (f.rowsInvalid()) {
      h.verdict = V::Confirmed;
    } else {
      h.evidence.push_back(fmt::format(
          "but nothing in {} was found invalid (no NaN/Inf, no magnitude 100x beyond the other rows', no index outside "
          "a domain the op trace shows, no negative value where the other rows have none), so the rows look like an input the step cannot handle rather than bad data",
          rows.size() == 1 ? "it" : "them"));
      for (const auto& r : f.rowFindings) h.evidence.push_back(rowFindingText(r));
    }
  } else if (const auto* empty = f.emptyMean()) {
    // Nothing in the batch for the loss to count: a finding about the batch as a whole, which
    // cutting rows cannot test (the rows left give the loss nothing either).
    h.evidence.push_back(fmt::format("{}step {}'s batch as a whole gives {} nothing to average: {}{}", whose, f.step(),
                                     f.replay->firstNonFiniteOp->name, emptyMeanText(*empty),
                                     f.batchDatasetIndices
                                         ? fmt::format(" (dataset indices {})", leadingIndicesText(*f.batchDatasetIndices))
                                         : ""));
    const bool leftNothing = withoutRowsFails && f.withoutRows->firstNonFiniteOp &&
                             f.withoutRows->firstNonFiniteOp->emptyMean &&
                             f.withoutRows->firstNonFiniteOp->name == f.replay->firstNonFiniteOp->name;
    if (leftNothing)
      h.evidence.push_back(fmt::format("step {} still fails without {}rows [{}], the rows left giving it nothing to "
                                       "count either: no one sample is to blame",
                                       f.step(), whose, joinRows(rows)));
    else if (withoutRowsFails)
      h.evidence.push_back(fmt::format("step {} still fails without {}rows [{}]: no particular sample is needed",
                                       f.step(), whose, joinRows(rows)));
    else if (!f.samplesOutcome.empty())
      h.evidence.push_back(fmt::format("sample bisection did not finish ({})", f.samplesOutcome));
    addUntested();
    if (!empty->empty)
      h.evidence.push_back(fmt::format(
          "whether that is bad data is the program's call: {} that one batch drew together (a loader without "
          "shuffle over data sorted by label?), or a loss that must skip such a batch",
          empty->ignored == empty->targets ? "unlabelled samples"
          : empty->ignored == 0            ? "samples only of classes the loss weighs 0"
                                           : "samples unlabelled or of classes the loss weighs 0"));
  } else if (withoutRowsFails && f.paddingRow) {
    // The recorded batch keeps its padded size whatever rows are cut: the row that set it cannot
    // be tested by leaving it out.
    const auto& p = *f.paddingRow;
    h.evidence.push_back(fmt::format("step {} still fails without {}rows [{}], but the batch looks padded to one row: {}",
                                     f.step(), whose, joinRows(rows), paddingRowText(p)));
  } else if (withoutRowsFails) {
    h.verdict = V::Refuted;
    h.evidence.push_back(fmt::format("step {} still fails without {}rows [{}]: no particular sample is needed", f.step(),
                                     whose, joinRows(rows)));
  } else if (!rows.empty()) {
    // Rows were named, but nothing says whether the step passes without them.
    h.evidence.push_back(
        f.withoutRowsOutcome.empty()
            ? fmt::format("sample bisection named {}rows [{}], the whole batch: no replay without them can tell whether "
                          "particular samples are needed",
                          whose, joinRows(rows))
            : fmt::format("sample bisection named {}rows [{}], but the replay of step {} without them gave no result ({})",
                          whose, joinRows(rows), f.step(), f.withoutRowsOutcome));
  } else if (f.samples && f.samples->reproduced && !f.samples->cutsFail.empty()) {
    h.evidence.push_back(fmt::format(
        "every part of {}step {}'s batch that sample bisection tried fails another way ({}): the step cannot run on "
        "part of its batch (a tensor of the program's sized for the whole batch does this: a recurrent hidden state "
        "carried from step to step, a target made as torch.ones(batch_size, 1)), so no row can be tested by leaving "
        "it out",
        whose, f.step(), f.samples->cutsFail));
    addUntested();
  } else if (!f.samples && !f.concatenatedValues.empty()) {
    // Its rows could not be cut (the samples are concatenated, and no lengths or offsets tell
    // their spans), but a value is outside the domain of an op: invalid data when that op is the
    // one that raised.
    const ConcatenatedValue* raising = raisingOpValue(f);
    if (raising) h.verdict = V::Confirmed;
    for (const auto& v : f.concatenatedValues)
      h.evidence.push_back(fmt::format("{}{}; {}", concatenatedValueText(v),
                                       &v == raising ? ", the op that raised" : "", concatenatedRowText(v)));
    h.evidence.push_back(fmt::format(
        "the batch holds its samples concatenated, so no row could be cut and tested{}",
        f.samplesOutcome.empty() ? "" : fmt::format(" (sample bisection: {})", f.samplesOutcome)));
    addUntested();
  } else {
    h.evidence.push_back(f.samplesOutcome.empty()
                             ? std::string("sample bisection did not isolate rows")
                             : fmt::format("sample bisection did not finish ({})", f.samplesOutcome));
    addUntested();
  }
  if (f.shortBatch) {
    const auto& s = *f.shortBatch;
    h.evidence.push_back(fmt::format(
        "{}step {}'s batch has {} row{}, where {} earlier recorded steps had {}: a short batch, the last of an epoch "
        "whose dataset the batch size does not divide? (the DataLoader's drop_last=True leaves it out){}",
        whose, f.step(), s.rows, s.rows == 1 ? "" : "s", s.stepsUsual, s.usualRows,
        s.rows == 1 ? "; a single row is what BatchNorm in training, or any statistic over the batch, cannot take" : ""));
  }
  // Targets a CTC loss cannot align, where no rows were tested: named by their place in the loss's batch.
  if (h.verdict != V::Confirmed && f.unalignableRows().empty() && f.replay && f.replay->firstNonFiniteOp)
    for (const auto& t : f.replay->firstNonFiniteOp->unalignable)
      h.evidence.push_back(
          unalignableText(t, fmt::format("element {} of {}'s batch", t.element, f.replay->firstNonFiniteOp->name)));
  return h;
}

Hypothesis judgeLossNumerics(const TriageFacts& f) {
  // A job's ranks have no float64 comparison (bisect ops refuses them); the job's replay names each
  // rank's first non-finite op.
  Hypothesis h{"loss-numerics", V::Inconclusive, {},
               (f.job ? "crashcap replay " : "crashcap bisect ops ") + f.bundle};
  // The recorded phase says so whether or not a replay loaded the batch again.
  if (f.crashPhase == "loading") {
    h.verdict = V::Refuted;
    h.rerun = fmt::format("crashcap replay {} --json", f.bundle);
    h.evidence.push_back(fmt::format("the error came from the DataLoader loading the batch after step {}, not from an "
                                     "op of a step: no step computed a loss on that batch",
                                     f.step()));
    return h;
  }
  if (auto why = f.replayBlocked()) {
    h.evidence.push_back(*why);
    return h;
  }
  const auto* op = f.replay && f.replay->firstNonFiniteOp ? &*f.replay->firstNonFiniteOp : nullptr;
  if (op) {
    int64_t bad = 0, nans = 0;
    double largest = 0;
    bool reachesZero = false;
    for (const auto& in : op->inputs) {
      bad += in.nanCount + in.infCount;
      nans += in.nanCount;
      if (in.min) largest = std::max(largest, std::abs(*in.min));
      if (in.max) largest = std::max(largest, std::abs(*in.max));
      reachesZero = reachesZero || (in.min && *in.min == 0.0);
    }
    std::string where = fmt::format("{} ({}, step {}{})", op->name, op->phase, f.step(), nodeText(op->node));
    const bool lossNaN = !op->outputs.empty() && op->outputs[0].nanCount > 0;
    if (bad == 0 && !op->unalignable.empty() && !lossNaN) {
      // Infinite by definition: no alignment of the target exists, which the arithmetic reports rightly.
      h.verdict = V::Refuted;
      std::vector<int64_t> elements;
      for (const auto& t : op->unalignable) elements.push_back(t.element);
      h.evidence.push_back(fmt::format("{} is infinite for element{} [{}] of its batch, whose target{} need{} more input "
                                       "frames than {} ha{}: the right value for a target no path can emit, not an "
                                       "arithmetic failure",
                                       where, elements.size() == 1 ? "" : "s", joinRows(elements),
                                       elements.size() == 1 ? "" : "s", elements.size() == 1 ? "s" : "",
                                       elements.size() == 1 ? "it" : "they", elements.size() == 1 ? "s" : "ve"));
    } else if (bad == 0 && op->emptyMean) {
      // 0/0, the mean of nothing: the arithmetic is right, and the step does not guard the edge case.
      h.verdict = V::Confirmed;
      h.evidence.push_back(fmt::format("{} makes NaN as a mean of nothing: {}", where, emptyMeanText(*op->emptyMean)));
      h.evidence.push_back("a batch with nothing for the loss to average is an edge case the step does not guard "
                           "(skip such a batch, or divide a reduction='sum' loss by the count, at least 1)");
    } else if (bad == 0 && largest > 1e15) {
      // Overflow of values that were already huge: they came from the data or from weights
      // running away, not from the loss's arithmetic.
      h.verdict = V::Refuted;
      h.evidence.push_back(fmt::format("{} overflows on inputs as large as {:.3g}: {}", where, largest,
                                       f.rowsTrigger() && f.rowsInvalid() ? "the culprit rows' values carry them there"
                                                                          : "the values were already diverging"));
    } else if (const auto tied = std::find_if(f.rowFindings.begin(), f.rowFindings.end(),
                                              [](const RowFinding& r) { return r.floor.has_value(); });
               bad == 0 && tied != f.rowFindings.end() && f.rowsTrigger() && f.rowsInvalid()) {
      // A log or a square root of the data's own negative values (the finding is tied to this op
      // by the value it was given): the data, not the arithmetic.
      h.verdict = V::Refuted;
      h.evidence.push_back(fmt::format("{} is given values down to {:.3g}, for which it has no finite result: the "
                                       "culprit rows' negative values carry them there",
                                       where, tied->floor->given));
    } else if (bad == 0) {
      h.verdict = V::Confirmed;
      h.evidence.push_back(fmt::format("{} turns finite inputs into NaN/Inf", where));
      // Given a 0 inside a node whose gradient is infinite at a point where its op is finite: that point.
      if (reachesZero) {
        const auto point = infiniteDerivativeText(op->node);
        h.evidence.push_back(point ? *point
                                   : fmt::format("an input of {} reaches 0 (a division or log of zero?)", op->name));
      }
      if (f.rowsTrigger() && !f.rowsInvalid())
        h.evidence.push_back(edgeCaseRowsText(f, "loss"));
    } else if (nans == 0 && op->afterGivenInfinity && !f.rowsInvalid()) {
      // NaN made of infinities the program wrote on purpose (a mask's -inf): the softmax of a row
      // masked whole is 0/0. The arithmetic meets an edge case of the program's own values.
      h.verdict = V::Confirmed;
      h.evidence.push_back(fmt::format("{} makes NaN of infinities the step wrote on purpose (an op before it was given "
                                       "an infinity, as a mask's masked_fill(-inf) is): a row with nothing left "
                                       "unmasked, whose softmax is 0/0?",
                                       where));
      if (f.rowsTrigger() && !f.rowsInvalid())
        h.evidence.push_back(edgeCaseRowsText(f, "step"));
    } else {
      h.verdict = V::Refuted;
      h.evidence.push_back(
          fmt::format("the first non-finite output, of {}, comes from inputs that already hold {} NaN/Inf", where, bad));
    }
  } else if (f.replay && f.replay->steps.empty()) {
    // The program died before it could answer (killed again): its ops were never seen.
    h.evidence.push_back(fmt::format("the replay gave no step back ({}): its ops' outputs were not seen",
                                     f.replay->error.empty() ? "it answered nothing" : f.replay->error));
  } else if (f.replay) {
    h.evidence.push_back("no op output went non-finite in the replayed step");
    if (f.reproduced()) h.verdict = V::Refuted;
  }
  if (f.ops) {
    const auto& ref = f.ops->reference;
    const bool same = f.ops->referenceFailsTheSameWay();
    const auto narrowed = f.ops->referenceNarrowedTo();  // only for a reference that fails the same way
    if (f.ops->referenceNarrowsPastRange())
      h.evidence.push_back(fmt::format("the float64 CPU replay's values pass {}'s range where the step narrows them "
                                       "itself ({}): the range of the narrower dtype is involved, not its rounding",
                                       *narrowed, ref.firstNonFiniteOp->name));
    else if (narrowed)
      h.evidence.push_back(fmt::format("the float64 CPU replay goes non-finite at {} too, but that op ran in {} there "
                                       "(the step narrows the widened values itself: a .float(), autocast, tensors it "
                                       "makes): it says nothing about float32 rounding or range",
                                       ref.firstNonFiniteOp->name, *narrowed));
    else if (same && ref.firstNonFiniteOp)
      h.evidence.push_back(fmt::format("the float64 CPU replay goes non-finite at {} too: not float32 rounding or range",
                                       ref.firstNonFiniteOp->name));
    else if (same)
      h.evidence.push_back("the float64 CPU replay fails with the same error: not a matter of precision");
    else if (f.ops->referenceFailedOtherwise())
      h.evidence.push_back(fmt::format("the float64 CPU replay could not run the step ({}): it says nothing about "
                                       "precision",
                                       ref.error));
    else if (f.reproduced() && f.replay && !f.replay->firstNonFiniteOp && !f.replay->error.empty() &&
             f.replay->error.rfind("non-finite ", 0) != 0)
      // An error raised without a NaN or Inf (not the replay's "non-finite loss") and gone in
      // float64 comes from the dtype the step runs in (an op's dtype rule, autocast, tensors of
      // mixed dtypes), not from its values.
      h.evidence.push_back("the float64 CPU replay of the step runs clean: the error depends on the dtype the step "
                           "runs in (an op's dtype rule, autocast, tensors of mixed dtypes), not on float32 rounding");
    else if (const auto overflow = departsPastRange(*f.ops); f.reproduced() && overflow)
      h.evidence.push_back(*overflow);
    else if (f.reproduced())
      h.evidence.push_back("the float64 CPU replay of the step runs clean: float32 rounding or range is involved");
    if (const auto& d = f.ops->firstDeparting)
      h.evidence.push_back(
          fmt::format("first op departing from float64: {} ({}), error {} over {} elements", d->name, d->phase, d->error, d->elements));
    else if (!f.ops->stoppedBecause.empty())
      h.evidence.push_back("the comparison with float64 stopped early: " + f.ops->stoppedBecause);
  }
  // A non-finite value that a change of setting or device makes go away is the kernel's under
  // that setting, not (only) the arithmetic's: loss-numerics cannot be confirmed on its own.
  if (h.verdict == V::Confirmed && f.config) {
    std::optional<std::string> change = settingChange(*f.config);
    const char* what = "setting";
    if (!change) {
      change = deviceChange(*f.config);
      what = "device";
    }
    if (change) {
      h.verdict = V::Inconclusive;
      h.evidence.push_back(fmt::format("but it goes away with a change of {} ({}): the kernel that runs under the "
                                       "recorded setup makes it, not only the arithmetic",
                                       what, *change));
    }
  }
  return h;
}

namespace {

/// The largest weight norm of the steps before `step`.
double levelMax(const std::vector<replayer::StepReplay>& steps, int64_t step) {
  double out = 0;
  for (const auto& s : steps)
    if (s.step < step && s.weightNorm) out = std::max(out, *s.weightNorm);
  return out;
}

/// The step whose update alone made the weights non-finite, when they had stayed within twice
/// their first norm (`w0`) until then, and the step's loss and gradient norm are finite, its
/// gradient norm at most 100 times the largest before it and its learning rate at most 10 times
/// the first step's: what a diverging training does not do in one update.
std::optional<replayer::StepReplay> nonFiniteFromOneUpdate(const std::vector<replayer::StepReplay>& steps, double w0) {
  double gradMax = 0;
  for (const auto& s : steps) {
    if (!s.weightNorm) continue;
    if (std::isfinite(*s.weightNorm) && s.weightsFinite) {
      if (*s.weightNorm > 2 * w0) return std::nullopt;
      if (s.hasGradNorm) gradMax = std::max(gradMax, s.gradNorm);
      continue;
    }
    const double lr0 = steps.front().learningRate;
    bool likeBefore = s.hasLoss && std::isfinite(s.loss) && s.hasGradNorm && std::isfinite(s.gradNorm) &&
                      gradMax > 0 && s.gradNorm <= 100 * gradMax && lr0 > 0 && s.learningRate <= 10 * lr0;
    if (likeBefore && s.step > steps.front().step) return s;
    return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

Hypothesis judgeOptimizerDivergence(const TriageFacts& f) {
  Hypothesis h{"optimizer-divergence", V::Inconclusive, {}, fmt::format("crashcap bisect steps {}", f.bundle)};
  // The weights are judged up to the failing step: a replay that cannot reach it cannot say. One
  // that reached it and could not load the batch after it has replayed every step up to it.
  if (auto why = f.replayBlocked(); why && !f.loadingNotRepeated()) {
    h.evidence.push_back(*why);
    return h;
  }
  if (!f.steps || f.steps->steps.empty()) return h;

  const auto& steps = f.steps->steps;
  const int64_t target = f.steps->target;
  // A step's weight norm is measured after its optimizer step; the failing step stops before it,
  // and a step that threw has none: those are unknown, not large. A non-finite norm is the
  // weights running away, as large as it gets.
  std::optional<double> w0, wMin, wMax;
  for (const auto& s : steps) {
    if (!s.weightNorm) continue;
    double w = std::isfinite(*s.weightNorm) ? *s.weightNorm : INFINITY;
    if (!w0) w0 = wMin = wMax = w;
    wMin = std::min(*wMin, w);
    wMax = std::max(*wMax, w);
  }
  if (!w0) {
    h.evidence.push_back(fmt::format("no weight norm to compare: no replayed step before step {} completed an optimizer "
                                     "step (the failure is in the first step replayed from the keyframe, or the program "
                                     "has no trainable parameters)",
                                     target));
    return h;
  }
  // The learning-rate jump that precedes the divergence: the largest step-to-step increase at or
  // before the first step whose update takes the weights past twice their first norm (a warm-up's
  // small increases before it are not the cause).
  int64_t onset = target;
  for (const auto& s : steps)
    if (s.weightNorm && (!std::isfinite(*s.weightNorm) || *s.weightNorm > 2 * *w0)) {
      onset = s.step;
      break;
    }
  struct Jump {
    double from = 0, to = 0;
    int64_t step = -1;
  };
  std::optional<Jump> jump;
  for (size_t i = 1; i < steps.size() && steps[i].step <= onset; ++i) {
    double from = steps[i - 1].learningRate, to = steps[i].learningRate;
    if (!(to > from) || !(from > 0)) continue;
    if (!jump || to / from >= jump->to / jump->from) jump = Jump{from, to, steps[i].step};
  }
  if (auto jumped = nonFiniteFromOneUpdate(steps, *w0)) {
    // Weights that stayed level and went non-finite in one update, from a loss and gradients
    // like the steps' before at a learning rate like theirs, did not run away: an update of
    // that size cannot come from those gradients.
    const auto& s = *jumped;
    h.verdict = V::Refuted;
    h.evidence.push_back(fmt::format("the weight norm stays within {:.4g}..{:.4g} up to step {}, then step {}'s update "
                                     "alone makes the weights non-finite: no growth",
                                     *wMin, levelMax(steps, s.step), s.step - 1, s.step));
    h.evidence.push_back(fmt::format(
        "step {}'s loss ({:.4g}) and gradient norm ({:.4g}) are finite and like the steps' before, at learning rate "
        "{:.4g}: the update used values its step's fingerprint (taken at its first backward()) does not hold (a "
        "later backward() in the step, gradients changed before the update) or the optimizer's own arithmetic made "
        "them (an eps of 0); the step to look at is {}",
        s.step, s.loss, s.gradNorm, s.learningRate, s.step));
  } else if (!std::isfinite(*wMax) || *wMax > 100 * *w0) {
    h.verdict = V::Confirmed;
    h.evidence.push_back(fmt::format("the weight norm grows from {:.4g} to {:.4g} over steps {}..{} before step {} fails",
                                     *w0, *wMax, steps.front().step, target - 1, target));
    if (jump)
      h.evidence.push_back(fmt::format("the learning rate jumps from {:.4g} to {:.4g} at step {}, before the weights run away",
                                       jump->from, jump->to, jump->step));
    if (const auto& first = f.steps->firstFailure)
      h.evidence.push_back(
          fmt::format("first step whose loss, gradients or weights go non-finite: {} ({})", first->step, first->reason));
  } else if (*wMax <= 2 * *w0) {
    h.verdict = V::Refuted;
    h.evidence.push_back(fmt::format("the weight norm stays within {:.4g}..{:.4g} up to the failing step", *wMin, *wMax));
  } else {
    h.evidence.push_back(fmt::format("the weight norm grows {:.1f}x: not conclusive", *wMax / *w0));
  }
  return h;
}

Hypothesis judgeDeviceSpecific(const TriageFacts& f) {
  Hypothesis h{"device-specific", V::Inconclusive, {}, fmt::format("crashcap bisect config {}", f.bundle)};
  if (!f.config) {
    h.evidence.push_back(f.replayBlocked().value_or("config bisection did not finish"));
    return h;
  }
  const auto& c = *f.config;
  const std::string recordedDevice = f.replay ? f.replay->recordedDevice : "";
  std::vector<std::string> same;
  for (const auto& d : c.devices)
    if (d.fails == c.baseline.fails) same.push_back(d.device);
  if (auto change = deviceChange(c)) {
    h.verdict = V::Confirmed;
    h.evidence.push_back(*change);
  } else if (!same.empty() && c.baseline.fails) {
    h.verdict = V::Refuted;
    h.evidence.push_back(fmt::format("the step fails on {} and on {}", c.baseline.device, fmt::join(same, ", ")));
  } else if (!recordedDevice.empty() && recordedDevice != c.baseline.device) {
    h.evidence.push_back(fmt::format(
        "recorded on {}, which is not here; on {} the step {}{}", recordedDevice, c.baseline.device,
        describe(c.baseline.fails),
        c.baseline.fails ? "" : ", which points at the device or its driver: replay it on a machine with " + recordedDevice));
  } else {
    h.evidence.push_back(fmt::format("only {} is here to replay on; another device would tell", c.baseline.device));
  }
  return h;
}

Hypothesis judgeConfigDependent(const TriageFacts& f) {
  Hypothesis h{"config-dependent", V::Inconclusive, {}, fmt::format("crashcap bisect config {}", f.bundle)};
  if (!f.config) {
    h.evidence.push_back(f.replayBlocked().value_or("config bisection did not finish"));
    return h;
  }
  const auto& c = *f.config;
  const std::string recordedDevice = f.replay ? f.replay->recordedDevice : "";
  const bool recordedOnGpu = c.baseline.device == "cpu" && !recordedDevice.empty() && recordedDevice != "cpu";
  if (auto change = settingChange(c)) {
    h.verdict = V::Confirmed;
    h.evidence.push_back(*change);
  } else if (c.baseline.fails && !c.flips.empty()) {
    std::vector<std::string> other;
    for (const auto& t : c.flips)
      if (!t.otherFailure.empty()) other.push_back(fmt::format("{}={} ({})", t.setting, t.value, t.otherFailure));
    if (other.size() < c.flips.size()) {
      // A GPU recording replayed on the CPU: the settings that act only on the GPU were not tried,
      // and any of them may be the one.
      h.verdict = recordedOnGpu && !c.notTried.empty() ? V::Inconclusive : V::Refuted;
      h.evidence.push_back(fmt::format("the step fails under each of {} single-setting changes", c.flips.size() - other.size()));
    }
    if (!other.empty())
      h.evidence.push_back(fmt::format("{} break{} the replay another way, which says nothing about this failure",
                                       fmt::join(other, "; "), other.size() == 1 ? "s" : ""));
  } else {
    h.evidence.push_back("no single setting change makes the step fail");
  }
  if (c.baseline.divergedAt) {
    // The trials start where the replay departed from the recording, not from the training's state.
    if (h.verdict == V::Confirmed) h.verdict = V::Inconclusive;
    h.evidence.push_back(fmt::format("the replay under the recorded settings departs from the recording at step {}: "
                                     "every trial starts from a state the training did not have",
                                     *c.baseline.divergedAt));
  }
  // Of a training recorded on the CPU, the CUDA-only settings say nothing; of a GPU's, where they count.
  if (recordedOnGpu && !c.notTried.empty())
    h.evidence.push_back(fmt::format("{} not tried: they change only CUDA kernels, and the replay runs on the CPU: "
                                     "replay on {} for them to count",
                                     fmt::join(c.notTried, ", "), recordedDevice));
  else if (recordedOnGpu)
    h.evidence.push_back("cudnn.* and TF32 settings do not change CPU kernels: replay on " + recordedDevice +
                         " for them to count");
  return h;
}

namespace {

// The replay from the newest keyframe departed at step d; the step bisection replays from the
// earliest one. When that matched the recording bit for bit through d, the same computation is
// deterministic, and the departure comes from where the first replay started: state of the
// program's that the newer keyframe does not hold. The earlier keyframe's step, or none.
std::optional<int64_t> matchedFromEarlierKeyframe(const TriageFacts& f) {
  const auto& r = *f.replay;
  if (!r.divergedAt || !f.steps || f.steps->fromKeyframe < 0 || f.steps->fromKeyframe >= r.keyframe) return std::nullopt;
  if (f.steps->divergedAt && *f.steps->divergedAt <= *r.divergedAt) return std::nullopt;
  bool reached = false;
  for (const auto& s : f.steps->steps) {
    if (s.step > *r.divergedAt) break;
    if (s.recorded && !s.bitwise) return std::nullopt;
    if (s.step == *r.divergedAt) reached = s.recorded && s.bitwise;
  }
  return reached ? std::optional<int64_t>(f.steps->fromKeyframe) : std::nullopt;
}

}  // namespace

Hypothesis judgeNondeterminism(const TriageFacts& f) {
  Hypothesis h{"nondeterminism", V::Inconclusive, {}, fmt::format("crashcap replay {}", f.bundle)};
  if (auto why = f.replayBlocked()) {
    h.evidence.push_back(*why);
    return h;
  }
  const auto& r = *f.replay;
  if (r.verdict == replayer::Verdict::ReproducedBitwise && r.skippedKeyframe) {
    h.verdict = V::Refuted;
    h.evidence.push_back(fmt::format(
        "the replay from keyframe {} departs from the recording at step {}, but from keyframe {} it matched the "
        "recording bit for bit over {} step{}: the computation is deterministic, and the program keeps state between "
        "steps that keyframe {} does not hold (a model outside the optimizer, a counter of its own); every experiment "
        "replays from keyframe {} (a nondeterminism too rare to show twice would look the same: `crashcap replay {} "
        "--keyframe {}` replays from the skipped one again)",
        r.skippedKeyframe->step, r.skippedKeyframe->divergedAt, r.keyframe, r.steps.size(), r.steps.size() == 1 ? "" : "s",
        r.skippedKeyframe->step,
        r.keyframe, f.bundle, r.skippedKeyframe->step));
  } else if (r.verdict == replayer::Verdict::ReproducedBitwise) {
    h.verdict = V::Refuted;
    h.evidence.push_back(fmt::format("replay matched the recording bit for bit over {} step{}", r.steps.size(),
                                     r.steps.size() == 1 ? "" : "s"));
  } else if (r.verdict == replayer::Verdict::Diverged) {
    if (auto earlier = matchedFromEarlierKeyframe(f)) {
      h.verdict = V::Refuted;
      h.evidence.push_back(fmt::format(
          "the replay from keyframe {} departs from the recording at step {}, but from keyframe {} (bisect steps) every "
          "step through {} matches it bit for bit: the computation is deterministic, and the program keeps state "
          "between steps that keyframe {} does not hold (an attribute of an object of its own, a tensor it keeps)",
          r.keyframe, *r.divergedAt, *earlier, *r.divergedAt, r.keyframe));
      return h;
    }
    h.verdict = V::Confirmed;
    h.evidence.push_back(r.divergedAt ? fmt::format("replay departs from the recording at step {}", *r.divergedAt)
                                      : "replay departs from the recording");
  } else {
    // The steps the recording has fingerprints of are the evidence either way.
    size_t compared = 0;
    bool same = r.sameSetup && !r.divergedAt;
    for (const auto& s : r.steps)
      if (s.recorded) {
        ++compared;
        same = same && s.bitwise;
      }
    if (same && compared > 0 && replayer::showsFailure(r)) {
      h.verdict = V::Refuted;
      h.evidence.push_back(fmt::format("the {} replayed step{} with a recorded fingerprint matched it bit for bit, and the "
                                       "failure came back (verdict {}: its error's text differs)",
                                       compared, compared == 1 ? "" : "s", replayer::verdictName(r.verdict)));
    } else if (same && compared > 0 && f.failedOutsideReplay()) {
      // What runs between steps is not replayed: a race there, or a device's asynchronous error
      // from the step's kernels surfacing at the first sync after it, is not tested either way.
      h.evidence.push_back(fmt::format("the {} replayed step{} with a recorded fingerprint matched it bit for bit; {}, "
                                       "which a replay does not run: a cause there (or a device's asynchronous error "
                                       "surfacing at its first sync) is not tested",
                                       compared, compared == 1 ? "" : "s", outsideReplayText(f)));
    } else if (same && compared > 0) {
      h.evidence.push_back(fmt::format("the {} replayed step{} with a recorded fingerprint matched it bit for bit, but the "
                                       "failing step ran clean here (verdict {}): a cause outside the step's "
                                       "computation, or a race within it",
                                       compared, compared == 1 ? "" : "s", replayer::verdictName(r.verdict)));
    } else {
      h.evidence.push_back(fmt::format("replay verdict {}", replayer::verdictName(r.verdict)));
    }
  }
  return h;
}

const std::vector<TriageRule>& triageRules() {
  static const std::vector<TriageRule> rules = {
      {"invalid-data", judgeInvalidData},
      {"loss-numerics", judgeLossNumerics},
      {"optimizer-divergence", judgeOptimizerDivergence},
      {"device-specific", judgeDeviceSpecific},
      {"config-dependent", judgeConfigDependent},
      {"nondeterminism", judgeNondeterminism},
  };
  return rules;
}

std::vector<Hypothesis> judge(const TriageFacts& facts) {
  std::vector<Hypothesis> out;
  for (const auto& rule : triageRules()) out.push_back(rule.judge(facts));
  return out;
}

Culprit findCulprit(const TriageFacts& f) {
  Culprit c;
  if (f.job) c.rank = f.job->rank;
  // Replayed, or as recorded when replay could not run; not a step that passed in the recording and
  // in its replay (the last step held when the failing one never reached the bundle).
  const bool passedBothTimes = f.replay && f.replay->recordedError.empty() && !replayer::showsFailure(*f.replay);
  if (f.step() >= 0 && !passedBothTimes) c.step = f.step();
  // Rows are a culprit only when they trigger the failure (any single row fails a diverged run).
  if (f.rowsTrigger()) {
    if (auto rows = f.culpritRows(); !rows.empty()) c.rows = rows;
    if (f.samples) c.datasetIndices = f.samples->datasetIndices;
  }
  // An error names the op it came out of; a non-finite value the first op that made one.
  std::optional<replayer::ProbedOp> op;
  if (f.replay) op = f.replay->raisingOp ? f.replay->raisingOp : f.replay->firstNonFiniteOp;
  if (raisedAboutNonFinite(f)) op = f.replay->firstNonFiniteOp;
  if (op) {
    c.op = op->name;
    c.phase = op->phase;
    if (!op->node.empty()) c.node = op->node;
  }
  if (f.reproduced() && f.replay->batchLoad && !f.replay->batchLoad->culprits.empty()) {
    // The samples of the batch that never came: named by dataset index, not by recorded rows.
    std::vector<int64_t> indices;
    for (const auto& l : f.replay->batchLoad->culprits) indices.push_back(l.datasetIndex);
    c.datasetIndices = indices;
    c.phase = "loading";
    c.node.reset();
  }
  if (f.config) c.changes = f.config->changesOutcome;
  if (!c.rows && f.otherLoader >= 0 && judgeInvalidData(f).verdict == V::Confirmed) {
    // The rows of another loader's batch (a validation pass's), the step the one the crash came after.
    std::vector<int64_t> rows, indices;
    for (const auto& r : f.otherBatchFindings) {
      if (!tiedToError(r, f) || std::find(rows.begin(), rows.end(), r.row) != rows.end()) continue;
      rows.push_back(r.row);
      if (r.datasetIndex) indices.push_back(*r.datasetIndex);
    }
    c.loader = f.otherLoader;
    c.rows = rows;
    if (indices.size() == rows.size()) c.datasetIndices = indices;
    c.phase = f.crashPhase;
    c.op.reset();  // what the replayed step ran is not where it failed
    c.node.reset();
  }
  if (!c.rows)
    if (const auto* v = raisingOpValue(f)) c.value = *v;
  if (!c.rows && !c.value) {
    if (const auto* empty = f.emptyMean()) {
      c.emptyMean = *empty;
      c.datasetIndices = f.batchDatasetIndices;
    } else if (f.shortBatch && judgeInvalidData(f).verdict != V::Refuted) {
      c.shortBatch = f.shortBatch;
    }
  }
  return c;
}

std::string leadingIndicesText(const std::vector<int64_t>& indices) {
  constexpr size_t kShown = 24;
  if (indices.size() <= kShown) return joinRows(indices);
  return fmt::format("{},... ({} in all)", joinRows(std::vector<int64_t>(indices.begin(), indices.begin() + kShown)),
                     indices.size());
}

std::optional<std::string> culpritBatchText(const Culprit& c) {
  if (c.shortBatch)
    return fmt::format("its short batch of {} row{} (earlier steps had {})", c.shortBatch->rows,
                       c.shortBatch->rows == 1 ? "" : "s", c.shortBatch->usualRows);
  if (!c.emptyMean) return std::nullopt;
  const auto& m = *c.emptyMean;
  if (m.empty) return "the whole batch, which leaves the loss an empty tensor to average";
  const std::string ignored = m.ignoreIndex ? fmt::format("ignore_index {}", *m.ignoreIndex) : "ignored";
  const std::string all = m.targets == 1 ? "its one target is" : fmt::format("all {} are", m.targets);
  return fmt::format("the whole batch, which gives the loss no target to count ({})",
                     m.ignored == m.targets ? fmt::format("{} {}", all, ignored)
                     : m.ignored == 0       ? fmt::format("{} of classes weighted 0", all)
                                            : fmt::format("{} are {}, {} of classes weighted 0", m.ignored, ignored,
                                                          m.targets - m.ignored));
}

std::string emptyMeanText(const replayer::EmptyMean& m) {
  if (m.empty)
    return fmt::format("{} an empty tensor (a mask that selected nothing?), dividing a sum of nothing by 0",
                       m.of.empty() ? "it averages" : "it is the mean " + m.of + " takes of");
  const std::string ignored = m.ignoreIndex ? fmt::format("ignore_index {}", *m.ignoreIndex) : "ignored";
  const char* all = m.targets == 1 ? "it is" : "all are";
  const std::string which = m.ignored == m.targets ? fmt::format("{} {}", all, ignored)
                            : m.ignored == 0       ? fmt::format("{} of classes whose weight is 0", all)
                                                   : fmt::format("{} are {}, the other {} of classes whose weight is 0",
                                                                 m.ignored, ignored, m.targets - m.ignored);
  return fmt::format("none of its {} target{} counts ({}), so its mean divides a sum of nothing by a total weight of 0",
                     m.targets, m.targets == 1 ? "" : "s", which);
}

std::string culpritValueText(const ConcatenatedValue& v, std::string_view quote) {
  return fmt::format("the value {:.0f} at element {} of {}{}{}{}", v.value, v.element, quote, v.tensor, quote,
                     v.row ? fmt::format(" (batch row {} by its {}{})", *v.row, v.byOffsets ? "offsets" : "lengths",
                                         v.datasetIndex ? fmt::format(", dataset index {}", *v.datasetIndex) : "")
                           : "");
}

}  // namespace crashcap::investigate
