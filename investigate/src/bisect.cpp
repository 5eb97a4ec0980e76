#include "crashcap/investigate/bisect.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <cmath>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/torch/settings.hpp"
#include "crashcap/inspect/host_tensor.hpp"
#include "crashcap/inspect/slice.hpp"
#include "crashcap/inspect/stats.hpp"
#include "crashcap/investigate/replays.hpp"
#include "crashcap/investigate/results_json.hpp"

namespace crashcap::investigate {
namespace {

std::string joinRows(const std::vector<int64_t>& rows) { return fmt::format("{}", fmt::join(rows, ",")); }

/// The replay a child experiment printed, nullopt when it printed none (`why`: its outcome, or why
/// the output holds no replay of the bundle: a job's rank that gave none).
std::optional<replayer::ReplayResult> replayOf(const Experiment& e, std::string* why) {
  if (!e.output) {
    *why = e.outcome;
    return std::nullopt;
  }
  try {
    return bundleReplayFromJson(*e.output);
  } catch (const Error& err) {
    *why = err.message();
    return std::nullopt;
  }
}

/// Whether a child replay shows the recorded failure: reproduced, or killed outright (the failure
/// in another form). A timeout or an unreadable result is not a failure of the step.
bool replayFails(const Experiment& e, std::string* error) {
  std::string why;
  auto r = replayOf(e, &why);
  if (!r) return e.killed();
  if (error) *error = lastLine(r->error);
  return replayer::showsFailure(*r);
}

/// The step a replay that gave no steps back had begun when its failure came back: where it died
/// of the recorded signal again, or where a job's rank hung again and was stopped. Every step
/// before it ran through.
std::optional<int64_t> endedInStep(const replayer::ReplayResult& r) {
  return r.diedInStep ? r.diedInStep : r.stoppedInStep;
}

}  // namespace

StepBisection bisectSteps(const std::string& bundle, int64_t step) {
  replayer::ReplayOptions ro;
  ro.step = step;
  ro.instrument = false;
  ro.fromEarliestKeyframe = true;
  auto r = investigate::replay(bundle, ro);
  StepBisection b;
  b.replays = 1;
  b.fromKeyframe = r.keyframe;
  b.target = r.step;
  if (r.steps.empty() && replayer::reproduces(r.verdict) && !r.error.empty() && r.keyframe >= 0) {
    // The program died of the recorded signal before it could answer (investigate::replay's
    // "killed again"), or a job's rank hung again: no step came back. When the program said which
    // step it died or was stopped in, every step before that one ran; else find the first step
    // whose replay fails by replaying to earlier targets. A replay to a step that passes answers
    // with every step up to it.
    int64_t lo = r.keyframe, hi = r.step;  // the replay to hi fails; every step before lo passes
    const auto ended = endedInStep(r);
    if (ended && *ended >= r.keyframe && *ended <= r.step) lo = hi = *ended;
    std::vector<replayer::StepReplay> passed;
    auto replayTo = [&](int64_t step) {
      replayer::ReplayOptions to = ro;
      to.step = step;
      ++b.replays;
      return investigate::replay(bundle, to);
    };
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      auto m = replayTo(mid);
      if (m.steps.empty() && replayer::reproduces(m.verdict)) {
        const auto midEnded = endedInStep(m);
        hi = midEnded && *midEnded >= lo && *midEnded <= mid ? *midEnded : mid;
      } else {
        lo = mid + 1;
        if (m.steps.size() > passed.size()) passed = std::move(m.steps);
      }
    }
    // The steps before it, with their fingerprints: one replay that stops before the step that
    // dies (it may die earlier this time: the failure then came back earlier, and is named there).
    while (passed.empty() && hi > r.keyframe) {
      auto m = replayTo(hi - 1);
      if (!m.steps.empty() || !replayer::reproduces(m.verdict)) {
        passed = std::move(m.steps);
        break;
      }
      const int64_t before = hi;
      const auto earlier = endedInStep(m);
      hi = earlier && *earlier >= r.keyframe && *earlier < hi ? *earlier : hi - 1;
      if (hi >= before) break;
    }
    // The steps before it, each as its passing replay gave it (the target of such a replay stops
    // before its update, so its weight norm is not there).
    for (auto& s : passed)
      if (s.step < hi) r.steps.push_back(std::move(s));
    replayer::StepReplay died;
    died.step = hi;
    died.error = r.error;
    r.steps.push_back(died);
  }
  b.firstFailure = replayer::firstFailure(r.steps);
  b.divergedAt = r.divergedAt;
  b.lostSteps = r.lostSteps;
  b.steps = std::move(r.steps);
  return b;
}

OpBisection bisectOps(const std::string& bundle, int64_t step, double tolerance, int64_t keyframe) {
  replayer::ReplayOptions ro;
  ro.step = step;
  ro.keyframe = keyframe;
  // Compared from a keyframe that misses the program's state between steps, both sides start from
  // a state the training never had: from the earlier keyframe a plain replay would take, when it
  // runs further (investigate::replay).
  auto compare = [&](const replayer::ReplayOptions& o) { return investigate::compareWithReference(bundle, o, tolerance); };
  const auto c = fromEarlierKeyframeIfItRunsFurther(
      bundle, ro, compare(ro), compare,
      [](replayer::ReferenceComparison& x) -> replayer::ReplayResult& { return x.replay; });
  auto side = [](const replayer::ReplayResult& r) {
    return ReplaySide{r.verdict, r.device, r.dtype, lastLine(r.error), r.firstNonFiniteOp};
  };
  OpBisection b;
  b.step = c.replay.step;
  b.replay = side(c.replay);
  b.reference = side(c.reference);
  b.firstDeparting = c.firstDeparting;
  b.tolerance = c.tolerance;
  b.opsCompared = c.opsCompared;
  b.stoppedBecause = c.stoppedBecause;
  return b;
}

bool OpBisection::referenceFailsTheSameWay() const {
  if (reference.error.empty() || reference.verdict == replayer::Verdict::Diverged) return false;
  auto nonFinite = [](const std::string& e) { return e.rfind("non-finite", 0) == 0; };
  return (nonFinite(reference.error) && nonFinite(replay.error)) || reference.error == replay.error;
}

std::optional<std::string> OpBisection::referenceNarrowedTo() const {
  if (!reference.firstNonFiniteOp || !referenceFailsTheSameWay()) return std::nullopt;
  for (const auto& out : reference.firstNonFiniteOp->outputs)
    if (out.nanCount + out.infCount > 0 && out.dtype != "Double" && out.dtype != "ComplexDouble") return out.dtype;
  return std::nullopt;
}

bool OpBisection::referenceNarrowsPastRange() const {
  const auto narrowed = referenceNarrowedTo();
  if (!narrowed) return false;
  const auto& op = *reference.firstNonFiniteOp;
  if ((op.name != "aten::to" && op.name != "aten::_to_copy") || op.inputs.empty()) return false;
  const auto& cast = op.inputs.front();  // the tensor cast; a to(other)'s other is not
  return cast.dtype != *narrowed && cast.nanCount + cast.infCount == 0;
}

int singleRowBound(int64_t batchSize) {
  return 2 * static_cast<int>(std::ceil(std::log2(std::max<int64_t>(batchSize, 2)))) + 3;
}

RowSearch searchRows(int64_t batchSize, const std::function<Trial(const std::vector<int64_t>&)>& test) {
  RowSearch result;
  // Parts of the batch tried so far that all failed another way, with one error up to its numbers
  // (a shape that names the part's size: "Expected hidden size (1, 4, 16)", then "(1, 2, 16)").
  int cutsFailing = 0;
  std::string cutsError;
  auto run = [&](const std::vector<int64_t>& rows) {
    auto t = test(rows);
    result.replays++;
    if (static_cast<int64_t>(rows.size()) < batchSize && cutsFailing >= 0) {
      if (!t.otherFailure.empty() &&
          (cutsFailing == 0 || replayer::sameFailure(t.otherFailure, cutsError))) {
        if (cutsFailing == 0) cutsError = t.otherFailure;
        ++cutsFailing;
      } else {
        cutsFailing = -1;  // a part that passed, failed as recorded, or failed with another error
      }
    }
    result.log.emplace_back(rows, std::move(t));
    return result.log.back().second.fails;
  };
  std::vector<int64_t> all(batchSize);
  for (int64_t i = 0; i < batchSize; ++i) all[i] = i;
  if (!run(all)) return result;
  result.reproduced = true;
  // ddmin from `current` (a set that fails) down to a 1-minimal one.
  auto minimize = [&](std::vector<int64_t> current) {
    size_t n = 2;
    while (current.size() >= 2) {
      // Split into n nearly equal parts.
      std::vector<std::vector<int64_t>> parts;
      size_t start = 0;
      for (size_t k = 0; k < n; ++k) {
        size_t end = start + (current.size() - start) / (n - k);
        parts.emplace_back(current.begin() + start, current.begin() + end);
        start = end;
      }
      bool reduced = false;
      for (const auto& p : parts) {
        if (cutsFailing >= kCutsFailTrials) break;
        if (!p.empty() && run(p)) {
          current = p;
          n = 2;
          reduced = true;
          break;
        }
      }
      if (!reduced && n > 2) {
        // Complements: with two parts they equal the parts, already tested.
        for (const auto& p : parts) {
          std::vector<int64_t> complement;
          std::set_difference(current.begin(), current.end(), p.begin(), p.end(), std::back_inserter(complement));
          if (cutsFailing >= kCutsFailTrials) break;
          if (!complement.empty() && run(complement)) {
            current = complement;
            n = std::max<size_t>(n - 1, 2);
            reduced = true;
            break;
          }
        }
      }
      if (cutsFailing >= kCutsFailTrials) {
        // Every part tried fails the same other way. The largest cut, the batch without one row,
        // tells a step that cannot run on part of its batch at all (it fails the same way again)
        // from one that needs more rows than the parts had (a top-k over the batch).
        std::vector<int64_t> largest(current.begin() + 1, current.end());
        if (run(largest)) {
          current = std::move(largest);
          n = 2;
          continue;
        }
        if (cutsFailing > kCutsFailTrials) {
          result.cutsFail = cutsError;
          break;
        }
      }
      if (!reduced) {
        if (n >= current.size()) break;
        n = std::min(2 * n, current.size());
      }
    }
    return current;
  };
  std::vector<int64_t> current = minimize(all);
  result.rows = current;
  if (!result.cutsFail.empty()) return result;
  if (current.size() > 1)
    for (int64_t row : current) {
      std::vector<int64_t> without;
      for (int64_t i = 0; i < batchSize; ++i)
        if (i != row) without.push_back(i);
      run(without);
      if (result.log.back().second.passes) result.triggers.push_back(row);
    }
  if (result.triggers.size() == current.size()) result.triggers.clear();  // every row is needed alike
  // Rows that fail without those (RowSearch::otherSets).
  std::set<int64_t> named(current.begin(), current.end());
  if (!result.triggers.empty()) named = std::set<int64_t>(result.triggers.begin(), result.triggers.end());
  for (size_t k = 0;; ++k) {
    std::vector<int64_t> rest;
    for (int64_t i : all)
      if (!named.count(i)) rest.push_back(i);
    if (rest.empty() || !run(rest)) break;  // it passes (or fails another way) without them
    if (k == kOtherSets) {
      result.restFails = true;
      break;
    }
    auto more = minimize(rest);
    if (!result.cutsFail.empty()) {  // what is left cannot run on fewer rows: the first set stands
      result.cutsFail.clear();
      result.restFails = true;
      break;
    }
    named.insert(more.begin(), more.end());
    result.otherSets.push_back(std::move(more));
  }
  return result;
}

std::vector<int64_t> SampleBisection::culprits() const {
  std::vector<int64_t> out = triggers.empty() ? rows : triggers;
  for (const auto& set : otherSets) out.insert(out.end(), set.begin(), set.end());
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<std::string> replayArgs(const std::string& bundle, int64_t step, std::vector<std::string> extra,
                                    bool instrument) {
  std::vector<std::string> args = {"replay", bundle};
  if (step >= 0) {
    args.push_back("--step");
    args.push_back(std::to_string(step));
  }
  args.insert(args.end(), extra.begin(), extra.end());
  args.push_back("--json");
  if (!instrument) args.push_back("--no-instrument");
  return args;
}

std::vector<int64_t> filledRows(const std::vector<int64_t>& rows, int64_t batchSize) {
  std::vector<int64_t> out;
  if (rows.empty()) return out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(batchSize, 0)));
  for (int64_t i = 0; i < batchSize; ++i) out.push_back(rows[static_cast<size_t>(i) % rows.size()]);
  return out;
}

std::vector<std::string> keyframeArgs(const replayer::ReplayResult& r, bool asked) {
  if ((!r.skippedKeyframe && !asked) || r.keyframe < 0) return {};
  return {"--keyframe", std::to_string(r.keyframe)};
}

std::optional<std::vector<int64_t>> datasetIndices(const std::string& bundle, int64_t step,
                                                   const std::vector<int64_t>& rows,
                                                   const std::optional<replayer::RowOrder>& order) {
  if (order && order->matched()) {
    std::vector<int64_t> out;
    for (int64_t r : rows) {
      if (r < 0 || r >= static_cast<int64_t>(order->datasetIndices.size()) ||
          order->datasetIndices[static_cast<size_t>(r)] < 0)
        return std::nullopt;  // a row the match left open: the sampler's index at its place is not its own
      out.push_back(order->datasetIndices[static_cast<size_t>(r)]);
    }
    return out;
  }
  auto reader = formats::BundleReader::open(bundle);
  auto name = formats::batchTensorName(step, formats::kDatasetIndexName);
  if (!reader->find(name)) return std::nullopt;
  auto t = inspect::loadTensor(*reader, name);
  if (t.shape.size() != 1 || formats::isFloating(t.dtype) || formats::isComplex(t.dtype)) return std::nullopt;
  std::vector<int64_t> out;
  for (int64_t r : rows) {
    if (r < 0 || r >= t.shape[0]) return std::nullopt;
    auto v = inspect::computeStats(inspect::applySlice(t, inspect::parseSlice(std::to_string(r))));
    if (!v.max) return std::nullopt;
    out.push_back(static_cast<int64_t>(*v.max));
  }
  return out;
}

SampleBisection bisectSamples(const std::string& bundle, int64_t step, ExperimentRunner& runner, int64_t keyframe) {
  if (isJobRank(bundle)) {
    // Each experiment replays the whole job with this rank's rows cut. A rank that failed only
    // because a peer did fails with any of its rows: the search would name an innocent row.
    auto origin = jobRankOrigin(bundle);
    if (origin.fromPeer && origin.firstFailed >= 0 && origin.firstFailed != origin.rank)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("{} is rank {} of job {}, whose failure reached it from a peer (rank {} failed first, on "
                              "its own): its own rows are not what the failure needs",
                              bundle, origin.rank, origin.jobId, origin.firstFailed),
                  origin.firstFailedBundle.empty()
                      ? std::string("rank ") + std::to_string(origin.firstFailed) + "'s bundle is not in the directory"
                      : "crashcap bisect samples " + origin.firstFailedBundle);
  }
  // A crash while loading the batch after a step: that step's recorded batch is not the failing one.
  std::optional<formats::CrashData> crash;
  try {
    crash = formats::readRecords(*formats::BundleReader::open(bundle)).crash;
  } catch (const Error&) {
    // Unreadable: the replay below says why.
  }
  if (crash && crash->phase == "loading" && !crash->loadingIndices.empty() && (step < 0 || step == crash->step))
    throw Error(ErrorCode::Unsupported,
                fmt::format("the recorded failure is the loading of the batch after step {} ({} samples), which never "
                            "came, not step {}'s recorded batch: its rows say nothing about it",
                            crash->step, crash->loadingIndices.size(), crash->step),
                fmt::format("the replay loads that batch again and names its samples that fail: crashcap replay {} "
                            "--json (batch_load), or crashcap triage {}",
                            bundle, bundle));
  // The whole-batch replay, from this process, tells the step and the batch size.
  replayer::ReplayOptions first;
  first.step = step;
  first.keyframe = keyframe;
  first.instrument = false;
  auto base = investigate::replay(bundle, first);
  SampleBisection b;
  b.step = base.step;
  b.batchSize = base.batchSize;
  b.replayBound = singleRowBound(base.batchSize);
  b.lostSteps = base.lostSteps;
  b.rowOrder = base.rowOrder;
  if (base.verdict == replayer::Verdict::RecordingIncomplete) return b;  // the step cannot be reached
  // A program (or a job's rank) that died of its signal again or hung again: no step answered.
  // When it died in the target step itself, its rows are still tested: each experiment cuts them
  // there, and dies again or answers.
  if (base.steps.empty() && !(base.diedInStep && *base.diedInStep == base.step && base.batchSize > 0))
    throw Error(ErrorCode::Unsupported,
                fmt::format("the replay of step {} gave no steps to compare ({}): its rows cannot be tested", base.step,
                            lastLine(base.error)));
  // Every experiment starts from the keyframe the whole batch's replay settled on.
  const auto from = keyframeArgs(base, keyframe >= 0);
  auto test = [&](const std::vector<int64_t>& rows) {
    std::vector<std::string> extra = {"--rows", joinRows(rows)};
    extra.insert(extra.end(), from.begin(), from.end());
    auto e = runner.run(fmt::format("rows [{}]", joinRows(rows)), replayArgs(bundle, base.step, extra));
    Trial t;
    t.seconds = e.seconds;
    t.command = fmt::format("crashcap replay {} --step {} --rows {}{}", bundle, base.step, joinRows(rows),
                            from.empty() ? "" : " --keyframe " + from.back());
    // A replay that refused to run (the program cannot keep a subset of rows) says nothing about
    // the rows: the search stops with its reason instead of counting it as a pass.
    std::string why;
    auto r = replayOf(e, &why);
    if (!r && !e.killed() && !e.timedOut)
      throw Error(ErrorCode::Unsupported,
                  fmt::format("the replay that keeps rows [{}] of step {} did not run: {}", joinRows(rows), base.step,
                              why.rfind("failed: ", 0) == 0 ? why.substr(8) : why),
                  fmt::format("run it by hand: {}", t.command));
    std::string error;
    t.fails = replayFails(e, &error);
    t.passes = r && !t.fails && r->error.empty();
    if (r && !t.fails && !t.passes && !error.empty()) t.otherFailure = error;
    if (r && r->steps.empty() && r->diedInStep && *r->diedInStep < base.step) {
      // Killed again before the step whose rows it cuts: the rows were never in it.
      t.fails = t.passes = false;
      t.otherFailure.clear();
      t.outcome = fmt::format("died in step {}, before step {} whose rows it keeps: counted as a pass",
                              *r->diedInStep, base.step);
      return t;
    }
    if (r)
      t.outcome = t.fails      ? fmt::format("fails ({})", error.empty() ? "the recorded failure" : error)
                  : t.passes   ? "passes"
                               : fmt::format("fails another way ({}): counted as a pass", error);
    else
      t.outcome = e.outcome;
    return t;
  };
  auto search = searchRows(base.batchSize, test);
  if (!search.cutsFail.empty()) {
    // The step cannot run on fewer rows (a target the program makes for the whole batch, a hidden
    // state of the batch's size). Test the rows in batches of the whole size instead: the rows an
    // experiment leaves out are replaced by copies of those it keeps, in turn. A NaN copied stays
    // a NaN; a batch of the clean rows copied is clean.
    // A control guards against a step that fails on any batch of few distinct rows (a
    // normalisation by the batch's spread, which is 0 there): as many rows, none of the culprits,
    // filled the same way, must pass.
    RowSearch filled;
    bool controlPasses = false;
    try {
      filled = searchRows(base.batchSize, [&](const std::vector<int64_t>& rows) {
        return test(filledRows(rows, base.batchSize));
      });
      std::vector<int64_t> control;
      for (int64_t r = 0; r < base.batchSize && control.size() < filled.rows.size(); ++r)
        if (std::find(filled.rows.begin(), filled.rows.end(), r) == filled.rows.end()) control.push_back(r);
      if (filled.reproduced && filled.cutsFail.empty() && control.size() == filled.rows.size()) {
        Trial t = test(filledRows(control, base.batchSize));
        filled.replays++;
        controlPasses = t.passes;
        filled.log.emplace_back(control, std::move(t));
      }
    } catch (const Error&) {
      // A filled batch the program refused: the first search's end stands.
    }
    search.replays += filled.replays;
    for (auto& t : filled.log) search.log.push_back(std::move(t));
    if (filled.reproduced && filled.cutsFail.empty() && controlPasses) {
      b.filledBecause = search.cutsFail;
      filled.replays = search.replays;
      filled.log = std::move(search.log);
      search = std::move(filled);
    }
  }
  b.reproduced = search.reproduced;
  b.rows = search.rows;
  b.triggers = search.triggers;
  b.otherSets = search.otherSets;
  b.restFails = search.restFails;
  b.replays = search.replays;
  b.trials = std::move(search.log);
  b.cutsFail = search.cutsFail;
  if (b.reproduced && b.cutsFail.empty()) b.datasetIndices = datasetIndices(bundle, b.step, b.culprits(), b.rowOrder);
  return b;
}

ConfigBisection bisectConfig(const std::string& bundle, int64_t step, ExperimentRunner& runner, int64_t keyframe) {
  std::vector<std::string> asked;
  if (keyframe >= 0) asked = {"--keyframe", std::to_string(keyframe)};
  auto baseline = runner.run("as recorded", replayArgs(bundle, step, asked));
  if (!baseline.output)
    throw Error(ErrorCode::Unsupported,
                fmt::format("the replay under the recorded settings did not finish: {}", baseline.outcome),
                fmt::format("run it by hand: {}", baseline.command));
  const auto base = bundleReplayFromJson(*baseline.output);
  ConfigBisection b;
  b.step = base.step;
  b.baseline.device = base.device;
  b.baseline.recordedDevice = base.recordedDevice;
  b.baseline.settings = base.settings;
  // Another setup is not held to the recording's bits, so a trial never "diverges": the baseline is
  // judged by its failing step alone too, or a replay that departs before it would make every trial
  // that fails there look like a change of outcome.
  const bool reachedTarget = !base.steps.empty() && base.steps.back().step == base.step;
  b.baseline.fails = replayer::showsFailure(base) ||
                     (base.verdict == replayer::Verdict::Diverged && reachedTarget && !base.error.empty());
  b.baseline.divergedAt = base.divergedAt;
  b.baseline.error = lastLine(base.error);
  b.baseline.command = baseline.command;
  // Every trial starts from the keyframe the baseline settled on.
  const auto from = keyframeArgs(base, keyframe >= 0);
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), from.begin(), from.end());
    return replayArgs(bundle, step, extra);
  };
  auto trial = [&](const Experiment& e) {
    ConfigTrial t;
    t.command = e.command;
    t.seconds = e.seconds;
    t.outcome = e.outcome;
    t.fails = replayFails(e, &t.error);
    std::string why;
    auto r = replayOf(e, &why);
    if (!r && !t.fails) t.otherFailure = why;  // a timeout, or the replay could not run
    if (r && !t.fails) {
      for (const auto& s : r->steps)
        if (!s.error.empty()) {
          t.otherFailure = fmt::format("step {} throws: {}", s.step, lastLine(s.error));
          break;
        }
    }
    return t;
  };
  b.flipsAtTarget = true;
  for (const auto& name : formats::torch::settingNames()) {
    auto it = base.recordedSettings.find(name);
    if (it == base.recordedSettings.end()) continue;  // an older recording without it
    if (!replayer::settingActsOn(name, base.device)) {
      b.notTried.push_back(name);
      continue;
    }
    // A value the recording does not know (TF32 set through fp32_precision) has no flip: both.
    const std::vector<std::string> values =
        it->second == formats::torch::kSetThroughPrecisionApi
            ? std::vector<std::string>{"true", "false"}
            : std::vector<std::string>{formats::torch::flippedSetting(name, it->second)};
    for (const auto& flipped : values) {
      // The setting changes for the failing step alone: a flip from the keyframe on would change
      // every step before it too (autocast, threads), and the failing step would start from
      // weights the training never had, so a failure that goes away could have gone with them.
      ConfigTrial t = trial(runner.run(name + "=" + flipped, with({"--set", name + "=" + flipped, "--set-at-target"})));
      t.setting = name;
      t.recorded = it->second;
      t.value = flipped;
      if (t.fails != b.baseline.fails && t.otherFailure.empty())
        b.changesOutcome.push_back(fmt::format("{}={}", name, flipped));
      b.flips.push_back(t);
    }
  }
  for (const auto& device : replayer::availableDevices()) {
    if (device == base.device) continue;
    ConfigTrial t = trial(runner.run("device " + device, with({"--device", device})));
    t.device = device;
    if (t.fails != b.baseline.fails && t.otherFailure.empty()) b.changesOutcome.push_back("device=" + device);
    b.devices.push_back(t);
  }
  b.experiments = runner.log();
  return b;
}

}  // namespace crashcap::investigate
