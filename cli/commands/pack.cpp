// crashcap pack: the smallest bundle that still replays the crash, to attach to a bug report.
#include <fmt/format.h>

#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "crashcap/investigate/pack.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/inspect/summary.hpp"

namespace crashcap::cli {
namespace {

struct Options {
  std::string bundle;
  std::string out;
  std::string maxSize;
  bool force = false;
  bool noReplay = false;
  std::string rows = "all";
  double timeout = 300;
  bool zip = false;
  ReadOptions read;
};

/// The replay pack ran first: its verdict, and whether it wrote the keyframe at the failing step.
json replayJson(const investigate::PackReport& r) {
  if (!r.replay) return r.replayFailed.empty() ? json(nullptr) : json({{"failed", r.replayFailed}});
  const auto& p = *r.replay;
  return {{"verdict", replayer::verdictName(p.verdict)},
          {"error", p.error.empty() ? json(nullptr) : json(p.error)},
          {"first_nonfinite_op", p.firstNonFiniteOp ? json(p.firstNonFiniteOp->name) : json(nullptr)},
          {"from_keyframe", p.keyframe},
          {"replay_ms", p.loadMs + p.replayMs},
          {"keyframe_materialised", p.keyframeWritten.has_value()},
          {"keyframe_not_materialised", p.keyframeNotWritten.empty() ? json(nullptr) : json(p.keyframeNotWritten)}};
}

json packJson(const investigate::PackReport& r, uint64_t maxBytes) {
  auto step = [](int64_t s) { return s >= 0 ? json(s) : json(nullptr); };
  json indices = json::array();
  for (const auto& [s, rows] : r.datasetIndices) indices.push_back({{"step", s}, {"indices", rows}});
  json parts = json::array();
  for (const auto& p : r.parts) parts.push_back({{"what", p.what}, {"bytes", p.bytes}});
  return {{"bundle", r.in},
          {"out", r.tooLarge ? json(nullptr) : json(r.out)},
          {"original_bytes", r.originalBytes},
          {"packed_bytes", r.packedBytes},
          {"bundle_bytes", r.bundleBytes},
          {"zip_entries", r.zipEntries.empty() ? json(nullptr) : json(r.zipEntries)},
          {"max_bytes", maxBytes ? json(maxBytes) : json(nullptr)},
          {"too_large", r.tooLarge},
          {"crash_step", step(r.crashStep)},
          {"keyframe_step", step(r.keyframeStep)},
          {"first_step", step(r.firstStep)},
          {"last_step", step(r.lastStep)},
          {"steps", r.steps},
          {"samples", r.samples},
          {"dataset_indices", indices},
          {"weight_tensors", r.weightTensors},
          {"sources", r.sources},
          {"batch_size", r.batchSize},
          {"rows", r.rows.empty() ? json(nullptr) : json(r.rows)},
          {"row_replays", r.rowReplays},
          {"keyframes_left_out", r.keyframesLeftOut},
          {"steps_left_out", r.stepsLeftOut},
          {"contents", r.contents},
          {"parts", parts},
          {"warnings", r.warnings},
          {"replay", replayJson(r)},
          {"packed_replay", r.packedReplay ? json({{"verdict", replayer::verdictName(r.packedReplay->verdict)},
                                                   {"error", r.packedReplay->error.empty() ? json(nullptr) : json(r.packedReplay->error)}})
                                           : json(nullptr)},
          {"pack_ms", r.packMs}};
}

std::string packText(const investigate::PackReport& r, uint64_t maxBytes) {
  std::string s;
  if (r.tooLarge) {
    s += fmt::format("not written: the packed bundle would be {}, over --max-size {}\n", inspect::formatBytes(r.packedBytes),
                     inspect::formatBytes(maxBytes));
  } else {
    s += fmt::format("packed {} ({}) -> {} ({})\n", r.in, inspect::formatBytes(r.originalBytes), r.out,
                     inspect::formatBytes(r.packedBytes));
  }
  if (r.replay)
    s += fmt::format("replayed   steps {}..{} before packing: {}{}\n", r.replay->keyframe, r.replay->step,
                     replayer::verdictName(r.replay->verdict), r.replay->error.empty() ? "" : " (" + lastLine(r.replay->error) + ")");
  if (r.keyframeStep >= 0)
    s += fmt::format("replays    from the keyframe at step {} to step {} (the crash is at step {}){}\n", r.keyframeStep,
                     r.lastStep, r.crashStep,
                     r.replay && r.replay->keyframeWritten
                         ? fmt::format("; that keyframe was written by the replay, whose steps {}..{} matched the recording "
                                       "bit for bit",
                                       r.replay->keyframe, r.keyframeStep - 1)
                         : "");
  if (r.keyframesLeftOut || r.stepsLeftOut)
    s += fmt::format("left out   {} keyframe(s), {} step(s)\n", r.keyframesLeftOut, r.stepsLeftOut);
  else
    s += "left out   nothing: the bundle already is one keyframe and the steps from it to the crash\n";
  s += "holds\n";
  for (const auto& c : r.contents) s += "  - " + c + "\n";
  s += "largest\n";
  for (const auto& p : r.parts) s += fmt::format("  {:>10}  {}\n", inspect::formatBytes(p.bytes), p.what);
  if (r.packedReplay)
    s += fmt::format("the attachment replays: {}\n", replayer::verdictName(r.packedReplay->verdict));
  if (!r.zipEntries.empty() && !r.tooLarge) {
    s += "zip holds\n";
    for (const auto& e : r.zipEntries) s += "  " + e + "\n";
  }
  for (const auto& w : r.warnings) s += "warning: " + w + "\n";
  if (r.tooLarge) {
    s += "to shrink it: the keyframe is the model's whole state and stays;";
    if (r.steps > 1)
      s += " fewer batches lie between the keyframe and the crash when the crash replays bit for bit here (pack then "
           "writes a keyframe at the crash step) or when the training records keyframes closer together "
           "(--keyframe-every);";
    if (r.rows.empty() && r.batchSize > 1) s += " --rows culprit keeps only the rows the failure needs;";
    s += " or allow a larger --max-size\n";
  }
  else if (r.zipEntries.empty())
    s += fmt::format("next: crashcap replay {}\n", r.out);
  else
    s += fmt::format("next: attach {} to the issue; whoever gets it unzips it and runs crashcap replay {}\n", r.out,
                     r.zipEntries.front());
  return s;
}

Command packCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("pack", "The smallest bundle that still replays the crash, to attach to a bug report");
  cmd->add_option("bundle", o->bundle, "Crash bundle")->required();
  cmd->add_option("-o,--out", o->out, "The packed bundle to write")->required();
  auto* maxSize = cmd->add_option("--max-size", o->maxSize,
                  "Refuse (exit 1, nothing written) when the packed bundle would be larger: 25M, 100MiB, 2G");
  cmd->add_flag("--force", o->force, "Replace OUT when it exists");
  cmd->add_option("--rows", o->rows,
                  "Rows of the crash step's batch to keep: all, culprit (those bisect samples finds), or a list 3,5")
      ->capture_default_str();
  cmd->add_flag("--zip", o->zip,
                "OUT is a .zip holding the packed bundle and report.md, ready to attach to an issue (--max-size applies to it)");
  cmd->add_option("--timeout", o->timeout, "Seconds per experiment of --rows culprit")->capture_default_str();
  cmd->add_flag("--no-replay", o->noReplay,
                "Do not replay first: keep the newest recorded keyframe and every step after it, checking nothing");
  addReadOptions(cmd, o->read);
  cmd->footer(
      "Replays the crash first (as `crashcap replay` does). When every step from the newest keyframe to the\n"
      "crash replays bit for bit, the replay writes the state the crash step starts from as a new keyframe,\n"
      "and the attachment holds that keyframe and the crash step's batch alone. Otherwise (or with\n"
      "--no-replay) it keeps the newest keyframe and every step from it to the crash. The program, optimizer,\n"
      "environment, crash and traces are kept; every other keyframe and step is left out. It says what the\n"
      "attachment holds (training samples and their dataset indices, weights, source files) for whoever must\n"
      "approve sharing it, and warns when the crash does not reproduce here. --rows culprit keeps only the\n"
      "crash step's rows that the failure needs (a bisect samples on the pack), with their dataset indices.\n"
      "Example: crashcap pack crash.ccap -o attach.ccap --max-size 25M && crashcap replay attach.ccap\n"
      "         crashcap pack crash.ccap -o crash.zip --zip --rows culprit --max-size 25M");
  return {cmd, [o, maxSize] {
            investigate::PackOptions po;
            po.out = o->out;
            po.force = o->force;
            po.replay = !o->noReplay;
            po.rows = o->rows;
            po.zip = o->zip;
            po.experimentTimeoutSeconds = o->timeout;
            po.progress = !o->read.json;
            po.maxBytes = maxSize->count() ? parseByteSize(o->maxSize, "--max-size") : 0;
            po.limits = o->read.limits();
            auto r = investigate::packBundle(o->bundle, po);
            if (o->read.json)
              printJson(packJson(r, po.maxBytes));
            else
              std::cout << packText(r, po.maxBytes);
            return r.tooLarge ? kExitCheckFailed : kExitOk;
          },
          &o->read.json};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(240, crashcap::cli::packCommand)
