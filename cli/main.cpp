// crashcap: the command-line entry point. It builds the command line from the registered
// subcommands (cli/commands/, one file each), runs the one given, and turns errors into exit
// codes, here and nowhere else.
//
// Exit codes: 0 ok; 1 a check failed (verify found damage); 2 bad input or usage (missing or
// corrupt file, unknown tensor, bad option); 3 internal error (a crashcap bug).

#include <unistd.h>

#include <CLI/CLI.hpp>

#include <cstring>
#include <iostream>
#include <string>

#include "command.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "output.hpp"

namespace {

using namespace crashcap;
using namespace crashcap::cli;

const char* kExitCodesHelp =
    "Exit codes: 0 ok; 1 a check failed (verify found damage); 2 bad input or usage (missing or\n"
    "corrupt file, unknown tensor, bad option); 3 internal error (a crashcap bug; please report it).";

int exitCodeFor(ErrorCode code) { return code == ErrorCode::Internal ? kExitInternal : kExitBadInput; }

#ifdef CRASHCAP_TORCH_HELPER
/// This `crashcap` starts without LibTorch (loading it takes about a second, which `crashcap run`
/// and the read commands should not pay); the commands that re-execute steps, and .pt export,
/// run in the sibling CRASHCAP_TORCH_HELPER, which has everything. Returns only when the helper
/// cannot be executed; the command's stand-in then says so (commands/needs_torch.cpp).
void forwardToTorchHelper(int argc, char** argv) {
  if (argc < 2) return;
  const std::string cmd = argv[1];
  bool needs = torchCommandSummary(cmd)[0] != '\0';
  if (cmd == "export")
    for (int i = 2; i < argc; ++i) needs = needs || std::string(argv[i]).rfind("--pt", 0) == 0;
  if (!needs) return;
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return;
  std::string helper(self, static_cast<size_t>(n));
  helper = helper.substr(0, helper.rfind('/') + 1) + CRASHCAP_TORCH_HELPER;
  ::execv(helper.c_str(), argv);
}
#endif

void printError(const Error& e, bool asJson) {
  if (asJson)
    printJson({{"error",
                {{"code", errorCodeName(e.code())},
                 {"code_number", int(e.code())},
                 {"message", e.message()},
                 {"context", e.context()},
                 {"hint", e.hint()}}}});
  std::cerr << "crashcap: error: " << e.what() << "\n";
}

}  // namespace

int main(int argc, char** argv) {
#ifdef CRASHCAP_TORCH_HELPER
  forwardToTorchHelper(argc, argv);
#endif
  CLI::App app{
      "crashcap: a flight recorder for deep-learning training crashes.\n"
      "A bundle (*.ccap) holds what a training run consumed and how it died; these commands tell its\n"
      "story, replay and triage the crash, and read, check, repair and build bundles."};
  app.footer(kExitCodesHelp);
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("crashcap ") + formats::toolVersion());

  std::vector<Command> commands;
  for (auto factory : registeredCommands()) commands.push_back(factory(app));

  // A command that takes a command of the user's (`crashcap run [options] -- CMD...`): everything
  // after its first -- is the user's, not ours to parse.
  int parsed = argc;
  for (auto& c : commands)
    if (c.commandAfterDashes && argc > 1 && c.app->get_name() == argv[1])
      for (int i = 2; i < argc; ++i)
        if (std::string(argv[i]) == "--") {
          parsed = i;
          c.commandAfterDashes->assign(argv + i + 1, argv + argc);
          break;
        }
  try {
    app.parse(parsed, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitBadInput;
  }

  for (auto& c : commands) {
    if (!*c.app) continue;
    const bool asJson = c.json && *c.json;
    try {
      return c.run();
    } catch (const Error& e) {
      printError(e, asJson);
      return exitCodeFor(e.code());
    } catch (const std::bad_alloc&) {
      std::cerr << "crashcap: error: out of memory\n";
      return kExitBadInput;
    } catch (const std::exception& e) {
      std::cerr << "crashcap: internal error: " << e.what() << "\n";
      return kExitInternal;
    }
  }
  return kExitInternal;
}
