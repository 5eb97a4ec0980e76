// crashcap info: a bundle's identity and state, what was recovered or lost.
#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/inspect/summary.hpp"

namespace crashcap::cli {
namespace {

struct Options {
  std::string bundle;
  ReadOptions read;
};

Command infoCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("info", "Summarize a bundle: identity, state, what was recovered or lost");
  cmd->add_option("bundle", o->bundle, "Bundle file (*.ccap)")->required();
  addReadOptions(cmd, o->read);
  return {cmd, [o] {
            return onBundleOrJobArchive(o->bundle, [&] {
              auto reader = formats::BundleReader::open(o->bundle, o->read.limits(), progressPrinter("scanning"));
              endProgress();
              if (o->read.json)
                printJson(inspect::bundleInfoJson(*reader));
              else
                std::cout << inspect::bundleInfoText(*reader);
              return kExitOk;
            }, /*membersOnly=*/true);
          },
          &o->read.json};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(10, crashcap::cli::infoCommand)
