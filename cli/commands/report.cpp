// crashcap report: a Markdown bug report from a crash bundle, with the triage table.
#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "damage.hpp"
#include "crashcap/investigate/report.hpp"

namespace crashcap::cli {
namespace {

struct Options {
  std::string bundle;
  std::string out;
  bool noTriage = false;
  double timeout = 600;
  bool allowDamaged = false;
};

int report(const Options& o) {
  checkIntact(o.bundle, o.allowDamaged);
  std::optional<investigate::Triage> triage;
  if (!o.noTriage) {
    investigate::TriageOptions to;
    to.experiments.timeoutSeconds = o.timeout;
    to.experiments.progress = true;
    to.experiments.allowDamaged = o.allowDamaged;
    triage = investigate::runTriage(o.bundle, to);
  }
  std::string md = investigate::markdownReport(o.bundle, triage);
  if (o.out.empty()) {
    std::cout << md;
  } else {
    writeFileAtomically(o.out, md);
    std::cerr << "wrote " << o.out << "\n";
  }
  return kExitOk;
}

Command reportCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("report", torchCommandSummary("report"));
  cmd->add_option("bundle", o->bundle, "Crash bundle")->required();
  cmd->add_option("-o,--out", o->out, "Write the report to this file (default: stdout)");
  cmd->add_flag("--no-triage", o->noTriage, "Skip the experiments (faster; no hypothesis table)");
  cmd->add_option("--timeout", o->timeout, "Seconds per triage experiment")->capture_default_str();
  addAllowDamaged(cmd, o->allowDamaged);
  addAllowChangedSource(cmd);
  return {cmd, [o] { return report(*o); }};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(230, crashcap::cli::reportCommand)
