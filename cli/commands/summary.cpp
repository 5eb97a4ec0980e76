// crashcap summary: the crashes of many runs at once, grouped, with what sets them apart.
#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "crashcap/supervisor/summary.hpp"

namespace crashcap::cli {
namespace {

struct Options {
  std::string dir;
  bool json = false;
};

Command summaryCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand(
      "summary", "The crashes of many runs at once (a study, a week of restarts): grouped, counted, set apart");
  cmd->add_option("dir", o->dir, "A directory of runs: `crashcap run --dir` or a study's (searched recursively)")
      ->required();
  cmd->add_flag("--json", o->json, "Print JSON: {\"groups\": [{\"classification\", \"signature\", \"count\", "
                                   "\"runs\", \"bundles\", \"first\", \"last\", \"separated_by\"}], \"unreadable\", ...}");
  cmd->footer(
      "Reads every crash bundle under DIR and every runs.jsonl that `crashcap run` wrote there (one line per run,\n"
      "crashed or healthy). Crashes are grouped by classification and signature: the error's own line with\n"
      "numbers blanked, the op that was running, and the phase. When the runs carry hyperparameters (their\n"
      "command line's --name value options, or crashcap.hyperparameters(...) in the program), each group names\n"
      "the conditions that every run in it meets and few healthy runs do, e.g.\n"
      "  apart   num_classes = 10 and label_smoothing >= 0.05: all 12 of these, 0 of 30 healthy runs\n"
      "Damaged bundles and foreign files are listed, never fatal. Exit status: 0, or 2 when DIR is not a directory.");
  return {cmd, [o] {
            auto s = supervisor::summarizeCrashes(o->dir);
            if (o->json)
              printJson(supervisor::crashSummaryJson(s));
            else
              std::cout << supervisor::crashSummaryText(s);
            return kExitOk;
          },
          &o->json};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(105, crashcap::cli::summaryCommand)
