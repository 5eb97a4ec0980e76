// crashcap verify: every checksum and invariant of a bundle; exit 1 when anything is damaged.
#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/inspect/summary.hpp"

namespace crashcap::cli {
namespace {

struct Options {
  std::string bundle;
  ReadOptions read;
};

Command verifyCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("verify", "Check every checksum and invariant; exit 1 when anything is damaged");
  cmd->add_option("bundle", o->bundle, "Bundle file")->required();
  addReadOptions(cmd, o->read);
  return {cmd, [o] {
            return onBundleOrJobArchive(o->bundle, [&] {
              auto v = formats::verifyBundle(o->bundle, o->read.limits(), progressPrinter("verifying"));
              endProgress();
              if (o->read.json)
                printJson(inspect::verifyJson(o->bundle, v));
              else
                std::cout << inspect::verifyText(o->bundle, v);
              return v.ok() ? kExitOk : kExitCheckFailed;
            }, /*membersOnly=*/true);
          },
          &o->read.json};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(70, crashcap::cli::verifyCommand)
