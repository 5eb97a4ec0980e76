// crashcap seal: a recording left by a killed process (SIGKILL, power loss) turned into a bundle.
#include <fmt/format.h>

#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/inspect/summary.hpp"
#include "crashcap/recorder/recording_dir.hpp"

namespace crashcap::cli {
namespace {

struct Options {
  std::string dir;
  std::string out;
  bool keep = false;
  bool json = false;
};

int seal(const Options& s) {
  auto recordings = recorder::findRecordings(s.dir);
  if (recordings.empty())
    throw Error(ErrorCode::NotFound, fmt::format("{} holds no recording", s.dir),
                "give the directory passed to the recorder (or a recording-<time>-<pid> directory in it)");
  if (!s.out.empty() && recordings.size() > 1)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{} holds {} recordings; -o names one output", s.dir, recordings.size()),
                "seal them one by one: crashcap seal DIR/recording-... -o OUT");
  json all = json::array();
  for (const auto& r : recordings) {
    recorder::SealOptions so;
    so.out = s.out;
    so.removeRecording = !s.keep;
    so.progress = progressPrinter("sealing");
    auto rep = recorder::sealRecording(r, so);
    endProgress();
    if (s.json) {
      all.push_back({{"recording", r},
                     {"bundle", rep.out},
                     {"state", rep.state},
                     {"records", rep.records},
                     {"tensors", rep.tensors},
                     {"steps", rep.steps},
                     {"first_step", rep.firstStep >= 0 ? json(rep.firstStep) : json(nullptr)},
                     {"last_step", rep.lastStep >= 0 ? json(rep.lastStep) : json(nullptr)},
                     {"begun_step", rep.begunStep >= 0 ? json(rep.begunStep) : json(nullptr)},
                     {"lost", rep.lost},
                     {"bytes", rep.bytes},
                     {"recording_not_removed", rep.notRemoved.empty() ? json(nullptr) : json(rep.notRemoved)}});
    } else {
      std::cout << fmt::format("sealed {} -> {} ({}): {} steps", r, rep.out, rep.state, rep.steps);
      if (rep.steps) std::cout << fmt::format(" ({}..{})", rep.firstStep, rep.lastStep);
      std::cout << fmt::format(", {} tensors, {}\n", rep.tensors, inspect::formatBytes(rep.bytes));
      if (rep.begunStep > rep.lastStep)
        std::cout << fmt::format("  the process was in step {}: its records never reached the disk\n", rep.begunStep);
      for (const auto& l : rep.lost) std::cout << "  lost: " << l << "\n";
      if (!rep.notRemoved.empty())
        std::cout << fmt::format("  the recording is not all removed ({}); the bundle holds it all\n", rep.notRemoved);
      std::cout << fmt::format("next: crashcap inspect {}\n", rep.out);
    }
  }
  if (s.json) printJson({{"sealed", all}});
  return kExitOk;
}

Command sealCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("seal", "Turn a recording left by a killed process (SIGKILL, power loss) into a bundle");
  cmd->add_option("dir", o->dir, "The recorder's output directory, or one recording-<time>-<pid> in it")->required();
  cmd->add_option("-o,--out", o->out, "Output bundle (default: DIR/crash-<time>-<pid>.ccap)");
  cmd->add_flag("--keep", o->keep, "Keep the recording directory after sealing");
  cmd->add_flag("--json", o->json, "Print one JSON object instead of text");
  cmd->footer("Every intact record that reached the disk is copied; what was cut short is listed.\n"
              "Example: crashcap seal runs/ && crashcap inspect runs/crash-*.ccap");
  return {cmd, [o] { return seal(*o); }, &o->json};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(90, crashcap::cli::sealCommand)
