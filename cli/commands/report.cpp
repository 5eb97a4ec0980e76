// crashcap report: a Markdown bug report from a crash bundle, with the triage table.
#include <filesystem>
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
  bool html = false;
  std::string htmlOut;
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
  std::string why;
  if ((o.html || !o.htmlOut.empty()) && !investigate::htmlReportAvailable(&why))
    throw Error(ErrorCode::Unsupported, "no HTML report: " + why, "write the Markdown report (without --html)");
  // To the file -o names, else to stdout.
  auto emit = [&](const std::string& text) {
    if (o.out.empty() || o.out == "-") {
      std::cout << text;
    } else {
      writeFileAtomically(o.out, namedAsTheArchive(text));
      std::cerr << "wrote " << o.out << "\n";
    }
  };
  if (o.html) {
    emit(investigate::htmlReport(o.bundle, triage));
    return kExitOk;
  }
  std::string link;
  if (!o.htmlOut.empty()) {
    writeFileAtomically(o.htmlOut, namedAsTheArchive(investigate::htmlReport(o.bundle, triage)));
    std::cerr << "wrote " << o.htmlOut << "\n";
    // The Markdown links it as a path from where the Markdown lies.
    namespace fs = std::filesystem;
    const fs::path base = o.out.empty() ? fs::current_path() : fs::absolute(o.out).parent_path();
    link = fs::absolute(o.htmlOut).lexically_relative(base).string();
    if (link.empty()) link = o.htmlOut;
  }
  emit(investigate::markdownReport(o.bundle, triage, nullptr, "", link));
  return kExitOk;
}

Command reportCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("report", torchCommandSummary("report"));
  cmd->add_option("bundle", o->bundle,
                  "Crash bundle; or a job archive (crashcap merge), from the rank that failed first; or one "
                  "rank of an archive, JOB.ccap:crash-....ccap")
      ->required();
  cmd->add_option("-o,--out", o->out, "Write the report to this file (default, or -: stdout)");
  cmd->add_flag("--html", o->html,
                "Write one self-contained HTML page with plots instead of Markdown (it loads nothing: open it anywhere)");
  cmd->add_option("--html-out", o->htmlOut, "Also write the HTML report to this file; the Markdown links it");
  cmd->add_flag("--no-triage", o->noTriage, "Skip the experiments (faster; no hypothesis table)");
  cmd->add_option("--timeout", o->timeout, "Seconds per triage experiment")->capture_default_str();
  addAllowDamaged(cmd, o->allowDamaged);
  cmd->footer(
      "Markdown in the shape issue trackers ask for (summary, environment, steps to reproduce, logs, root cause\n"
      "from triage). --html writes the same facts as one HTML page with plots: loss, gradient norm, weight norm\n"
      "and learning rate per recorded step with the crash marked, the first non-finite op's values, the culprit\n"
      "rows beside a normal row (image rows as pictures), the triage table, the environment, the kernel trace.\n"
      "Examples: crashcap report crash.ccap -o bug.md --html-out bug.html\n"
      "          crashcap report crash.ccap --html -o report.html --no-triage");
  addAllowChangedSource(cmd);
  return {cmd, [o] { return onBundleOrJobArchive(o->bundle, [&] { return report(*o); }); }};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(230, crashcap::cli::reportCommand)
