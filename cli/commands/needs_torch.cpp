// In a `crashcap` without LibTorch: replay, bisect, triage, report and pack, listed in --help, each
// saying what it needs. (With LibTorch, `crashcap` hands these commands to `crashcap-torch`
// before it parses anything: main.cpp.)
#include <fmt/format.h>

#include "../command.hpp"
#include "../output.hpp"
#include "crashcap/formats/error.hpp"

namespace crashcap::cli {
namespace {

Command needsTorch(CLI::App& root, const TorchCommand& c) {
  auto* cmd = root.add_subcommand(c.name, c.summary);
  cmd->allow_extras();
  std::string name = c.name;
  return {cmd, [name]() -> int {
#ifdef CRASHCAP_TORCH_HELPER
            throw Error(ErrorCode::Unsupported,
                        fmt::format("{} runs in {}, which is not next to this crashcap", name, CRASHCAP_TORCH_HELPER),
                        "install both executables side by side (cmake --install), or run the build's bin/crashcap");
#else
            throw Error(ErrorCode::Unsupported, fmt::format("this crashcap was built without LibTorch: {} needs it", name),
                        "rebuild with -DCRASHCAP_WITH_TORCH=ON");
#endif
          }};
}

Command replayCommand(CLI::App& root) { return needsTorch(root, kTorchCommands[0]); }
Command bisectCommand(CLI::App& root) { return needsTorch(root, kTorchCommands[1]); }
Command triageCommand(CLI::App& root) { return needsTorch(root, kTorchCommands[2]); }
Command reportCommand(CLI::App& root) { return needsTorch(root, kTorchCommands[3]); }
Command packCommand(CLI::App& root) { return needsTorch(root, kTorchCommands[4]); }

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(200, crashcap::cli::replayCommand)
CRASHCAP_COMMAND(210, crashcap::cli::bisectCommand)
CRASHCAP_COMMAND(220, crashcap::cli::triageCommand)
CRASHCAP_COMMAND(230, crashcap::cli::reportCommand)
CRASHCAP_COMMAND(240, crashcap::cli::packCommand)
