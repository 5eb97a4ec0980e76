// crashcap triage: the fixed plan of experiments and the hypothesis table.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "damage.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/investigate/triage.hpp"

namespace crashcap::cli {
namespace {

struct Options {
  std::string bundle;
  double timeout = 600;
  bool json = false;
  std::string jsonOut;  ///< also write the JSON object here
  bool allowDamaged = false;
};

std::string rowsText(const std::vector<int64_t>& v) { return fmt::format("[{}]", joinRows(v)); }

void printTriage(const investigate::Triage& t) {
  const auto& f = t.facts;
  auto reader = formats::BundleReader::open(f.bundle);
  const auto view = formats::readRecords(*reader);
  const auto& crash = view.crash;
  const auto killed = formats::killedInStep(view);
  const bool killedUnheld =
      killed && std::none_of(view.stepBegins.begin(), view.stepBegins.end(),
                             [&](const formats::StepBeginData& b) { return b.step == *killed; });
  if (!crash && killedUnheld)
    // SIGKILL (the OOM killer): no crash record, and the step it was in may not be in the bundle.
    std::cout << fmt::format("triage of {}: killed in step {} ({}), which the bundle does not hold: the last it holds is "
                             "step {}; replay {}\n",
                             f.bundle, *killed,
                             view.supervision && !view.supervision->evidence.empty() ? view.supervision->evidence
                                                                                     : "its recording was never closed",
                             f.step() >= 0 ? std::to_string(f.step()) : "null",
                             f.replay ? replayer::verdictName(f.replay->verdict) : "failed");
  else
    std::cout << fmt::format("triage of {}: crash {} {}; replay {}\n", f.bundle,
                             crash                ? crash->kind
                             : killed             ? "killed"
                             : view.supervision   ? view.supervision->classification + " (seen by crashcap run)"
                                                  : "(none recorded)",
                             f.step() < 0 ? std::string("before any step")
                             : fmt::format("{} step {}", formats::stepPreposition(crash ? crash->phase : ""), f.step()),
                             f.replay ? replayer::verdictName(f.replay->verdict) : "failed");
  if (const auto& j = f.job) {
    std::cout << fmt::format("rank {} of job {} ({} ranks): every experiment replays all its ranks together, the rows cut "
                             "on rank {}'s batch\n",
                             j->rank, j->jobId, j->worldSize, j->rank);
    if (j->askedRank != j->rank)
      std::cout << fmt::format("{} (rank {}) failed because rank {} did: rank {} failed first on its own, so it is the one "
                               "triaged\n",
                               j->askedBundle, j->askedRank, j->rank, j->rank);
    std::vector<std::string> verdicts;
    for (const auto& [rank, verdict] : j->verdicts)
      verdicts.push_back(fmt::format("rank {} {}", rank, verdict.empty() ? "gave no replay" : verdict));
    if (!verdicts.empty()) std::cout << fmt::format("the job's replay: {}\n", fmt::join(verdicts, ", "));
  }
  if (f.replay)
    for (const auto& n : f.replay->notes) std::cout << fmt::format("note: {}\n", n);
  // A replay that could not run blocks every hypothesis alike: why is said once, here, and each
  // hypothesis points to it (--json keeps the whole sentence in each).
  const auto blocked = f.replay || f.replayOutcome.empty() ? std::nullopt : f.replayBlocked();
  if (blocked) std::cout << fmt::format("note: replay could not run: {}\n", f.replayOutcome);
  auto evidenceText = [&](const std::string& e) {
    return blocked && e == *blocked ? std::string("replay could not run (the note above), so nothing was tested") : e;
  };
  std::cout << "\n";
  std::cout << fmt::format("  {:<22} {:<13} {}\n", "hypothesis", "verdict", "evidence");
  for (const auto& h : t.hypotheses) {
    std::cout << fmt::format("  {:<22} {:<13} {}\n", h.id, investigate::verdictName(h.verdict),
                             h.evidence.empty() ? "" : evidenceText(h.evidence[0]));
    for (size_t i = 1; i < h.evidence.size(); ++i)
      std::cout << fmt::format("  {:<22} {:<13} {}\n", "", "", evidenceText(h.evidence[i]));
    std::cout << fmt::format("  {:<22} {:<13} rerun: {}\n", "", "", h.rerun);
  }
  const auto& c = t.culprit;
  if (c.phase == "loading" && c.datasetIndices) {
    // The samples of the batch that never came: not rows of a recorded batch, and no op.
    std::cout << fmt::format("\nculprit: {}the batch after step {}, which failed to load: dataset indices {}{}\n",
                             c.rank ? fmt::format("rank {}, ", *c.rank) : "", c.step ? std::to_string(*c.step) : "null",
                             rowsText(*c.datasetIndices),
                             c.changes && !c.changes->empty() ? "; the outcome changes with " + json(*c.changes).dump() : "");
    return;
  }
  if (c.loader && c.rows) {
    // Rows of the batch another loader gave between steps (a validation pass's): no step's, no op.
    std::cout << fmt::format("\nculprit: {}rows {} of the batch DataLoader #{} gave after step {} (not a step's; kept in "
                             "the bundle as crash/batch/){}\n",
                             c.rank ? fmt::format("rank {}, ", *c.rank) : "", rowsText(*c.rows), *c.loader,
                             c.step ? std::to_string(*c.step) : "null",
                             c.datasetIndices ? " (dataset indices [" + investigate::leadingIndicesText(*c.datasetIndices) + "])"
                                              : "");
    return;
  }
  if (view.stepBegins.empty() && !c.step) {
    std::cout << "\nculprit: none: the bundle holds no step to replay\n";
    return;
  }
  std::cout << fmt::format(
      "\nculprit: {}step {}, {}{}, {}{}\n", c.rank ? fmt::format("rank {}, ", *c.rank) : "",
      c.step ? std::to_string(*c.step) : "null",
      c.rows    ? "rows " + rowsText(*c.rows)
      : c.value ? investigate::culpritValueText(*c.value)
      : investigate::culpritBatchText(c).value_or("no batch rows singled out"),
      c.datasetIndices ? " (dataset indices [" + investigate::leadingIndicesText(*c.datasetIndices) + "])" : "",
      c.op ? fmt::format("op {} ({}{})", *c.op, c.phase.value_or("?"), investigate::nodeText(c.node.value_or("")))
      : t.facts.replay && t.facts.replay->steps.empty() ? std::string("no op seen (the replay gave no step back)")
                                                        : std::string("no op output went non-finite"),
      c.changes && !c.changes->empty() ? "; the outcome changes with " + json(*c.changes).dump() : "");
}

/// A --json-out that cannot be written is refused before minutes of experiments, not after them.
void checkWritableDirectoryOf(const std::string& path) {
  const auto slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw Error(ErrorCode::InvalidArgument, fmt::format("--json-out {}: cannot write into {}: {}", path, dir,
                                                        std::strerror(errno)),
                "name a file in a directory that exists and is writable");
}

int triage(const Options& o) {
  checkIntact(o.bundle, o.allowDamaged);
  if (!o.jsonOut.empty()) checkWritableDirectoryOf(o.jsonOut);
  investigate::TriageOptions to;
  to.experiments.allowDamaged = o.allowDamaged;
  to.experiments.timeoutSeconds = o.timeout;
  to.experiments.progress = !o.json;
  auto t = investigate::runTriage(o.bundle, to);
  const auto j = o.json || !o.jsonOut.empty() ? investigate::toJson(t) : json();
  // Printed first: a file that cannot be written after all loses neither form.
  if (o.json)
    printJson(j);
  else
    printTriage(t);
  if (!o.jsonOut.empty()) {
    std::cout << std::flush;
    writeFileAtomically(o.jsonOut, namedAsTheArchive(jsonText(j)));
    if (!o.json) std::cerr << "wrote " << o.jsonOut << "\n";
  }
  return kExitOk;
}

Command triageCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("triage", torchCommandSummary("triage"));
  cmd->add_option("bundle", o->bundle,
                  "Bundle with a step program; or a job archive (crashcap merge), from the rank that failed first; or one "
                  "rank of an archive, JOB.ccap:crash-....ccap")
      ->required();
  cmd->add_option("--timeout", o->timeout, "Seconds per experiment before it is killed")->capture_default_str();
  cmd->add_flag("--json", o->json, "Print one JSON object instead of text");
  cmd->add_option("--json-out", o->jsonOut,
                  "Also write the JSON object to this file: the text and the JSON of one triage, which takes minutes");
  addAllowDamaged(cmd, o->allowDamaged);
  addAllowChangedSource(cmd);
  cmd->footer("Hypotheses: invalid-data, loss-numerics, optimizer-divergence, device-specific, config-dependent,\n"
              "nondeterminism; each confirmed, refuted or inconclusive with its evidence and the command that\n"
              "reruns it. Every experiment runs in a fresh child process with a timeout (docs/REPLAY.md).\n"
              "Rows that the failure needs, and without which it goes away, are its trigger (the culprit's rows).\n"
              "They are invalid data only when they hold an invalid value: NaN/Inf, an index outside the domain\n"
              "an op in the trace declares (an embedding's rows, a loss's classes), or a magnitude 100x beyond\n"
              "the other rows' (in the row, or in one feature of a [rows, features] tensor). Trigger rows in\n"
              "range are an input the loss cannot handle (loss-numerics).\n"
              "A rank of a multi-process job is triaged with its job: every experiment replays all its ranks\n"
              "together, and the rows bisected are the batch of the rank that failed first on its own (the one\n"
              "triaged when the rank asked for failed only because a peer did). bisect ops is not built for jobs.\n"
              "A bundle that verify finds damaged is refused before any experiment (--allow-damaged).");
  return {cmd, [o] { return onBundleOrJobArchive(o->bundle, [&] { return triage(*o); }); }, &o->json};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(220, crashcap::cli::triageCommand)
