// crashcap import: a bundle built from .npy files (to attach tensors to a bug report).
#include <fmt/format.h>

#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/inspect/import.hpp"
#include "crashcap/inspect/summary.hpp"

namespace crashcap::cli {
namespace {

struct Options {
  std::string out;
  std::vector<std::string> items;
  std::vector<std::string> notes;
  int level = 3;
  bool force = false;
  bool json = false;
};

int import(const Options& o) {
  std::vector<inspect::ImportItem> items;
  for (const auto& a : o.items) {
    auto eq = a.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == a.size())
      throw Error(ErrorCode::InvalidArgument, fmt::format("'{}' is not NAME=FILE.npy", a),
                  "example: crashcap import bug.ccap batch/images=images.npy labels=labels.npy");
    items.push_back({a.substr(0, eq), a.substr(eq + 1)});
  }
  inspect::ImportOptions io;
  io.zstdLevel = o.level;
  io.overwrite = o.force;
  for (const auto& n : o.notes) {
    auto eq = n.find('=');
    if (eq == std::string::npos || eq == 0) throw Error(ErrorCode::InvalidArgument, fmt::format("'{}' is not KEY=TEXT", n));
    io.notes.emplace_back(n.substr(0, eq), n.substr(eq + 1));
  }
  auto r = inspect::importNpyFiles(o.out, items, io);
  if (o.json)
    printJson({{"output", o.out}, {"tensors", r.tensors}, {"bytes", r.bytes}});
  else
    std::cout << fmt::format("wrote {}: {} tensor{}, {}\n", o.out, r.tensors, r.tensors == 1 ? "" : "s",
                             inspect::formatBytes(r.bytes));
  return kExitOk;
}

Command importCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("import", "Build a bundle from .npy files (to attach tensors to a bug report)");
  cmd->add_option("out", o->out, "Bundle to write")->required();
  cmd->add_option("tensors", o->items, "NAME=FILE.npy pairs")->required();
  cmd->add_option("--note", o->notes, "KEY=TEXT annotations to store with the tensors");
  cmd->add_option("--level", o->level, "zstd level 0..19 (0 stores raw)")->capture_default_str()->check(CLI::Range(0, 19));
  cmd->add_flag("--force", o->force, "Replace OUT if it exists");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of text");
  cmd->footer("Example: crashcap import bug.ccap batch/images=images.npy batch/labels=labels.npy");
  return {cmd, [o] { return import(*o); }, &o->json};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(50, crashcap::cli::importCommand)
