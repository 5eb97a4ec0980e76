#include "crashcap/investigate/report.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/inspect/story.hpp"

namespace crashcap::investigate {

using nlohmann::json;

namespace {

std::string jsonList(const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ",")); }

}  // namespace

std::string loadingReplayText(const replayer::ReplayResult& replay, const std::string& step) {
  const auto& load = *replay.batchLoad;
  std::string text = fmt::format("The error came from the DataLoader while it loaded the batch after step {}, which "
                                 "never arrived. Replay loaded that batch again from its {} recorded dataset indices "
                                 "as the program's loader loads it",
                                 step, load.indices.size());
  if (load.error.empty())
    return text + ", and it loaded without an error: the failure needed more than those samples (a worker's random "
                  "state, a file or service that has changed since).";
  if (!replayer::showsFailure(replay))
    return text + (replay.verdict == replayer::Verdict::Diverged
                       ? fmt::format(": it raised `{}`, but the replay departed from the recording before it "
                                     "(verdict diverged).",
                                     lastLine(load.error))
                       : fmt::format(": it raised another error, `{}`.", lastLine(load.error)));
  text += fmt::format(": it raised `{}` again.", lastLine(load.error));
  if (load.culprits.empty()) return text + " No single sample fails alone, and none differs in structure from the rest.";
  std::vector<std::string> named;
  for (const auto& c : load.culprits) named.push_back(fmt::format("dataset index {} (`{}`)", c.datasetIndex, lastLine(c.error)));
  return text + fmt::format(" The sample{} that fail{} {}: {}.", named.size() == 1 ? "" : "s",
                            named.size() == 1 ? "s" : "", load.culpritsBy, fmt::join(named, "; "));
}

std::string markdownReport(const std::string& path, const std::optional<Triage>& triage,
                           const replayer::ReplayResult* replayed, const std::string& shownAs, const std::string& htmlLink) {
  auto reader = formats::BundleReader::open(path);
  const std::string& bundle = shownAs.empty() ? path : shownAs;
  // The story is what `crashcap inspect` prints; the report prints the same facts as Markdown.
  auto story = inspect::storyJson(*reader);
  const json& crash = story["crash"];
  const json facts = story["env"].value("facts", json::object());
  auto fact = [&](const char* k) { return facts.contains(k) ? facts[k].get<std::string>() : std::string("unknown"); };
  std::string error = crash.is_null() ? std::string("(no crash record)") : lastLine(crash["error"].get<std::string>());
  const auto view = formats::readRecords(*reader);
  const auto step = reportedStep(view);
  const std::string stepText = step ? std::to_string(*step) : "?";
  // A crash the supervisor saw outside any step has no phase.
  const std::string phase = !crash.is_null() && crash["phase"].is_string() ? crash["phase"].get<std::string>() : "unknown";
  // A crash between steps or while loading the next batch names the step before it, which completed.
  const bool afterStep = step && !formats::failedInStep(view);
  const char* at = afterStep ? "after" : "at";
  const replayer::ReplayResult* replay = triage && triage->facts.replay ? &*triage->facts.replay : replayed;
  // At most 80 characters, cut at a word and marked as cut.
  std::string title = error;
  if (title.size() > 80) {
    const size_t space = title.rfind(' ', 79);
    title = title.substr(0, space == std::string::npos || space < 40 ? 79 : space) + "…";
  }
  std::replace(title.begin(), title.end(), '"', '\'');  // keep the front matter valid YAML
  std::string md;
  md += fmt::format("---\ntitle: \"Training crash {} step {}: {}\"\ndate: \"{}\"\ntype: \"bug_report\"\n"
                    "generated_by: \"crashcap {}\"\nbundle: \"{}\"\n---\n\n",
                    at, stepText, title, crash.is_null() ? "" : crash["time"].get<std::string>(), formats::toolVersion(),
                    bundle);
  md += "## Summary\n";
  if (crash.is_null()) {
    md += fmt::format("The recording ends without a crash record (state: {}).\n", story["status"].dump());
  } else {
    md += fmt::format("Training fails {} step {} in the {} phase with `{}`.", at, stepText, phase, error);
    if (!triage && replay) md += fmt::format(" Replay: **{}**.", replayer::verdictName(replay->verdict));
    if (triage) {
      std::vector<std::string> confirmed;
      for (const auto& h : triage->hypotheses)
        if (h.verdict == HypothesisVerdict::Confirmed) confirmed.push_back(h.id);
      md += fmt::format(" Replay: **{}**. Triage confirms: **{}**.", replay ? replayer::verdictName(replay->verdict) : "failed",
                        confirmed.empty() ? std::string("nothing yet") : fmt::format("{}", fmt::join(confirmed, ", ")));
    }
    md += "\n";
  }
  if (!htmlLink.empty())
    md += fmt::format("\nThe same report with plots (loss, gradient norm, weight norm, learning rate; the culprit rows): "
                      "[{}]({}).\n",
                      htmlLink, htmlLink);
  if (replay && phase == "loading" && replay->batchLoad)
    md += "\n" + loadingReplayText(*replay, stepText) + "\n";
  else if (replay && !replayer::showsFailure(*replay) && phase == "loading")
    // The batch that failed never arrived, and this replay did not load it again.
    md += fmt::format("\n**The error came from the DataLoader while it loaded the batch after step {}**, which never "
                      "arrived, and replay (verdict {}) did not load it again.{}\n",
                      stepText, replayer::verdictName(replay->verdict),
                      crash["error"].get<std::string>().find("of dataset indices") != std::string::npos
                          ? " The crash record names the batch's dataset indices (Logs below): load those samples "
                            "with the dataset to see it fail."
                          : " The recording does not know which samples it held.");
  else if (replay && !replayer::showsFailure(*replay))
    md += fmt::format("\n**The crash does not reproduce in replay here** (verdict {}{}): the bundle alone may not be "
                      "enough to reproduce it; the cause may lie outside what was recorded (the program's own code "
                      "around the step, the machine).\n",
                      replayer::verdictName(replay->verdict),
                      replay->error.empty() && replay->verdict != replayer::Verdict::RecordingIncomplete
                          ? fmt::format(", step {} runs clean", replay->step)
                          : "");
  // A bundle `crashcap pack` made says so in a note: what it holds, and whether the crash reproduced
  // when it was packed.
  for (const auto& note : reader->notes()) {
    if (note.key != "crashcap.pack") continue;
    md += "\n## Attachment\nThis bundle was made by `crashcap pack` for sharing:\n";
    size_t start = 0;
    while (start < note.text.size()) {
      size_t end = note.text.find('\n', start);
      if (end == std::string::npos) end = note.text.size();
      std::string line = note.text.substr(start, end - start);
      start = end + 1;
      if (line.empty()) continue;
      if (line.rfind("warning: ", 0) == 0 && line.find("does not reproduce") != std::string::npos)
        md += "- **" + line + "**\n";
      else
        md += "- " + line + "\n";
    }
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
  for (const auto& a : story["env"].value("command_line", json::array()))
    command += (command.empty() ? "" : " ") + a.get<std::string>();
  md += fmt::format("- Command: `{}`\n", command.empty() ? "unknown" : command);
  if (!story["optimizer"].is_null()) md += fmt::format("- Optimizer: {}\n", story["optimizer"]["kind"].get<std::string>());
  md += "\n## Steps to Reproduce\n";
  md += fmt::format("1. Get the crash bundle `{}` (attached).\n", bundle);
  md += fmt::format("2. `crashcap inspect {}` (what was recorded, the crash, the last ops)\n", bundle);
  md += fmt::format("3. `crashcap replay {}` (re-runs step {} from {}, bit for bit on the CPU)\n", bundle, stepText,
                    replay ? fmt::format("keyframe {}", replay->keyframe) : std::string("the newest keyframe before it"));
  md += fmt::format("4. `crashcap triage {}` ({})\n", bundle, triage ? "the experiments below" : "the experiments that name the cause");
  md += phase == "loading" ? "\n## Expected Behavior\nThe next batch loads and training continues.\n"
                           : "\n## Expected Behavior\nThe step completes with a finite loss and training continues.\n";
  md += "\n## Actual Behavior\n";
  if (!crash.is_null()) {
    md += fmt::format("- {} ({}, phase {}): `{}`\n",
                      afterStep ? fmt::format("The run fails after step {}", stepText) : fmt::format("Step {} fails", stepText),
                      crash["kind"].get<std::string>(), phase, error);
    if (!crash["signal"].is_null()) md += fmt::format("- The process died by {}.\n", crash["signal_name"].get<std::string>());
  }
  if (replay) {
    md += fmt::format("- Replay verdict: {} over {} step{}.\n", replayer::verdictName(replay->verdict), replay->steps.size(),
                      replay->steps.size() == 1 ? "" : "s");
    if (replay->raisingOp)
      md += fmt::format("- The error comes out of `{}` ({}{}).\n", replay->raisingOp->name, replay->raisingOp->phase,
                        nodeText(replay->raisingOp->node));
    if (replay->firstNonFiniteOp)
      md += fmt::format("- First op whose output goes non-finite: `{}` ({}{}).\n", replay->firstNonFiniteOp->name,
                        replay->firstNonFiniteOp->phase, nodeText(replay->firstNonFiniteOp->node));
  }
  for (const auto& t : story["crash_tensors"]) {
    if (!t.contains("stats") || t["stats"].is_null()) continue;
    const json& s = t["stats"];
    std::vector<std::string> held;
    for (const char* kind : {"nan", "inf"})
      if (s.value(fmt::format("{}_count", kind), uint64_t(0)) > 0)
        held.push_back(fmt::format("{} {} (first at {})", s[fmt::format("{}_count", kind)].dump(),
                                   kind == std::string("nan") ? "NaN" : "Inf", s[fmt::format("first_{}", kind)].dump()));
    if (!held.empty()) md += fmt::format("- `{}` holds {}.\n", t["name"].get<std::string>(), fmt::join(held, " and "));
  }
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
  if (triage) {
    md += "\n## Root Cause Analysis (crashcap triage)\n| hypothesis | verdict | evidence | rerun |\n|---|---|---|---|\n";
    for (const auto& h : triage->hypotheses) {
      std::string ev = fmt::format("{}", fmt::join(h.evidence, "; "));
      std::replace(ev.begin(), ev.end(), '|', '/');  // a table cell cannot hold one
      md += fmt::format("| {} | **{}** | {} | `{}` |\n", h.id, verdictName(h.verdict), ev, h.rerun);
    }
    // What triage could place, and only that.
    const auto& c = triage->culprit;
    std::vector<std::string> where;
    if (c.rank) where.push_back(fmt::format("rank {}", *c.rank));
    const bool loading = c.phase == "loading" && c.datasetIndices;
    if (c.step)
      where.push_back(fmt::format(loading    ? "the batch after step {}, which failed to load"
                                  : c.loader ? "between steps, after step {}"
                                             : "step {}",
                                  *c.step));
    if (loading) where.push_back("dataset indices " + jsonList(*c.datasetIndices));
    if (c.rows)
      where.push_back(fmt::format("{} {}{}", c.loader ? fmt::format("rows of DataLoader #{}'s batch (not a step's)", *c.loader)
                                                      : std::string("batch rows"),
                                  jsonList(*c.rows),
                                  c.datasetIndices ? " (dataset indices " + jsonList(*c.datasetIndices) + ")" : ""));
    if (c.value) where.push_back(investigate::culpritValueText(*c.value, "`"));
    if (auto batch = investigate::culpritBatchText(c)) {
      where.push_back(*batch);
      if (c.datasetIndices && !loading) where.push_back("dataset indices " + jsonList(*c.datasetIndices));
    }
    if (c.op)
      where.push_back(fmt::format("op `{}`{}", *c.op,
                                  c.phase ? " (" + *c.phase + nodeText(c.node.value_or("")) + ")" : ""));
    if (c.changes && !c.changes->empty()) where.push_back("the outcome changes with " + json(*c.changes).dump());
    md += fmt::format("\nCulprit: {}.\n", where.empty() ? std::string("not placed") : fmt::format("{}", fmt::join(where, ", ")));
  }
  return md;
}

std::optional<int64_t> reportedStep(const formats::BundleRecords& records) {
  if (records.crash && records.crash->step >= 0) return records.crash->step;
  return formats::killedInStep(records);
}

}  // namespace crashcap::investigate
