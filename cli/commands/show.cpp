// crashcap show: a tensor printed numpy-style (summarized when large), with its statistics.
#include <fmt/format.h>

#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/inspect/host_tensor.hpp"
#include "crashcap/inspect/print.hpp"
#include "crashcap/inspect/slice.hpp"
#include "crashcap/inspect/stats.hpp"

namespace crashcap::cli {
namespace {

struct Options {
  std::string bundle, name, slice;
  bool stats = false;
  bool full = false;
  int precision = 4;
  ReadOptions read;
};

int show(const Options& s) {
  auto reader = formats::BundleReader::open(s.bundle, s.read.limits());
  auto t = inspect::loadTensor(*reader, s.name);
  const auto fullShape = t.shape;
  if (!s.slice.empty()) t = inspect::applySlice(t, inspect::parseSlice(s.slice));
  inspect::PrintOptions p;
  p.precision = s.precision;
  if (s.full) p.threshold = UINT64_MAX;
  if (s.read.json) {
    json j = {{"name", s.name},
              {"dtype", formats::dtypeName(t.dtype)},
              {"shape", fullShape},
              {"slice", s.slice.empty() ? json(nullptr) : json(s.slice)},
              {"slice_shape", t.shape}};
    if (s.stats) j["stats"] = inspect::statsToJson(inspect::computeStats(t));
    j["text"] = inspect::formatTensor(t, p);
    printJson(j);
    return kExitOk;
  }
  std::cout << fmt::format("{}  {}  {}{}\n", s.name, formats::dtypeName(t.dtype), formats::formatShape(fullShape),
                           s.slice.empty() ? "" : fmt::format("  [{}] -> {}", s.slice, formats::formatShape(t.shape)));
  if (s.stats) std::cout << inspect::formatStats(inspect::computeStats(t)) << "\n";
  std::cout << inspect::formatTensor(t, p) << "\n";
  return kExitOk;
}

Command showCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("show", "Print a tensor (numpy-like, summarized when large) and its statistics");
  cmd->add_option("bundle", o->bundle, "Bundle file")->required();
  cmd->add_option("name", o->name, "Tensor name, as `crashcap ls` prints it")->required();
  cmd->add_flag("--stats", o->stats, "Also print min, max, mean, std, NaN/Inf counts and their first positions");
  cmd->add_option("--slice", o->slice, "numpy-style selection, e.g. '0,:,2:5' or '...,-1'");
  cmd->add_flag("--full", o->full, "Print every element, never summarize");
  cmd->add_option("--precision", o->precision, "Digits after the point for floats")->capture_default_str();
  cmd->footer("Example: crashcap show crash.ccap batch/images --stats --slice '0,0'");
  addReadOptions(cmd, o->read);
  return {cmd, [o] { return onBundleOrJobArchive(o->bundle, [&] { return show(*o); }, /*membersOnly=*/true); },
          &o->read.json};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(30, crashcap::cli::showCommand)
