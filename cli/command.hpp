#pragma once
// How a subcommand joins `crashcap`: each cli/commands/<name>.cpp declares its options, adds its
// subcommand to the root app and returns what to run; CRASHCAP_COMMAND puts it on the list that
// main() builds the command line from. A command file holds wiring and printing only: what it
// computes, a library computes.

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace crashcap::cli {

/// A registered subcommand, as main() needs it.
struct Command {
  CLI::App* app = nullptr;              ///< the subcommand (owned by the root app)
  std::function<int()> run;             ///< parses are done: do it and return the exit code
  const bool* json = nullptr;           ///< --json given: errors are printed as JSON too
  /// `crashcap run`: the words after the first `--` are a command of the user's, not ours.
  std::vector<std::string>* commandAfterDashes = nullptr;
};

/// Adds the subcommand to `root` and returns it. Options must outlive the call: commands keep
/// them in a shared_ptr that `run` captures.
using CommandFactory = Command (*)(CLI::App& root);

/// Puts a command on the list; `order` is its place in `crashcap --help`. Returns true (for the
/// static initializer CRASHCAP_COMMAND uses).
bool registerCommand(int order, CommandFactory factory);
/// Every registered command, in order.
std::vector<CommandFactory> registeredCommands();

/// The commands that re-execute steps need LibTorch: `crashcap-torch` has them; `crashcap` hands
/// them over to it (main.cpp), and a build without LibTorch says why they are missing.
struct TorchCommand {
  const char* name;
  const char* summary;
};
inline constexpr TorchCommand kTorchCommands[] = {
    {"replay", "Re-run the failing step from a bundle and say whether the crash reproduces"},
    {"bisect", "Find what the failure needs: the first failing step, op, samples of the batch, or setting"},
    {"triage", "Run a fixed plan of experiments and print the hypothesis table"},
    {"report", "A Markdown bug report from a crash bundle, with the triage table, ready to paste"},
    {"pack", "The smallest bundle that still replays the crash, to attach to a bug report"},
};
/// The summary of a command of kTorchCommands.
const char* torchCommandSummary(const std::string& name);

}  // namespace crashcap::cli

#define CRASHCAP_CONCAT_(a, b) a##b
#define CRASHCAP_CONCAT(a, b) CRASHCAP_CONCAT_(a, b)
/// Registers `factory` (a CommandFactory) at static initialization.
#define CRASHCAP_COMMAND(order, factory)                                           \
  namespace {                                                                      \
  const bool CRASHCAP_CONCAT(kRegistered, __LINE__) =                              \
      ::crashcap::cli::registerCommand(order, factory);                            \
  }
