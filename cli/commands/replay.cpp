// crashcap replay: re-runs the failing step from a bundle and says whether the crash reproduces.
#include <fmt/format.h>

#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "damage.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/torch/settings.hpp"
#include "crashcap/investigate/replays.hpp"
#include "crashcap/investigate/results_json.hpp"
#include "crashcap/investigate/triage.hpp"
#include "replays.hpp"
#include "crashcap/replayer/replay.hpp"

namespace crashcap::cli {
namespace {

struct Options {
  std::string bundle;
  int64_t step = -1;
  int64_t keyframe = -1;               ///< -1: the newest before the step (or an earlier one, when it departs)
  std::string device;                  ///< "": the recorded device when here, else cpu
  std::string dtype;                   ///< "" | "float64"
  std::vector<std::string> settings;   ///< "NAME=VALUE"
  bool settingsAtTarget = false;
  std::string rows;                    ///< "0,3,5": keep only these rows of the target step's batch
  bool noInstrument = false;
  bool json = false;
  bool allowDamaged = false;
  double timeout = 0;                  ///< seconds; 0: no limit
};

std::map<std::string, std::string> parseSettings(const std::vector<std::string>& items) {
  std::map<std::string, std::string> out;
  for (const auto& item : items) {
    auto eq = item.find('=');
    if (eq == std::string::npos)
      throw Error(ErrorCode::InvalidArgument, fmt::format("--set '{}' is not SETTING=VALUE", item),
                  fmt::format("e.g. --set cudnn.benchmark=false; settings: {}",
                              fmt::join(formats::torch::settingNames(), ", ")));
    std::string name = item.substr(0, eq);
    formats::torch::currentSetting(name);  // an unknown name is a usage error now, not in the child
    out[name] = item.substr(eq + 1);
  }
  return out;
}

std::string settingsText(const std::map<std::string, std::string>& now, const std::map<std::string, std::string>& recorded) {
  std::string changed;
  for (const auto& [name, value] : now) {
    auto it = recorded.find(name);
    if (it == recorded.end() || it->second != value)
      changed += fmt::format("{}{}={} (recorded {})", changed.empty() ? "" : ", ", name, value,
                             it == recorded.end() ? "unknown" : it->second);
  }
  return changed.empty() ? "settings as recorded" : "settings changed: " + changed;
}

std::string valueLine(const char* what, const replayer::ValueStats& v) {
  return fmt::format("  {} {}[{}]  NaN {}  Inf {}  finite range {}..{}\n", what, v.dtype, fmt::join(v.shape, ", "),
                     v.nanCount, v.infCount, v.min ? fmt::format("{:.6g}", *v.min) : "-",
                     v.max ? fmt::format("{:.6g}", *v.max) : "-");
}

void printReplay(const std::string& bundle, const replayer::ReplayResult& r) {
  // A replay that stopped before its target (a step that threw) says where it stopped.
  const int64_t last = r.steps.empty() ? r.step : r.steps.back().step;
  if (r.steps.empty())  // a program that died replaying (its notes say how): no step came back
    std::cout << fmt::format("replayed {} from keyframe {} towards step {}: no step came back{}\n", bundle, r.keyframe,
                             r.step,
                             r.diedInStep      ? fmt::format(" (it died in step {})", *r.diedInStep)
                             : r.stoppedInStep ? fmt::format(" (it was stopped in step {})", *r.stoppedInStep)
                                               : "");
  else
    std::cout << fmt::format("replayed steps {}..{}{} of {} from keyframe {} on {} ({} threads, {}) in {:.0f} ms\n",
                             r.keyframe, last, last == r.step ? std::string() : fmt::format(" (of {})", r.step), bundle,
                             r.keyframe, r.device, r.threads, r.dtype == "float64" ? "float64" : "dtype as recorded",
                             r.loadMs + r.replayMs);
  if (!r.sameSetup && !r.steps.empty())
    std::cout << fmt::format("  not the recorded setup (recorded on {}; {}): only the failure is compared, not the bits\n",
                             r.recordedDevice.empty() ? "an unknown device" : r.recordedDevice,
                             settingsText(r.settings, r.recordedSettings) +
                                 (r.settingsAtTarget ? fmt::format(" at step {} alone", r.step) : ""));
  if (r.skippedKeyframe)
    std::cout << fmt::format("  note: the replay from keyframe {} departed from the recording at step {}, this one from "
                             "keyframe {} did not: keyframe {} does not hold all the state the program keeps between "
                             "steps (a model outside the optimizer, a counter of its own)\n",
                             r.skippedKeyframe->step, r.skippedKeyframe->divergedAt, r.keyframe, r.skippedKeyframe->step);
  for (const auto& n : r.notes) std::cout << fmt::format("  note: {}\n", n);
  for (const auto& s : r.steps) {
    std::cout << fmt::format("  step {:<5} loss {:<14} grad norm {:<14} {}", s.step, s.hasLoss ? fmt::format("{:.7g}", s.loss) : "-",
                             s.hasGradNorm ? fmt::format("{:.7g}", s.gradNorm) : "-",
                             s.untrained  ? "(trained on none of its batch, as recorded)"
                             : !s.recorded  ? "(no recorded fingerprint)"
                             : s.bitwise ? "= recording, bit for bit"
                                         : fmt::format("!= recording ({:.7g}, {:.7g})", s.recordedLoss, s.recordedGradNorm));
    if (!s.error.empty()) std::cout << "  error: " << lastLine(s.error);
    std::cout << "\n";
  }
  std::cout << fmt::format("verdict  {}\n", replayer::verdictName(r.verdict));
  if (!r.lostSteps.empty())
    std::cout << fmt::format("the recording lost step{} {} of the replay window (keyframe {} to step {}): replay stopped before it, "
                             "since every later step would start from the wrong state. This says nothing about the "
                             "training (`crashcap inspect {}` lists what was lost)\n",
                             r.lostSteps.size() == 1 ? "" : "s", joinRows(r.lostSteps), r.keyframe, r.step, bundle);
  if (r.rowOrder && r.rowOrder->order == "reordered")
    std::cout << fmt::format("rows     the collate function reorders the samples: row by row, dataset indices {} "
                             "(the batch's index tensor holds the sampler's order)\n",
                             r.rowOrder->datasetIndices.size() <= 16
                                 ? joinRows(r.rowOrder->datasetIndices)
                                 : joinRows({r.rowOrder->datasetIndices.begin(), r.rowOrder->datasetIndices.begin() + 16}) +
                                       fmt::format(", ... ({} more: --json, row_order)", r.rowOrder->datasetIndices.size() - 16));
  else if (r.rowOrder && r.rowOrder->order == "partial")
    std::cout << fmt::format("rows     the collate function reorders the samples, and {}: the dataset index of each "
                             "row matched is in --json (row_order)\n",
                             r.rowOrder->why);
  else if (r.rowOrder && r.rowOrder->order == "unchecked")
    std::cout << fmt::format("rows     in the sampler's order as far as crashcap knows: the collate function is the "
                             "program's, and {}\n", r.rowOrder->why);
  if (r.divergedAt)
    std::cout << fmt::format("diverged at step {}: replay departs from the recording (nondeterminism?)\n", *r.divergedAt);
  if (!r.error.empty()) std::cout << fmt::format("error    {}\n", r.error);
  if (r.raisingOp) {
    const auto& f = *r.raisingOp;
    std::cout << fmt::format("raised in {} ({}{}, op #{} of the step)\n", f.name, f.phase,
                             investigate::nodeText(f.node), f.index);
    for (const auto& v : f.inputs) std::cout << valueLine("input ", v);
  }
  if (r.firstNonFiniteOp) {
    const auto& f = *r.firstNonFiniteOp;
    std::cout << fmt::format("first op with a non-finite output: {} ({}{}, op #{} of the step, autograd seq {})\n",
                             f.name, f.phase, investigate::nodeText(f.node), f.index, f.seq);
    for (const auto& v : f.inputs) std::cout << valueLine("input ", v);
    for (const auto& v : f.outputs) std::cout << valueLine("output", v);
    for (const auto& t : f.unalignable)
      std::cout << fmt::format("  element {} of its batch: a CTC target of {} labels needs {} input frames, has {}: no "
                               "alignment exists\n",
                               t.element, t.targetLength, t.framesNeeded, t.inputLength);
    if (f.emptyMean) std::cout << fmt::format("  a mean of nothing: {}\n", investigate::emptyMeanText(*f.emptyMean));
  }
}

/// The bundle is one rank of a job: all its ranks, replayed together.
int replayJob(const Options& o, const replayer::ReplayOptions& ro) {
  auto job = investigate::replayJob(o.bundle, ro);
  if (o.json) {
    printJson(investigate::toJson(job));
    return kExitOk;
  }
  std::cout << fmt::format("job {}: its {} ranks replayed together on this machine, steps {}..{} from the keyframe "
                           "every rank holds\n",
                           job.jobId, job.worldSize, job.keyframe, job.step);
  for (const auto& n : job.notes) std::cout << fmt::format("note: {}\n", n);
  for (const auto& r : job.ranks) {
    std::cout << fmt::format("\nrank {}  {}\n", r.rank, r.verdict.empty() ? std::string("no replay") : r.verdict);
    if (r.result) printReplay(r.bundle, *r.result);
    else std::cout << fmt::format("{}    {}\n", r.verdict.empty() ? "error" : "note ", r.error);
  }
  return kExitOk;
}

int replay(const Options& o) {
  checkIntact(o.bundle, o.allowDamaged);
  replayer::ReplayOptions ro;
  ro.step = o.step;
  ro.keyframe = o.keyframe;
  ro.instrument = !o.noInstrument;
  ro.device = o.device;
  ro.dtype = o.dtype;
  ro.settings = parseSettings(o.settings);
  ro.settingsAtTarget = o.settingsAtTarget;
  if (o.settingsAtTarget && o.settings.empty())
    throw Error(ErrorCode::InvalidArgument, "--set-at-target changes nothing without a --set",
                "e.g. --set torch.autocast=true --set-at-target");
  if (!o.rows.empty()) ro.rows = parseRows(o.rows);
  investigate::setReplayTimeout(o.timeout);
  if (investigate::isJobRank(o.bundle)) return replayJob(o, ro);
  auto r = investigate::replay(o.bundle, ro);
  if (o.json)
    printJson(investigate::toJson(r));
  else
    printReplay(o.bundle, r);
  return kExitOk;
}

Command replayCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("replay", torchCommandSummary("replay"));
  cmd->add_option("bundle", o->bundle,
                  "Crash bundle (crash-*.ccap) with a step program, or made with setModel + setStep; or a job "
                  "archive (crashcap merge), from the rank that failed first; or one rank of an archive, "
                  "JOB.ccap:crash-....ccap")
      ->required();
  cmd->add_option("--step", o->step, "Step to reproduce (default: the crash's step)");
  cmd->add_option("--keyframe", o->keyframe,
                  "Start from the keyframe of this step (default: the newest at or before the step; for a program that "
                  "replays itself, the earliest when the replay from the newest departs from the recording and the "
                  "earliest's does not; a job's ranks keep the one they all hold)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--device", o->device, "Where to replay: cpu, cuda:K (default: the recorded device when here, else cpu)");
  cmd->add_option("--dtype", o->dtype, "float64: replay in double precision (the reference of bisect ops)")
      ->check(CLI::IsMember({"float64"}));
  cmd->add_option("--set", o->settings, "SETTING=VALUE instead of the recorded value, e.g. cudnn.benchmark=false (repeatable)");
  cmd->add_flag("--set-at-target", o->settingsAtTarget,
                "Change the --set settings for the target step alone: the steps before it run as recorded, so it starts "
                "from the recording's state (what bisect config does)");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of text");
  addAllowDamaged(cmd, o->allowDamaged);
  addAllowChangedSource(cmd);
  cmd->add_option("--rows", o->rows,
                  "Keep only these samples of the step's batch, by row: e.g. 0,3 (an experiment); a row may repeat "
                  "(3,5,3,5: a batch of the same size made of rows 3 and 5); of a job's rank, that rank's batch only");
  cmd->add_flag("--no-instrument", o->noInstrument, "Skip the per-op NaN/Inf checks (faster)");
  cmd->add_option("--timeout", o->timeout,
                  "Stop a replay that runs in the recorded program, or in a job's ranks, after SECONDS and say so "
                  "(default: no limit). A TorchScript recording replays inside crashcap and is not bounded by it")
      ->check(CLI::NonNegativeNumber);
  cmd->footer(
      "Restores the newest keyframe before the step, replays the steps after it with the recorded batches,\n"
      "generator states and learning rates, compares each step's loss and gradient norm with the recording\n"
      "bit for bit, and checks every op of the target step for NaN/Inf outputs. When that replay departs from\n"
      "the recording, it is tried again from the earliest keyframe, which holds what the program keeps between\n"
      "steps outside the model and optimizer (an EMA teacher, a counter of its own) as the program made it; the\n"
      "replay that runs further as recorded is the answer, and a skipped keyframe is named (skipped_keyframe).\n"
      "Verdicts: reproduced-bitwise, reproduced (same error class, numbers differ), diverged (an earlier step\n"
      "departs from the recording: nondeterminism), not-reproduced. Bits are compared only in the recorded\n"
      "setup (device, dtype, settings); with --device, --dtype or --set only the failure is compared.\n"
      "--set changes a setting from the keyframe on (what the training would have done under it); with\n"
      "--set-at-target, for the target step alone, from the state the recorded setup gives it.\n"
      "A TorchScript recording (setProgram) replays inside crashcap. A setModel recording replays inside its own\n"
      "program: crashcap runs the recorded command line again, in the recorded directory, in replay mode, where\n"
      "the Recorder runs the step function given to setStep and ends the program before its training loop.\n"
      "A rank of a multi-process job (torch.distributed) replays with every rank of its job: their bundles from\n"
      "the same directory, each in its program started again with RANK, WORLD_SIZE and a local rendezvous, from\n"
      "a keyframe they all hold, in lockstep through their collectives; a verdict per rank.\n"
      "Example: crashcap replay crash.ccap --set cudnn.benchmark=false --json");
  return {cmd, [o] { return endingLikeTheProgram([&] { return onBundleOrJobArchive(o->bundle, [&] { return replay(*o); }); }); }, &o->json};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(200, crashcap::cli::replayCommand)
