// crashcap doctor: this machine's GPU stack as a checklist, each check with a status and advice.
#include <fmt/format.h>

#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "crashcap/supervisor/doctor.hpp"
#include "crashcap/supervisor/supervisor.hpp"

namespace crashcap::cli {
namespace {

int doctor(bool asJson) {
  auto checks = supervisor::runDoctor();
  int failed = 0;
  json all = json::array();
  for (const auto& c : checks) {
    failed += c.status == "fail";
    all.push_back({{"id", c.id}, {"status", c.status}, {"detail", c.detail}, {"advice", c.advice}});
  }
  if (asJson) {
    printJson({{"checks", all}, {"failed", failed}, {"trace", supervisor::traceStatus()}});
  } else {
    for (const auto& c : checks) {
      std::cout << fmt::format("{:<16} {:<5} {}\n", c.id, c.status, c.detail);
      if (!c.advice.empty()) std::cout << fmt::format("{:<16} {:<5} -> {}\n", "", "", c.advice);
    }
    std::cout << fmt::format("{:<16} {:<5} {}\n", "kernel-trace", "info", supervisor::traceStatus());
  }
  return failed ? kExitCheckFailed : kExitOk;
}

Command doctorCommand(CLI::App& root) {
  auto json = std::make_shared<bool>(false);
  auto* cmd = root.add_subcommand("doctor", "Check this machine's GPU stack: driver, CUDA, cuDNN, CUPTI, WSL2, hazards");
  cmd->add_flag("--json", *json, "Print one JSON object instead of text");
  cmd->footer("Driver, CUDA runtime, cuDNN, CUPTI, GPU visibility, WSL2, the fork-after-CUDA hazard, CUDA-related\n"
              "environment variables; each ok, warn, fail or info with advice. Exit 1 when a check fails.");
  return {cmd, [json] { return doctor(*json); }, json.get()};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(110, crashcap::cli::doctorCommand)
