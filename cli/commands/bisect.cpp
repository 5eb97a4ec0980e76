// crashcap bisect steps|ops|samples|config: what the failure needs.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "damage.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/investigate/bisect.hpp"
#include "crashcap/investigate/results_json.hpp"
#include "replays.hpp"

namespace crashcap::cli {
namespace {

struct Options {
  std::string what;                    ///< steps | ops | samples | config
  std::string bundle;
  int64_t step = -1;
  int64_t keyframe = -1;               ///< ops, samples, config: -1 = the one the first replay settles on
  double timeout = 300;
  double tolerance = 1e-3;             ///< ops: normalised error allowed against float64
  bool json = false;
  bool allowDamaged = false;
};

/// "it throws", or how the program died or hung in it ("killed by SIGSEGV again, as in the
/// recording"; a job's rank stopped again where it hung).
std::string failingError(const investigate::StepBisection& b, int64_t step) {
  for (const auto& s : b.steps) {
    if (s.step != step) continue;
    if (s.error.rfind("killed by ", 0) == 0) return "its replay was " + s.error;
    if (s.error.rfind("had not ended", 0) == 0) return "its replay hung again and was stopped in it, as in the recording";
  }
  return "it throws";
}

void printSteps(const investigate::StepBisection& b) {
  std::cout << fmt::format("replayed steps {}..{} from keyframe {}{}\n", b.fromKeyframe, b.target, b.fromKeyframe,
                           b.replays > 1 ? fmt::format(" ({} replays: it ended without answering)", b.replays) : "");
  std::cout << "  step   lr           loss           grad norm      weight norm after update\n";
  for (const auto& s : b.steps)
    std::cout << fmt::format("  {:<6} {:<12.4g} {:<14} {:<14} {}\n", s.step, s.learningRate,
                             s.hasLoss ? fmt::format("{:.7g}", s.loss) : "-",
                             s.hasGradNorm ? fmt::format("{:.7g}", s.gradNorm) : "-",
                             s.weightNorm ? fmt::format("{:.7g}", *s.weightNorm) : std::string("-"));
  if (!b.lostSteps.empty())
    std::cout << fmt::format("the recording lost step {}: the replay stopped before it\n", joinRows(b.lostSteps));
  if (const auto& first = b.firstFailure)
    std::cout << fmt::format("first failing step: {} ({})\n", first->step,
                             first->reason == "weights" ? "its update made weights non-finite"
                             : first->reason == "error" ? failingError(b, first->step)
                                                        : "its " + first->reason + " is non-finite");
  else
    std::cout << "no replayed step fails\n";
}

void printSamples(const std::string& bundle, const investigate::SampleBisection& b) {
  if (!b.lostSteps.empty()) {
    std::cout << fmt::format("step {} cannot be replayed: the recording lost step {} of its window; nothing to bisect\n",
                             b.step, joinRows(b.lostSteps));
    return;
  }
  if (!b.reproduced) {
    std::cout << fmt::format("step {} does not fail when replayed with its whole batch: nothing to bisect\n", b.step);
    return;
  }
  if (!b.cutsFail.empty()) {
    std::cout << fmt::format(
        "step {}: every part of the batch tried fails another way ({}; {} replays): the step cannot run on part of its "
        "batch (a tensor of the program's sized for the whole batch does this: a recurrent hidden state carried from "
        "step to step, a target made as torch.ones(batch_size, 1)), so no row "
        "can be told from another by leaving rows out\n",
        b.step, b.cutsFail, b.replays);
    for (const auto& [rows, t] : b.trials)
      if (static_cast<int64_t>(rows.size()) < b.batchSize) {
        std::cout << "rerun: " << t.command << "\n";
        break;
      }
    return;
  }
  if (!b.filledBecause.empty())
    std::cout << fmt::format("cut to fewer rows, step {} fails another way ({}): each experiment fed a batch of the "
                             "whole {} rows, those it left out replaced by copies of those it kept\n",
                             b.step, b.filledBecause, b.batchSize);
  const auto& culprits = b.culprits();
  std::string indices = b.datasetIndices ? fmt::format(", dataset index {}", joinRows(*b.datasetIndices)) : "";
  if (b.datasetIndices && b.rowOrder && (b.rowOrder->order == "reordered" || b.rowOrder->order == "partial"))
    indices += " (matched to its row after the collate function reordered the samples)";
  else if (b.datasetIndices && b.rowOrder && b.rowOrder->order == "unchecked")
    indices += fmt::format(" (in the sampler's order, which the program's collate function may have changed: {})",
                           b.rowOrder->why);
  else if (!b.datasetIndices && b.rowOrder && b.rowOrder->order == "partial")
    indices = fmt::format(" (no dataset index: the collate function reordered the samples, and {})", b.rowOrder->why);
  if (!b.otherSets.empty()) {
    std::string sets = fmt::format("[{}]", joinRows(b.triggers.empty() ? b.rows : b.triggers));
    for (const auto& set : b.otherSets) sets += fmt::format(", then without those [{}]", joinRows(set));
    std::cout << fmt::format("step {}: batch rows [{}] of {}{} fail on their own: rows {}", b.step, joinRows(culprits),
                             b.batchSize, indices, sets);
  } else if (b.triggers.empty()) {
    std::cout << fmt::format("step {}: the failure needs batch row{} [{}] of {}{}", b.step, b.rows.size() == 1 ? "" : "s",
                             joinRows(b.rows), b.batchSize, indices);
  } else {
    std::cout << fmt::format("step {}: batch row{} [{}] of {}{} trigger{} the failure (the whole batch passes without "
                             "{}); the smallest set that fails is rows [{}], the others only let the step run",
                             b.step, culprits.size() == 1 ? "" : "s", joinRows(culprits), b.batchSize, indices,
                             culprits.size() == 1 ? "s" : "", culprits.size() == 1 ? "it" : "them", joinRows(b.rows));
  }
  if (b.restFails)
    std::cout << fmt::format("; the batch without rows [{}] still fails: more rows fail on their own (not searched)",
                             joinRows(culprits));
  if (b.triggers.empty())
    std::cout << fmt::format(" ({} replays; a single culprit row takes at most {})\n", b.replays, b.replayBound);
  else  // the search for the smallest set, then one replay of the whole batch without each of its rows
    std::cout << fmt::format(" ({} replays, {} of them the whole batch without each row of the smallest set)\n",
                             b.replays, b.rows.size());
  // The experiment that kept just those rows, as it ran (filled to the batch's size, from the
  // keyframe the search settled on).
  std::string rerun = fmt::format("crashcap replay {} --step {} --rows {}", bundle, b.step, joinRows(b.rows));
  for (const auto& [rows, t] : b.trials)
    if (rows == b.rows && !t.command.empty()) rerun = t.command;
  std::cout << "rerun: " << rerun << "\n";
}

void printOps(const investigate::OpBisection& b) {
  const auto& nonFinite = b.replay.firstNonFiniteOp;
  // A reference that fails the same way at an op the step itself ran narrow (a .float(),
  // autocast) did not fail in float64: say which op and dtype.
  std::string reference = b.reference.error.empty() ? "passes" : "fails another way: " + b.reference.error;
  const auto narrowed = b.referenceNarrowedTo();
  if (b.referenceNarrowsPastRange())
    reference = fmt::format("goes non-finite only at {}, where the step casts its float64 values to {} itself: they "
                            "exceed {}'s range (not a float64 failure; that range is involved)",
                            b.reference.firstNonFiniteOp->name, *narrowed, *narrowed);
  else if (narrowed)
    reference = fmt::format("goes non-finite at {}, which ran in {} there: the step narrows the widened values itself, "
                            "so this is not a float64 failure and says nothing about float32 rounding or range",
                            b.reference.firstNonFiniteOp->name, *narrowed);
  else if (b.referenceFailsTheSameWay())
    reference = "fails the same way";
  std::cout << fmt::format("step {} replayed as recorded ({}) and in float64 on the CPU ({})\n", b.step,
                           b.replay.error.empty() ? "passes" : "fails", reference);
  if (nonFinite)
    std::cout << fmt::format("first op with a non-finite output: {} ({}, op #{})\n", nonFinite->name, nonFinite->phase,
                             nonFinite->index);
  else
    std::cout << "no op output goes non-finite\n";
  if (const auto& d = b.firstDeparting)
    std::cout << fmt::format("first op departing from float64: {} ({}, outermost op #{}): error {:.3g} over {} elements "
                             "(tolerance {:.3g} of the reference's largest value)\n",
                             d->name, d->phase, d->index, d->error, d->elements, b.tolerance);
  else
    std::cout << fmt::format("no op departs from float64 beyond {:.3g} ({} ops compared)\n", b.tolerance, b.opsCompared);
  if (!b.stoppedBecause.empty()) std::cout << "comparison stopped: " << b.stoppedBecause << "\n";
}

void printConfig(const investigate::ConfigBisection& b) {
  const bool baseFails = b.baseline.fails;
  std::cout << fmt::format("step {} under the recorded settings on {}: {}\n", b.step, b.baseline.device,
                           baseFails ? "fails" : "passes");
  if (b.flipsAtTarget)
    std::cout << fmt::format("each setting below is changed for step {} alone; the steps before it run as recorded\n",
                             b.step);
  std::cout << fmt::format("  {:<48} {:<10} {}\n", "change", "outcome", "rerun");
  auto row = [&](const std::string& change, const investigate::ConfigTrial& t) {
    std::string outcome = t.fails ? "fails" : !t.otherFailure.empty() ? "breaks" : t.outcome == "ok" ? "passes" : t.outcome;
    std::cout << fmt::format("  {:<48} {:<10} {}{}\n", change, outcome, t.command,
                             !t.otherFailure.empty() ? fmt::format("   <- another failure ({}): says nothing here", t.otherFailure)
                             : t.fails != baseFails  ? "   <- changes the outcome"
                                                     : "");
  };
  for (const auto& f : b.flips) row(fmt::format("{}={} (was {})", f.setting, f.value, f.recorded), f);
  for (const auto& d : b.devices) row("device " + d.device, d);
  const std::string& recorded = b.baseline.recordedDevice;
  if (!b.notTried.empty())
    std::cout << fmt::format("not tried on {}: {}, which change only CUDA kernels (a flip would replay the same bits){}\n",
                             b.baseline.device, fmt::join(b.notTried, ", "),
                             !recorded.empty() && recorded != b.baseline.device
                                 ? fmt::format("; replay on {}, where it was recorded, for them to count", recorded)
                                 : "");
  if (b.changesOutcome.empty())
    std::cout << (b.notTried.empty() ? "no single setting or device changes the outcome\n"
                                     : "no single setting or device tried changes the outcome\n");
  else
    std::cout << fmt::format("the outcome depends on: {}\n", fmt::join(b.changesOutcome, ", "));
}

int bisect(const Options& o) {
  checkIntact(o.bundle, o.allowDamaged);
  investigate::ExperimentOptions eo;
  eo.allowDamaged = o.allowDamaged;
  eo.timeoutSeconds = o.timeout;
  eo.progress = !o.json;
  if (o.what == "steps" && o.keyframe >= 0)
    throw Error(ErrorCode::InvalidArgument,
                "bisect steps replays the retained history from the earliest keyframe: --keyframe is for ops, "
                "samples and config",
                fmt::format("crashcap bisect steps {}", o.bundle));
  if (o.what == "steps") {
    auto b = investigate::bisectSteps(o.bundle, o.step);
    o.json ? printJson(investigate::toJson(b)) : printSteps(b);
  } else if (o.what == "ops") {
    auto b = investigate::bisectOps(o.bundle, o.step, o.tolerance, o.keyframe);
    o.json ? printJson(investigate::toJson(b)) : printOps(b);
  } else if (o.what == "samples") {
    investigate::ExperimentRunner runner(eo);
    auto b = investigate::bisectSamples(o.bundle, o.step, runner, o.keyframe);
    o.json ? printJson(investigate::toJson(b)) : printSamples(o.bundle, b);
  } else if (o.what == "config") {
    investigate::ExperimentRunner runner(eo);
    auto b = investigate::bisectConfig(o.bundle, o.step, runner, o.keyframe);
    o.json ? printJson(investigate::toJson(b)) : printConfig(b);
  } else {
    throw Error(ErrorCode::InvalidArgument, fmt::format("bisect {}: unknown", o.what), "bisect steps|ops|samples|config BUNDLE");
  }
  return kExitOk;
}

Command bisectCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("bisect", torchCommandSummary("bisect"));
  cmd->add_option("what", o->what, "steps | ops | samples | config")
      ->required()
      ->check(CLI::IsMember({"samples", "steps", "ops", "config"}));
  cmd->add_option("bundle", o->bundle,
                  "Crash bundle with a step program, or made with setModel + setStep; or a job archive "
                  "(crashcap merge), from the rank that failed first; or one rank of an archive, "
                  "JOB.ccap:crash-....ccap")
      ->required();
  cmd->add_option("--step", o->step, "Step to bisect (default: the crash's step)");
  cmd->add_option("--keyframe", o->keyframe,
                  "ops, samples, config: start every replay from the keyframe of this step (default: the one the "
                  "first replay settles on, as crashcap replay chooses it: a replay that departs from the newest "
                  "keyframe is tried from the earliest)");
  cmd->add_option("--timeout", o->timeout, "Seconds per experiment before it is killed")->capture_default_str();
  cmd->add_option("--tolerance", o->tolerance, "ops: error allowed against float64, relative to the largest value")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print one JSON object instead of text");
  addAllowDamaged(cmd, o->allowDamaged);
  addAllowChangedSource(cmd);
  cmd->footer("steps: replays the retained history from the earliest keyframe; the first step that throws or whose\n"
              "  loss, gradient norm or updated weights go non-finite.\n"
              "ops: the first op whose output goes non-finite, and the first whose output departs from a float64\n"
              "  CPU replay of the same step beyond --tolerance.\n"
              "samples: delta debugging over the failing step's batch: the samples the failure needs, named by\n"
              "  their row in the batch and, when the batch carried an `index` tensor, their dataset index.\n"
              "config: the step under the recorded settings, then with each of cudnn.enabled, cudnn.benchmark,\n"
              "  cudnn.deterministic, cudnn.allow_tf32, cuda.matmul.allow_tf32, torch.deterministic_algorithms,\n"
              "  torch.autocast, torch.threads flipped for the failing step alone (replay --set-at-target: the\n"
              "  steps before it run as recorded, so only the step's own computation changes), and on each other\n"
              "  device here (from the keyframe on).\n"
              "Experiments of samples and config are `crashcap replay` child processes with a timeout, so a crash\n"
              "or hang is a result, not the end. A setModel recording replays in its own program (see replay --help).");
  return {cmd, [o] { return endingLikeTheProgram([&] { return onBundleOrJobArchive(o->bundle, [&] { return bisect(*o); }); }); }, &o->json};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(210, crashcap::cli::bisectCommand)
