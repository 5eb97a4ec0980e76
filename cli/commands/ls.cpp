// crashcap ls: the tensors of a bundle with dtype, shape and sizes.
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

Command lsCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("ls", "List the tensors in a bundle with dtype, shape and sizes");
  cmd->add_option("bundle", o->bundle, "Bundle file")->required();
  addReadOptions(cmd, o->read);
  return {cmd, [o] {
            auto reader = formats::BundleReader::open(o->bundle, o->read.limits());
            if (o->read.json)
              printJson(inspect::tensorListJson(*reader));
            else
              std::cout << inspect::tensorListText(*reader);
            if (!reader->report().complete() && !o->read.json) std::cerr << "note: " << reader->report().summary() << "\n";
            return kExitOk;
          },
          &o->read.json};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(20, crashcap::cli::lsCommand)
