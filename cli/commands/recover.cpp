// crashcap recover: a sealed copy of everything intact; never touches the input.
#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/inspect/summary.hpp"

namespace crashcap::cli {
namespace {

struct Options {
  std::string bundle;
  std::string out;
  ReadOptions read;
};

Command recoverCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("recover", "Write a sealed copy of everything intact (never touches the input)");
  cmd->add_option("bundle", o->bundle, "Damaged or unsealed bundle")->required();
  cmd->add_option("out", o->out, "Where to write the repaired copy (must not exist)")->required();
  addReadOptions(cmd, o->read);
  return {cmd, [o] {
            auto r = formats::recoverBundle(o->bundle, o->out, o->read.limits(), progressPrinter("recovering"));
            endProgress();
            if (o->read.json)
              printJson(inspect::recoverJson(o->bundle, o->out, r));
            else
              std::cout << inspect::recoverText(o->bundle, o->out, r);
            return kExitOk;
          },
          &o->read.json};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(80, crashcap::cli::recoverCommand)
