// crashcap replay, bisect, triage, report: the subcommands that re-execute a recording.
// Each experiment that could poison or kill a process (a CUDA error, a segfault) runs as a
// crashcap child process with a timeout, so its crash or hang is a result, not the end.

#include "investigate.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#include "common.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/torch/settings.hpp"
#include "crashcap/inspect/slice.hpp"
#include "crashcap/inspect/story.hpp"
#include "crashcap/replayer/bisect.hpp"
#include "crashcap/replayer/replay.hpp"

namespace crashcap::cli {
namespace {

json valueStatsJson(const crashcap::replayer::ValueStats& v) {
  return {{"dtype", v.dtype},
          {"shape", v.shape},
          {"nan_count", v.nanCount},
          {"inf_count", v.infCount},
          {"min", v.min ? json(*v.min) : json(nullptr)},
          {"max", v.max ? json(*v.max) : json(nullptr)}};
}

json valueStatsJson(const std::vector<crashcap::replayer::ValueStats>& values) {
  json out = json::array();
  for (const auto& v : values) out.push_back(valueStatsJson(v));
  return out;
}

json nonFiniteOpJson(const std::optional<crashcap::replayer::NonFiniteOp>& op) {
  if (!op) return nullptr;
  return {{"name", op->name},
          {"phase", op->phase},
          {"seq", op->seq},
          {"index", op->index},
          {"inputs", valueStatsJson(op->inputs)},
          {"outputs", valueStatsJson(op->outputs)}};
}

/// Non-finite doubles become strings ("nan", "inf") so that the JSON stays valid.
json number(double v) { return std::isfinite(v) ? json(v) : json(fmt::format("{}", v)); }

/// Whether a `crashcap replay --json` result shows the recorded failure.
bool reproduces(const json& replay) { return replay["verdict"].get<std::string>().rfind("reproduced", 0) == 0; }

std::string selfPath() {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  return n > 0 ? std::string(exe, static_cast<size_t>(n)) : "crashcap";
}

/// One crashcap child process: its command, what became of it, and its JSON output.
struct Experiment {
  std::string name, command, outcome;
  double seconds = 0;
  int exitCode = 0;             ///< the status, or -signal
  bool timedOut = false;
  std::optional<json> result;   ///< stdout parsed, when it exited 0
};

/// Runs experiments as crashcap child processes with a timeout, keeps their log, and shows
/// progress on a terminal.
class Experiments {
 public:
  Experiments(double timeout, bool progress) : timeout_(timeout), progress_(progress && isatty(2)), self_(selfPath()) {}

  /// `scale`: the experiment is itself a series of experiments (a bisection), each with the
  /// timeout; it gets that many timeouts in all.
  Experiment run(const std::string& name, std::vector<std::string> args, double scale = 1) {
    Experiment e;
    e.name = name;
    e.command = "crashcap";
    for (const auto& a : args) e.command += " " + a;
    if (progress_) {
      std::fprintf(stderr, "  %-15s %s ...", name.c_str(), e.command.c_str());
      std::fflush(stderr);
    }
    args.insert(args.begin(), self_);
    auto child = crashcap::replayer::runChild(args, timeout_ * scale);
    e.seconds = child.seconds;
    e.exitCode = child.exitCode;
    e.timedOut = child.timedOut;
    if (child.timedOut) {
      e.outcome = fmt::format("timeout after {:.0f} s", timeout_ * scale);
    } else if (child.exitCode < 0) {
      e.outcome = fmt::format("child killed by signal {}", -child.exitCode);
    } else if (child.exitCode != 0) {
      e.outcome = "failed: " + lastLineOf(child.err);
    } else {
      try {
        e.result = json::parse(child.out);
        e.outcome = "ok";
      } catch (const std::exception& ex) {
        e.outcome = std::string("unreadable output: ") + ex.what();
      }
    }
    if (progress_) std::fprintf(stderr, " %s (%.1f s)\n", e.outcome.c_str(), e.seconds);
    log_.push_back({{"name", name}, {"command", e.command}, {"outcome", e.outcome}, {"seconds", e.seconds}});
    return e;
  }

  const json& log() const { return log_; }

 private:
  double timeout_;
  bool progress_;
  std::string self_;
  json log_ = json::array();
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

/// The dataset indices of `rows` of step `step`'s batch, when the batch carried an index
/// tensor (formats::kDatasetIndexName); null otherwise.
json datasetIndices(const std::string& path, int64_t step, const std::vector<int64_t>& rows) {
  auto reader = formats::BundleReader::open(path);
  auto name = formats::batchTensorName(step, formats::kDatasetIndexName);
  if (!reader->find(name)) return nullptr;
  auto t = loadTensor(*reader, name);
  if (t.shape.size() != 1 || formats::isFloating(t.dtype) || formats::isComplex(t.dtype)) return nullptr;
  json out = json::array();
  for (int64_t r : rows) {
    if (r < 0 || r >= t.shape[0]) return nullptr;
    auto v = inspect::computeStats(inspect::applySlice(t, inspect::parseSlice(std::to_string(r))));
    if (!v.max) return nullptr;
    out.push_back(static_cast<int64_t>(*v.max));
  }
  return out;
}

}  // namespace

int cmdReplay(const std::string& path, const ReplayCliOptions& o) {
  crashcap::replayer::ReplayOptions ro;
  ro.step = o.step;
  ro.instrument = !o.noInstrument;
  ro.device = o.device;
  ro.dtype = o.dtype;
  ro.settings = parseSettings(o.settings);
  if (!o.rows.empty()) ro.rows = parseRows(o.rows);
  auto r = crashcap::replayer::replay(path, ro);
  json steps = json::array();
  for (const auto& s : r.steps)
    steps.push_back({{"step", s.step},
                     {"loss", number(s.loss)},
                     {"grad_norm", s.hasGradNorm ? number(s.gradNorm) : json(nullptr)},
                     {"recorded_loss", s.recorded ? number(s.recordedLoss) : json(nullptr)},
                     {"recorded_grad_norm", s.recorded ? number(s.recordedGradNorm) : json(nullptr)},
                     {"bitwise", s.bitwise},
                     {"error", s.error.empty() ? json(nullptr) : json(s.error)}});
  if (o.json) {
    printJson({{"verdict", r.verdict},
               {"step", r.step},
               {"keyframe", r.keyframe},
               {"error", r.error.empty() ? json(nullptr) : json(r.error)},
               {"recorded_error", r.recordedError.empty() ? json(nullptr) : json(r.recordedError)},
               {"diverged_at", r.divergedAt ? json(*r.divergedAt) : json(nullptr)},
               {"first_nonfinite_op", nonFiniteOpJson(r.firstNonFiniteOp)},
               {"steps", steps},
               {"steps_replayed", r.steps.size()},
               {"batch_size", r.batchSize},
               {"rows", ro.rows.empty() ? json(nullptr) : json(ro.rows)},
               {"load_ms", r.loadMs},
               {"replay_ms", r.replayMs},
               {"device", r.device},
               {"recorded_device", r.recordedDevice.empty() ? json(nullptr) : json(r.recordedDevice)},
               {"dtype", r.dtype},
               {"settings", r.settings},
               {"recorded_settings", r.recordedSettings},
               {"same_setup", r.sameSetup},
               {"threads", r.threads}});
    return kExitOk;
  }
  std::cout << fmt::format("replayed steps {}..{} of {} from keyframe {} on {} ({} threads, {}) in {:.0f} ms\n",
                           r.keyframe, r.step, path, r.keyframe, r.device, r.threads,
                           r.dtype == "float64" ? "float64" : "dtype as recorded", r.loadMs + r.replayMs);
  if (!r.sameSetup)
    std::cout << fmt::format("  not the recorded setup (recorded on {}; {}): only the failure is compared, not the bits\n",
                             r.recordedDevice.empty() ? "an unknown device" : r.recordedDevice,
                             settingsText(r.settings, r.recordedSettings));
  for (const auto& s : r.steps) {
    std::cout << fmt::format("  step {:<5} loss {:<14} grad norm {:<14} {}", s.step, fmt::format("{:.7g}", s.loss),
                             s.hasGradNorm ? fmt::format("{:.7g}", s.gradNorm) : "-",
                             !s.recorded ? "(no recorded fingerprint)" : s.bitwise ? "= recording, bit for bit"
                                                                                   : fmt::format("!= recording ({:.7g}, {:.7g})", s.recordedLoss, s.recordedGradNorm));
    if (!s.error.empty()) std::cout << "  error: " << lastLineOf(s.error);
    std::cout << "\n";
  }
  std::cout << fmt::format("verdict  {}\n", r.verdict);
  if (r.divergedAt) std::cout << fmt::format("diverged at step {}: replay departs from the recording (nondeterminism?)\n", *r.divergedAt);
  if (!r.error.empty()) std::cout << fmt::format("error    {}\n", r.error);
  if (r.firstNonFiniteOp) {
    const auto& f = *r.firstNonFiniteOp;
    std::cout << fmt::format("first op with a non-finite output: {} ({}, op #{} of the step, autograd seq {})\n", f.name,
                             f.phase, f.index, f.seq);
    auto line = [](const char* what, const crashcap::replayer::ValueStats& v) {
      std::string shape;
      for (auto d : v.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      return fmt::format("  {} {}[{}]  NaN {}  Inf {}  finite range {}..{}\n", what, v.dtype, shape, v.nanCount,
                         v.infCount, v.min ? fmt::format("{:.6g}", *v.min) : "-", v.max ? fmt::format("{:.6g}", *v.max) : "-");
    };
    for (const auto& v : f.inputs) std::cout << line("input ", v);
    for (const auto& v : f.outputs) std::cout << line("output", v);
  }
  return kExitOk;
}

namespace {

/// `crashcap bisect steps`: replays the whole retained history (from the earliest keyframe)
/// and names the first step that throws or whose loss, gradient norm or updated weights go
/// non-finite.
int bisectSteps(const std::string& path, const BisectCliOptions& o) {
  crashcap::replayer::ReplayOptions ro;
  ro.step = o.step;
  ro.instrument = false;
  ro.fromEarliestKeyframe = true;
  auto r = crashcap::replayer::replay(path, ro);
  auto first = crashcap::replayer::firstFailure(r.steps);
  if (o.json) {
    json steps = json::array();
    for (const auto& s : r.steps)
      steps.push_back({{"step", s.step},
                       {"loss", number(s.loss)},
                       {"grad_norm", s.hasGradNorm ? number(s.gradNorm) : json(nullptr)},
                       {"lr", s.learningRate},
                       {"weight_norm", s.step < r.step ? number(s.weightNorm) : json(nullptr)},
                       {"weights_finite", s.weightsFinite},
                       {"bitwise", s.bitwise},
                       {"error", s.error.empty() ? json(nullptr) : json(lastLineOf(s.error))}});
    printJson({{"kind", "steps"},
               {"from_keyframe", r.keyframe},
               {"target", r.step},
               {"first_failing_step", first ? json(first->step) : json(nullptr)},
               {"reason", first ? json(first->reason) : json(nullptr)},
               {"diverged_at", r.divergedAt ? json(*r.divergedAt) : json(nullptr)},
               {"steps", steps}});
    return kExitOk;
  }
  std::cout << fmt::format("replayed steps {}..{} from keyframe {}\n", r.keyframe, r.step, r.keyframe);
  std::cout << "  step   lr           loss           grad norm      weight norm after update\n";
  for (const auto& s : r.steps)
    std::cout << fmt::format("  {:<6} {:<12.4g} {:<14.7g} {:<14.7g} {}\n", s.step, s.learningRate, s.loss,
                             s.hasGradNorm ? s.gradNorm : std::nan(""),
                             s.step < r.step ? fmt::format("{:.7g}", s.weightNorm) : std::string("-"));
  if (first)
    std::cout << fmt::format("first failing step: {} ({})\n", first->step,
                             first->reason == "weights" ? "its update made weights non-finite"
                             : first->reason == "error" ? "it throws"
                                                        : "its " + first->reason + " is non-finite");
  else
    std::cout << "no replayed step fails\n";
  return kExitOk;
}

/// `crashcap bisect samples`: delta debugging over the failing step's batch rows, each
/// experiment a `crashcap replay --rows` in a fresh child process with a timeout.

/// `crashcap bisect samples`: delta debugging over the failing step's batch rows, each
/// experiment a `crashcap replay --rows` in a fresh child process with a timeout.
int bisectSamples(const std::string& path, const BisectCliOptions& o) {
  // The whole-batch replay tells the step and the batch size (and that it reproduces).
  crashcap::replayer::ReplayOptions first;
  first.step = o.step;
  first.instrument = false;
  auto base = crashcap::replayer::replay(path, first);
  Experiments experiments(o.timeout, !o.json);
  json log = json::array();
  auto test = [&](const std::vector<int64_t>& rows) {
    auto e = experiments.run(fmt::format("rows [{}]", joinRows(rows)),
                             {"replay", path, "--step", std::to_string(base.step), "--rows", joinRows(rows), "--json",
                              "--no-instrument"});
    crashcap::replayer::Trial t;
    t.seconds = e.seconds;
    if (e.result) {
      t.fails = reproduces(*e.result);
      const json& error = (*e.result)["error"];
      t.outcome = t.fails ? fmt::format("fails ({})", error.is_string() ? lastLineOf(error) : (*e.result)["verdict"].get<std::string>())
                          : "passes";
    } else {
      t.fails = e.exitCode < 0 && !e.timedOut;  // a crash is the failure showing up in another form
      t.outcome = e.outcome;
    }
    log.push_back({{"rows", rows}, {"fails", t.fails}, {"outcome", t.outcome}, {"seconds", t.seconds},
                   {"command", fmt::format("crashcap replay {} --step {} --rows {}", path, base.step, joinRows(rows))}});
    return t;
  };
  auto b = crashcap::replayer::bisectRows(base.batchSize, test);
  int bound = 2 * static_cast<int>(std::ceil(std::log2(std::max<int64_t>(base.batchSize, 2)))) + 2;
  json indices = b.reproduced ? datasetIndices(path, base.step, b.rows) : json(nullptr);
  if (o.json) {
    printJson({{"kind", "samples"},
               {"step", base.step},
               {"batch_size", base.batchSize},
               {"reproduced", b.reproduced},
               {"rows", b.rows},
               {"dataset_indices", indices},
               {"replays", b.replays},
               {"replay_bound_single_row", bound},
               {"experiments", log}});
    return kExitOk;
  }
  if (!b.reproduced) {
    std::cout << fmt::format("step {} does not fail when replayed with its whole batch: nothing to bisect\n", base.step);
    return kExitOk;
  }
  std::cout << fmt::format("step {}: the failure needs batch row{} [{}] of {}{} ({} replays; a single culprit row takes at most {})\n",
                           base.step, b.rows.size() == 1 ? "" : "s", joinRows(b.rows), base.batchSize,
                           indices.is_null() ? "" : fmt::format(", dataset index {}", joinRows(indices.get<std::vector<int64_t>>())),
                           b.replays, bound);
  std::cout << fmt::format("rerun: crashcap replay {} --step {} --rows {}\n", path, base.step, joinRows(b.rows));
  return kExitOk;
}

/// `crashcap bisect ops`: the first op whose output goes non-finite, and the first whose output
/// departs from a float64 CPU replay of the same step beyond the tolerance.
int bisectOps(const std::string& path, const BisectCliOptions& o) {
  crashcap::replayer::ReplayOptions ro;
  ro.step = o.step;
  auto c = crashcap::replayer::compareWithReference(path, ro, o.tolerance);
  json departing = nullptr;
  if (c.firstDeparting) {
    const auto& d = *c.firstDeparting;
    departing = {{"name", d.name},          {"phase", d.phase},
                 {"index", d.index},        {"error", number(d.error)},
                 {"elements", d.elements},  {"replayed", valueStatsJson(d.replayed)},
                 {"reference", valueStatsJson(d.reference)}};
  }
  auto side = [](const crashcap::replayer::ReplayResult& r) {
    return json{{"verdict", r.verdict},
                {"device", r.device},
                {"dtype", r.dtype},
                {"error", r.error.empty() ? json(nullptr) : json(lastLineOf(r.error))},
                {"first_nonfinite_op", nonFiniteOpJson(r.firstNonFiniteOp)}};
  };
  bool replayFails = !c.replay.error.empty(), referenceFails = !c.reference.error.empty();
  if (o.json) {
    printJson({{"kind", "ops"},
               {"step", c.replay.step},
               {"first_nonfinite_op", nonFiniteOpJson(c.replay.firstNonFiniteOp)},
               {"first_departing_op", departing},
               {"tolerance", c.tolerance},
               {"ops_compared", c.opsCompared},
               {"stopped_because", c.stoppedBecause.empty() ? json(nullptr) : json(c.stoppedBecause)},
               {"replay", side(c.replay)},
               {"reference", side(c.reference)},
               {"fails_in_float64", referenceFails}});
    return kExitOk;
  }
  std::cout << fmt::format("step {} replayed as recorded ({}) and in float64 on the CPU ({})\n", c.replay.step,
                           replayFails ? "fails" : "passes", referenceFails ? "fails" : "passes");
  if (c.replay.firstNonFiniteOp)
    std::cout << fmt::format("first op with a non-finite output: {} ({}, op #{})\n", c.replay.firstNonFiniteOp->name,
                             c.replay.firstNonFiniteOp->phase, c.replay.firstNonFiniteOp->index);
  else
    std::cout << "no op output goes non-finite\n";
  if (c.firstDeparting)
    std::cout << fmt::format("first op departing from float64: {} ({}, outermost op #{}): error {:.3g} over {} elements "
                             "(tolerance {:.3g} of the reference's largest value)\n",
                             c.firstDeparting->name, c.firstDeparting->phase, c.firstDeparting->index,
                             c.firstDeparting->error, c.firstDeparting->elements, c.tolerance);
  else
    std::cout << fmt::format("no op departs from float64 beyond {:.3g} ({} ops compared)\n", c.tolerance, c.opsCompared);
  if (!c.stoppedBecause.empty()) std::cout << "comparison stopped: " << c.stoppedBecause << "\n";
  return kExitOk;
}

/// `crashcap bisect config`: replays the step under the recorded settings, then with each
/// setting flipped and on each other device here, each in a child process: which of them make
/// the failure come or go.
json bisectConfigJson(const std::string& path, const BisectCliOptions& o) {
  Experiments experiments(o.timeout, !o.json);
  std::vector<std::string> common = {"--json", "--no-instrument"};
  if (o.step >= 0) common = {"--step", std::to_string(o.step), "--json", "--no-instrument"};
  auto replayArgs = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"replay", path};
    args.insert(args.end(), common.begin(), common.end());
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  auto baseline = experiments.run("as recorded", replayArgs({}));
  if (!baseline.result)
    throw Error(ErrorCode::Unsupported, fmt::format("the replay under the recorded settings did not finish: {}", baseline.outcome),
                fmt::format("run it by hand: {}", baseline.command));
  const json& base = *baseline.result;
  bool baseFails = reproduces(base);
  auto entry = [&](const Experiment& e) {
    json j = {{"command", e.command}, {"seconds", e.seconds}, {"outcome", e.outcome}};
    if (e.result) {
      j["fails"] = reproduces(*e.result);
      j["error"] = (*e.result)["error"].is_string() ? json(lastLineOf((*e.result)["error"])) : json(nullptr);
    } else {
      j["fails"] = e.exitCode < 0 && !e.timedOut;  // killed: the failure in another form
    }
    return j;
  };
  json flips = json::array(), devices = json::array(), changes = json::array();
  const auto recorded = base["recorded_settings"].get<std::map<std::string, std::string>>();
  for (const auto& name : formats::torch::settingNames()) {
    auto it = recorded.find(name);
    if (it == recorded.end()) continue;  // an older recording without it
    const std::string& value = it->second;
    std::string flipped = formats::torch::flippedSetting(name, value);
    auto e = experiments.run(name + "=" + flipped, replayArgs({"--set", name + "=" + flipped}));
    json j = entry(e);
    j["setting"] = name;
    j["recorded"] = value;
    j["value"] = flipped;
    if (j["fails"] != baseFails) changes.push_back(fmt::format("{}={}", name, flipped));
    flips.push_back(j);
  }
  for (const auto& device : crashcap::replayer::availableDevices()) {
    if (device == base["device"]) continue;
    auto e = experiments.run("device " + device, replayArgs({"--device", device}));
    json j = entry(e);
    j["device"] = device;
    if (j["fails"] != baseFails) changes.push_back("device=" + device);
    devices.push_back(j);
  }
  return {{"kind", "config"},
          {"step", base["step"]},
          {"baseline", {{"device", base["device"]},
                        {"recorded_device", base["recorded_device"]},
                        {"settings", base["settings"]},
                        {"fails", baseFails},
                        {"error", base["error"].is_string() ? json(lastLineOf(base["error"])) : json(nullptr)},
                        {"command", baseline.command}}},
          {"flips", flips},
          {"devices", devices},
          {"changes_outcome", changes},
          {"experiments", experiments.log()}};
}

int bisectConfig(const std::string& path, const BisectCliOptions& o) {
  json j = bisectConfigJson(path, o);
  if (o.json) {
    printJson(j);
    return kExitOk;
  }
  bool baseFails = j["baseline"]["fails"];
  std::cout << fmt::format("step {} under the recorded settings on {}: {}\n", j["step"].dump(),
                           j["baseline"]["device"].get<std::string>(), baseFails ? "fails" : "passes");
  std::cout << fmt::format("  {:<48} {:<10} {}\n", "change", "outcome", "rerun");
  auto row = [&](const std::string& change, const json& e) {
    std::string outcome = e["fails"] == true ? "fails" : e["outcome"] == "ok" ? "passes" : e["outcome"].get<std::string>();
    std::cout << fmt::format("  {:<48} {:<10} {}{}\n", change, outcome, e["command"].get<std::string>(),
                             e["fails"] != baseFails ? "   <- changes the outcome" : "");
  };
  for (const auto& f : j["flips"])
    row(fmt::format("{}={} (was {})", f["setting"].get<std::string>(), f["value"].get<std::string>(),
                    f["recorded"].get<std::string>()),
        f);
  for (const auto& d : j["devices"]) row("device " + d["device"].get<std::string>(), d);
  if (j["changes_outcome"].empty())
    std::cout << "no single setting or device changes the outcome\n";
  else
    std::cout << fmt::format("the outcome depends on: {}\n", fmt::join(j["changes_outcome"].get<std::vector<std::string>>(), ", "));
  return kExitOk;
}

}  // namespace

int cmdBisect(const std::string& path, const BisectCliOptions& o) {
  if (o.what == "steps") return bisectSteps(path, o);
  if (o.what == "samples") return bisectSamples(path, o);
  if (o.what == "ops") return bisectOps(path, o);
  if (o.what == "config") return bisectConfig(path, o);
  throw Error(ErrorCode::InvalidArgument, fmt::format("bisect {}: unknown", o.what), "bisect steps|ops|samples|config BUNDLE");
}


namespace {

/// `crashcap triage`: a fixed plan of experiments, each a crashcap command in a fresh child
/// process with a timeout, and the hypothesis table their outcomes support.
json runTriage(const std::string& path, const TriageCliOptions& o) {
  Experiments experiments(o.timeout, !o.json);
  auto run = [&](const std::string& name, std::vector<std::string> args, double scale = 1) {
    return experiments.run(name, std::move(args), scale).result;
  };
  const std::string timeout = fmt::format("{}", o.timeout);
  auto reader = formats::BundleReader::open(path);
  auto story = inspect::storyJson(*reader);
  auto replay = run("reproduce", {"replay", path, "--json"});
  bool reproduced = replay && reproduces(*replay);
  auto steps = run("bisect-steps", {"bisect", "steps", path, "--json"});
  std::optional<json> samples, complement;
  std::vector<int64_t> rows;
  int64_t step = replay ? (*replay)["step"].get<int64_t>() : -1;
  int64_t batchSize = replay ? (*replay)["batch_size"].get<int64_t>() : 0;
  if (reproduced) {
    samples = run("bisect-samples", {"bisect", "samples", path, "--json", "--timeout", timeout}, 2 * std::log2(batchSize + 1) + 3);
    if (samples && (*samples)["reproduced"] == true) rows = (*samples)["rows"].get<std::vector<int64_t>>();
    std::vector<int64_t> rest;
    for (int64_t r = 0; r < batchSize; ++r)
      if (std::find(rows.begin(), rows.end(), r) == rows.end()) rest.push_back(r);
    if (!rows.empty() && !rest.empty())
      complement = run("without-rows", {"replay", path, "--step", std::to_string(step), "--rows", joinRows(rest), "--json",
                                        "--no-instrument"});
  }
  auto ops = run("bisect-ops", {"bisect", "ops", path, "--json"});
  auto config = run("bisect-config", {"bisect", "config", path, "--json", "--timeout", timeout},
                    formats::torch::settingNames().size() + crashcap::replayer::availableDevices().size() + 1);

  auto hypothesis = [](const std::string& id, const std::string& verdict, std::vector<std::string> evidence,
                       const std::string& rerun) {
    return json{{"id", id}, {"verdict", verdict}, {"evidence", evidence}, {"rerun", rerun}};
  };
  json hypotheses = json::array();
  json firstOp = replay ? (*replay)["first_nonfinite_op"] : json(nullptr);

  // invalid-data: the failure needs these rows and goes away without them; what is odd in them.
  {
    std::vector<std::string> ev;
    std::string verdict = "inconclusive";
    bool complementPasses = complement && (*complement)["verdict"].get<std::string>().rfind("reproduced", 0) != 0;
    bool complementFails = complement && !complementPasses;
    if (!reproduced) {
      ev.push_back("the crash does not reproduce on replay, so its data cannot be tested");
    } else if (!rows.empty() && complementPasses) {
      verdict = "confirmed";
      ev.push_back(fmt::format("step {} fails with batch row{} [{}] alone and passes without {} ({} replays)", step,
                               rows.size() == 1 ? "" : "s", joinRows(rows), rows.size() == 1 ? "it" : "them",
                               (*samples)["replays"].get<int>() + 1));
      if (!(*samples)["dataset_indices"].is_null())
        ev.push_back(fmt::format("dataset index {} (the batch's {} tensor)", joinRows((*samples)["dataset_indices"].get<std::vector<int64_t>>()),
                                 formats::kDatasetIndexName));
      for (const auto& name : reader->tensors()) {
        if (name.name.rfind(formats::batchTensorName(step, ""), 0) != 0) continue;
        if (name.name == formats::batchTensorName(step, formats::kDatasetIndexName)) continue;
        auto t = loadTensor(*reader, name.name);  // once per tensor, not per culprit row
        for (int64_t r : rows) {
          if (t.shape.empty() || t.shape[0] <= r) continue;
          auto row = inspect::applySlice(t, inspect::parseSlice(std::to_string(r)));
          auto st = inspect::computeStats(row);
          if (st.nanCount || st.posInfCount || st.negInfCount)
            ev.push_back(fmt::format("row {} of {} holds {} NaN and {} Inf values", r, name.name, st.nanCount,
                                     st.posInfCount + st.negInfCount));
          else if (st.count > 0 && st.zeroCount == st.count)
            ev.push_back(fmt::format("row {} of {} is all zeros", r, name.name));
          else if (!formats::isFloating(t.dtype) && !formats::isComplex(t.dtype) && row.numel() == 1 && st.max)
            ev.push_back(fmt::format("row {} of {} is {}", r, name.name, static_cast<int64_t>(*st.max)));
        }
      }
      // The number of classes, from the loss op's logits in the op trace.
      for (const auto& op : story["last_ops"])
        if (op["name"].get<std::string>().find("nll_loss") != std::string::npos && !op["inputs"].empty() &&
            op["inputs"][0]["shape"].size() == 2) {
          ev.push_back(fmt::format("the loss sees {} classes (logits {}), so valid labels are 0..{}",
                                   op["inputs"][0]["shape"][1].get<int64_t>(), op["inputs"][0]["shape"].dump(),
                                   op["inputs"][0]["shape"][1].get<int64_t>() - 1));
          break;
        }
    } else if (complementFails) {
      verdict = "refuted";
      ev.push_back(fmt::format("step {} still fails without rows [{}]: no particular sample is needed", step,
                               joinRows(rows)));
    } else {
      ev.push_back("sample bisection did not isolate rows");
    }
    hypotheses.push_back(hypothesis("invalid-data", verdict, ev, fmt::format("crashcap bisect samples {}", path)));
  }
  // loss-numerics: the first non-finite value is made by an op from finite inputs.
  {
    std::vector<std::string> ev;
    std::string verdict = "inconclusive";
    if (!firstOp.is_null()) {
      int64_t bad = 0;
      for (const auto& in : firstOp["inputs"]) bad += in["nan_count"].get<int64_t>() + in["inf_count"].get<int64_t>();
      std::string where = fmt::format("{} ({}, step {})", firstOp["name"].get<std::string>(),
                                      firstOp["phase"].get<std::string>(), step);
      double largest = 0;
      for (const auto& in : firstOp["inputs"]) {
        if (!in["min"].is_null()) largest = std::max(largest, std::abs(in["min"].get<double>()));
        if (!in["max"].is_null()) largest = std::max(largest, std::abs(in["max"].get<double>()));
      }
      if (bad == 0 && largest > 1e15) {
        // Overflow of values that were already running away is divergence, not the loss's
        // arithmetic.
        verdict = "refuted";
        ev.push_back(fmt::format("{} overflows on inputs as large as {:.3g}: the values were already diverging", where,
                                 largest));
      } else if (bad == 0) {
        verdict = "confirmed";
        ev.push_back(fmt::format("{} turns finite inputs into NaN/Inf", where));
        for (const auto& in : firstOp["inputs"])
          if (!in["min"].is_null() && in["min"].get<double>() == 0.0) {
            ev.push_back(fmt::format("an input of {} reaches 0 (a division or log of zero?)", firstOp["name"].get<std::string>()));
            break;
          }
      } else {
        verdict = "refuted";
        ev.push_back(fmt::format("the first non-finite output, of {}, comes from inputs that already hold {} NaN/Inf", where, bad));
      }
    } else if (replay) {
      ev.push_back("no op output went non-finite in the replayed step");
      if (reproduced) verdict = "refuted";
    }
    if (ops) {
      const json& ref = (*ops)["reference"];
      if ((*ops)["fails_in_float64"] == true && !ref["first_nonfinite_op"].is_null())
        ev.push_back(fmt::format("the float64 CPU replay goes non-finite at {} too: the arithmetic itself, not float32 "
                                 "rounding or range", ref["first_nonfinite_op"]["name"].get<std::string>()));
      else if ((*ops)["fails_in_float64"] == true)
        ev.push_back("the float64 CPU replay fails with the same error: not a matter of precision");
      else if (reproduced)
        ev.push_back("the float64 CPU replay of the step runs clean: float32 rounding or range is involved");
      const json& d = (*ops)["first_departing_op"];
      if (!d.is_null())
        ev.push_back(fmt::format("first op departing from float64: {} ({}), error {} over {} elements", d["name"].get<std::string>(),
                                 d["phase"].get<std::string>(), d["error"].dump(), d["elements"].dump()));
    }
    hypotheses.push_back(hypothesis("loss-numerics", verdict, ev, fmt::format("crashcap bisect ops {}", path)));
  }
  // optimizer-divergence: the weights run away over the steps before the failure.
  {
    std::vector<std::string> ev;
    std::string verdict = "inconclusive";
    // A step's weight norm is measured after its optimizer step; the failing step stops before
    // it, and a step that threw has none: those are unknown, not large.
    const json* ss = steps ? &(*steps)["steps"] : nullptr;
    double w0 = NAN, wMax = NAN;
    if (ss)
      for (const auto& s : *ss)
        if (s["weight_norm"].is_number()) {
          double w = s["weight_norm"].get<double>();
          if (std::isnan(w0)) w0 = wMax = w;
          wMax = std::max(wMax, w);
        }
    if (ss && !ss->empty() && std::isnan(w0)) {
      ev.push_back(fmt::format("no weight norm to compare: no replayed step before step {} completed an optimizer step "
                               "(the failure is in the first step replayed from the keyframe, or the program has no "
                               "trainable parameters)",
                               (*steps)["target"].get<int64_t>()));
    } else if (ss && !ss->empty()) {
      double lr0 = (*ss)[0]["lr"], lrMax = lr0;
      int64_t lrStep = -1;
      for (const auto& s : *ss)
        if (s["lr"].get<double>() > lrMax) {
          lrMax = s["lr"];
          if (lrStep < 0) lrStep = s["step"];
        }
      if (!std::isfinite(wMax) || wMax > 100 * w0) {
        verdict = "confirmed";
        ev.push_back(fmt::format("the weight norm grows from {:.4g} to {:.4g} over steps {}..{} before step {} fails",
                                 w0, wMax, (*ss)[0]["step"].get<int64_t>(), (*steps)["target"].get<int64_t>() - 1,
                                 (*steps)["target"].get<int64_t>()));
        if (lrStep >= 0)
          ev.push_back(fmt::format("the learning rate jumps from {:.4g} to {:.4g} from step {} on", lr0, lrMax, lrStep));
        if (!(*steps)["first_failing_step"].is_null())
          ev.push_back(fmt::format("first step whose loss, gradients or weights go non-finite: {} ({})",
                                   (*steps)["first_failing_step"].get<int64_t>(), (*steps)["reason"].get<std::string>()));
      } else if (wMax <= 2 * w0) {
        verdict = "refuted";
        ev.push_back(fmt::format("the weight norm stays within {:.4g}..{:.4g} up to the failing step", w0, wMax));
      } else {
        ev.push_back(fmt::format("the weight norm grows {:.1f}x: not conclusive", wMax / w0));
      }
    }
    hypotheses.push_back(hypothesis("optimizer-divergence", verdict, ev, fmt::format("crashcap bisect steps {}", path)));
  }
  // device-specific and config-dependent: which single change of device or setting makes the
  // failure come or go.
  {
    std::vector<std::string> devEv, cfgEv;
    std::string devVerdict = "inconclusive", cfgVerdict = "inconclusive";
    std::string recordedDevice = replay && (*replay)["recorded_device"].is_string() ? (*replay)["recorded_device"].get<std::string>() : "";
    if (!config) {
      devEv.push_back("config bisection did not finish");
      cfgEv.push_back("config bisection did not finish");
    } else {
      const json& base = (*config)["baseline"];
      bool baseFails = base["fails"];
      std::string here = base["device"];
      auto describe = [](bool fails) { return fails ? "fails" : "runs clean"; };
      // Devices.
      std::vector<std::string> same, differ;
      for (const auto& d : (*config)["devices"])
        (d["fails"] == baseFails ? same : differ).push_back(d["device"].get<std::string>());
      if (!differ.empty()) {
        devVerdict = "confirmed";
        devEv.push_back(fmt::format("the step {} on {} and {} on {}", describe(baseFails), here, describe(!baseFails),
                                    fmt::format("{}", fmt::join(differ, ", "))));
      } else if (!same.empty() && baseFails) {
        devVerdict = "refuted";
        devEv.push_back(fmt::format("the step fails on {} and on {}", here, fmt::format("{}", fmt::join(same, ", "))));
      } else if (!recordedDevice.empty() && recordedDevice != here) {
        devEv.push_back(fmt::format("recorded on {}, which is not here; on {} the step {}{}", recordedDevice, here,
                                    describe(baseFails),
                                    baseFails ? "" : ", which points at the device or its driver: replay it on a machine with " + recordedDevice));
      } else {
        devEv.push_back(fmt::format("only {} is here to replay on; another device would tell", here));
      }
      // Settings.
      std::vector<std::string> changes, kept;
      for (const auto& f : (*config)["flips"]) {
        std::string change = fmt::format("{}={} (recorded {})", f["setting"].get<std::string>(), f["value"].get<std::string>(),
                                          f["recorded"].get<std::string>());
        (f["fails"] != baseFails ? changes : kept).push_back(change);
      }
      if (!changes.empty()) {
        cfgVerdict = "confirmed";
        cfgEv.push_back(fmt::format("the step {} as recorded and {} with {}", describe(baseFails), describe(!baseFails),
                                    fmt::format("{}", fmt::join(changes, "; "))));
      } else if (baseFails && !kept.empty()) {
        cfgVerdict = "refuted";
        cfgEv.push_back(fmt::format("the step fails under each of {} single-setting changes", kept.size()));
      } else {
        cfgEv.push_back("no single setting change makes the step fail");
      }
      if (here == "cpu" && !recordedDevice.empty() && recordedDevice != "cpu")
        cfgEv.push_back("cudnn.* and TF32 settings do not change CPU kernels: replay on " + recordedDevice + " for them to count");
    }
    hypotheses.push_back(hypothesis("device-specific", devVerdict, devEv, fmt::format("crashcap bisect config {}", path)));
    hypotheses.push_back(hypothesis("config-dependent", cfgVerdict, cfgEv, fmt::format("crashcap bisect config {}", path)));
  }
  {
    std::vector<std::string> ev;
    std::string verdict = "inconclusive";
    if (replay) {
      std::string v = (*replay)["verdict"];
      if (v == "reproduced-bitwise") {
        verdict = "refuted";
        ev.push_back(fmt::format("replay matched the recording bit for bit over {} steps", (*replay)["steps_replayed"].get<int64_t>()));
      } else if (v == "diverged") {
        verdict = "confirmed";
        ev.push_back(fmt::format("replay departs from the recording at step {}", (*replay)["diverged_at"].dump()));
      } else {
        ev.push_back("replay verdict " + v);
      }
    }
    hypotheses.push_back(hypothesis("nondeterminism", verdict, ev, fmt::format("crashcap replay {}", path)));
  }
  // A non-finite value that a change of setting or device makes go away is the kernel's under
  // that setting, not (only) the arithmetic's: loss-numerics cannot be confirmed on its own.
  auto byId = [&](const char* id) -> json& {
    for (auto& h : hypotheses)
      if (h["id"] == id) return h;
    throw Error(ErrorCode::Internal, fmt::format("no hypothesis {}", id));
  };
  json& numerics = byId("loss-numerics");
  for (const char* id : {"config-dependent", "device-specific"}) {
    const json& other = byId(id);
    if (numerics["verdict"] == "confirmed" && other["verdict"] == "confirmed") {
      numerics["verdict"] = "inconclusive";
      numerics["evidence"].push_back(fmt::format("but it goes away with a change of {} ({}): the kernel that runs "
                                                 "under the recorded setup makes it, not only the arithmetic",
                                                 id == std::string("device-specific") ? "device" : "setting",
                                                 other["evidence"][0].get<std::string>()));
    }
  }
  // Rows are a culprit only when the data hypothesis holds (any single row fails a diverged run).
  bool dataConfirmed = hypotheses[0]["verdict"] == "confirmed";
  json culprit = {{"step", step >= 0 ? json(step) : json(nullptr)},
                  {"rows", rows.empty() || !dataConfirmed ? json(nullptr) : json(rows)},
                  {"dataset_indices", samples && dataConfirmed ? (*samples)["dataset_indices"] : json(nullptr)},
                  {"op", firstOp.is_null() ? json(nullptr) : firstOp["name"]},
                  {"phase", firstOp.is_null() ? json(nullptr) : firstOp["phase"]},
                  {"changes", config ? (*config)["changes_outcome"] : json(nullptr)}};
  return {{"bundle", path},
          {"reproduced", reproduced},
          {"verdict", replay ? (*replay)["verdict"] : json(nullptr)},
          {"step", step >= 0 ? json(step) : json(nullptr)},
          {"replay", replay ? *replay : json(nullptr)},
          {"hypotheses", hypotheses},
          {"culprit", culprit},
          {"experiments", experiments.log()}};
}

}  // namespace

int cmdTriage(const std::string& path, const TriageCliOptions& o) {
  json t = runTriage(path, o);
  if (o.json) {
    json out = t;
    out.erase("replay");
    printJson(out);
    return kExitOk;
  }
  auto reader = formats::BundleReader::open(path);
  auto story = inspect::storyJson(*reader, {0, 0, false});
  const json& hypotheses = t["hypotheses"];
  const json& culprit = t["culprit"];
  std::cout << fmt::format("triage of {}: crash {} at step {}; replay {}\n\n", path,
                           story["crash"].is_null() ? "(none recorded)" : story["crash"]["kind"].get<std::string>(),
                           t["step"].dump(), t["verdict"].is_null() ? "failed" : t["verdict"].get<std::string>());
  std::cout << fmt::format("  {:<22} {:<13} {}\n", "hypothesis", "verdict", "evidence");
  for (const auto& h : hypotheses) {
    auto ev = h["evidence"];
    std::cout << fmt::format("  {:<22} {:<13} {}\n", h["id"].get<std::string>(), h["verdict"].get<std::string>(),
                             ev.empty() ? "" : ev[0].get<std::string>());
    for (size_t i = 1; i < ev.size(); ++i) std::cout << fmt::format("  {:<22} {:<13} {}\n", "", "", ev[i].get<std::string>());
    std::cout << fmt::format("  {:<22} {:<13} rerun: {}\n", "", "", h["rerun"].get<std::string>());
  }
  std::cout << fmt::format("\nculprit: step {}, {}{}, {}{}\n", culprit["step"].dump(),
                           culprit["rows"].is_null() ? std::string("no batch rows singled out")
                                                     : "rows " + culprit["rows"].dump(),
                           culprit["dataset_indices"].is_null() ? "" : " (dataset indices " + culprit["dataset_indices"].dump() + ")",
                           culprit["op"].is_null() ? std::string("no op output went non-finite")
                                                   : fmt::format("op {} ({})", culprit["op"].get<std::string>(),
                                                                 culprit["phase"].get<std::string>()),
                           culprit["changes"].is_array() && !culprit["changes"].empty()
                               ? "; the outcome changes with " + culprit["changes"].dump()
                               : "");
  return kExitOk;
}

int cmdReport(const std::string& path, const ReportCliOptions& o) {
  auto reader = formats::BundleReader::open(path);
  auto story = inspect::storyJson(*reader);
  json triage;
  if (!o.noTriage) {
    TriageCliOptions to;
    to.timeout = o.timeout;
    triage = runTriage(path, to);
  }
  const json& crash = story["crash"];
  const json facts = story["env"].value("facts", json::object());
  auto fact = [&](const char* k) { return facts.contains(k) ? facts[k].get<std::string>() : std::string("unknown"); };
  std::string error = crash.is_null() ? std::string("(no crash record)") : lastLineOf(crash["error"].get<std::string>());
  std::string stepText = crash.is_null() || crash["step"].is_null() ? "?" : crash["step"].dump();
  std::string title = error.substr(0, 80);
  std::replace(title.begin(), title.end(), '"', '\'');  // keep the front matter valid YAML
  std::string md;
  md += fmt::format("---\ntitle: \"Training crash at step {}: {}\"\ndate: \"{}\"\ntype: \"bug_report\"\n"
                    "generated_by: \"crashcap {}\"\nbundle: \"{}\"\n---\n\n",
                    stepText, title, crash.is_null() ? "" : crash["time"].get<std::string>(),
                    formats::toolVersion(), path);
  md += "## Summary\n";
  if (crash.is_null()) {
    md += fmt::format("The recording ends without a crash record (state: {}).\n", story["status"].dump());
  } else {
    md += fmt::format("Training fails at step {} in the {} phase with `{}`.", stepText, crash["phase"].get<std::string>(), error);
    if (!triage.is_null()) {
      std::string confirmed;
      for (const auto& h : triage["hypotheses"])
        if (h["verdict"] == "confirmed") confirmed += (confirmed.empty() ? "" : ", ") + h["id"].get<std::string>();
      md += fmt::format(" Replay: **{}**. Triage confirms: **{}**.", triage["verdict"].is_null() ? "failed" : triage["verdict"].get<std::string>(),
                        confirmed.empty() ? "nothing yet" : confirmed);
    }
    md += "\n";
  }
  md += "\n## Environment\n";
  md += fmt::format("- OS: {} ({}), WSL2: {}\n", fact("os.name"), fact("os.kernel"), fact("os.wsl2"));
  md += fmt::format("- CPU: {}\n", fact("cpu.model"));
  md += fmt::format("- LibTorch: {} ({} threads); CUDA available: {}\n", fact("torch.version"), fact("torch.threads"),
                    fact("cuda.available"));
  md += fmt::format("- cuDNN: enabled {}, benchmark {}, deterministic {}; TF32 matmul {}; deterministic algorithms {}\n",
                    fact("cudnn.enabled"), fact("cudnn.benchmark"), fact("cudnn.deterministic"),
                    fact("cuda.matmul.allow_tf32"), fact("torch.deterministic_algorithms"));
  std::string command;
  for (const auto& a : story["env"].value("command_line", json::array())) command += (command.empty() ? "" : " ") + a.get<std::string>();
  md += fmt::format("- Command: `{}`\n", command.empty() ? "unknown" : command);
  if (!story["optimizer"].is_null()) md += fmt::format("- Optimizer: {}\n", story["optimizer"]["kind"].get<std::string>());
  md += "\n## Steps to Reproduce\n";
  md += fmt::format("1. Get the crash bundle `{}` (attached).\n", path);
  md += fmt::format("2. `crashcap inspect {}` (what was recorded, the crash, the last ops)\n", path);
  md += fmt::format("3. `crashcap replay {}` (re-runs step {} from keyframe {}, bit for bit on the CPU)\n", path,
                    stepText, triage.is_null() || triage["replay"].is_null() ? "?" : triage["replay"]["keyframe"].dump());
  md += fmt::format("4. `crashcap triage {}` (the experiments below)\n", path);
  md += "\n## Expected Behavior\nThe step completes with a finite loss and training continues.\n";
  md += "\n## Actual Behavior\n";
  if (!crash.is_null()) {
    md += fmt::format("- Step {} fails ({}, phase {}): `{}`\n", stepText, crash["kind"].get<std::string>(),
                      crash["phase"].get<std::string>(), error);
    if (!crash["signal"].is_null()) md += fmt::format("- The process died by {}.\n", crash["signal_name"].get<std::string>());
  }
  if (!triage.is_null() && !triage["replay"].is_null()) {
    const auto& r = triage["replay"];
    md += fmt::format("- Replay verdict: {} over {} steps.\n", r["verdict"].get<std::string>(), r["steps_replayed"].dump());
    if (!r["first_nonfinite_op"].is_null())
      md += fmt::format("- First op whose output goes non-finite: `{}` ({}).\n", r["first_nonfinite_op"]["name"].get<std::string>(),
                        r["first_nonfinite_op"]["phase"].get<std::string>());
  }
  for (const auto& t : story["crash_tensors"])
    if (t.contains("stats") && !t["stats"].is_null() && t["stats"]["nan_count"].get<uint64_t>() > 0)
      md += fmt::format("- `{}` holds {} NaN (first at {}).\n", t["name"].get<std::string>(), t["stats"]["nan_count"].dump(),
                        t["stats"]["first_nan"].dump());
  md += "\n## Logs / Stack Trace\n```\n";
  if (!crash.is_null()) {
    md += crash["error"].get<std::string>() + "\n";
    size_t shown = 0;
    for (const auto& f : crash["stack"]) {
      if (shown++ >= 15) break;
      md += "  " + f.get<std::string>() + "\n";
    }
  }
  if (!story["last_ops"].empty()) {
    md += "last ops before the crash:\n";
    for (const auto& op : story["last_ops"])
      md += fmt::format("  #{} {} {} (step {})\n", op["index"].dump(), op["phase"].get<std::string>(),
                        op["name"].get<std::string>(), op["step"].dump());
  }
  md += "```\n";
  if (!triage.is_null()) {
    md += "\n## Root Cause Analysis (crashcap triage)\n| hypothesis | verdict | evidence | rerun |\n|---|---|---|---|\n";
    for (const auto& h : triage["hypotheses"]) {
      std::string ev;
      for (const auto& e : h["evidence"]) ev += (ev.empty() ? "" : "; ") + e.get<std::string>();
      for (auto& c : ev)
        if (c == '|') c = '/';
      md += fmt::format("| {} | **{}** | {} | `{}` |\n", h["id"].get<std::string>(), h["verdict"].get<std::string>(), ev,
                        h["rerun"].get<std::string>());
    }
    const auto& c = triage["culprit"];
    md += fmt::format("\nCulprit: step {}, batch rows {}{}, op {} ({}){}.\n", c["step"].dump(), c["rows"].dump(),
                      c["dataset_indices"].is_null() ? "" : " (dataset indices " + c["dataset_indices"].dump() + ")",
                      c["op"].dump(), c["phase"].dump(),
                      c["changes"].is_array() && !c["changes"].empty() ? "; the outcome changes with " + c["changes"].dump() : "");
  }
  if (o.out.empty()) {
    std::cout << md;
  } else {
    std::ofstream f(o.out, std::ios::binary | std::ios::trunc);
    f << md;
    f.close();
    if (!f)
      throw Error(ErrorCode::Io, fmt::format("cannot write {}: {}", o.out, std::strerror(errno)),
                  "check the directory exists and is writable");
    std::cerr << "wrote " << o.out << "\n";
  }
  return kExitOk;
}

}  // namespace crashcap::cli
