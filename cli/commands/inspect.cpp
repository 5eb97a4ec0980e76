// crashcap inspect: the story of a recorded run, or with --trace its kernel trace.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/inspect/story.hpp"
#include "crashcap/inspect/trace_report.hpp"
#include "crashcap/recorder/recording_dir.hpp"
#include "crashcap/supervisor/job.hpp"
#include "crashcap/supervisor/job_archive.hpp"

namespace crashcap::cli {
namespace {

struct Options {
  std::string bundle;
  bool trace = false;
  size_t launches = inspect::TraceReportOptions{}.lastLaunches;
  size_t ops = inspect::StoryOptions{}.lastOps;
  ReadOptions read;
};

int inspectTrace(const Options& o, const formats::BundleReader& reader) {
  auto view = formats::readRecords(reader);
  inspect::TraceReportOptions to;
  to.lastLaunches = o.launches;
  if (o.read.json) {
    auto j = inspect::traceJson(view, to);
    j["bundle"] = o.bundle;
    printJson(j);
    return kExitOk;
  }
  std::cout << inspect::traceText(view, to);
  if (!view.kernelTraces.empty() || view.opTrace)
    std::cout << fmt::format("\nnext          crashcap export {} --chrome trace.json   (a time line for "
                             "https://ui.perfetto.dev)\n",
                             o.bundle);
  return kExitOk;
}

/// A directory: the story of the multi-process jobs whose bundles are in it.
int inspectJobs(const Options& o) {
  if (o.trace)
    throw Error(ErrorCode::InvalidArgument, fmt::format("--trace reads one bundle; {} is a directory", o.bundle),
                "give one of its bundles: crashcap inspect DIR lists them per rank");
  auto stories = supervisor::readJobs(o.bundle);
  if (o.read.json) {
    printJson(supervisor::jobsJson(stories));
    return kExitOk;
  }
  std::cout << supervisor::jobsText(stories);
  return kExitOk;
}

/// A job archive (crashcap merge): the story of its job, as of the directory it was merged from.
int inspectArchive(const Options& o) {
  if (o.trace)
    throw Error(ErrorCode::InvalidArgument, fmt::format("--trace reads one bundle; {} is a whole job's archive", o.bundle),
                "crashcap inspect ARCHIVE tells the job's story across its ranks");
  auto job = supervisor::ExtractedJob::extract(o.bundle);
  auto stories = job->stories();
  if (o.read.json) {
    printJson(supervisor::jobsJson(stories));
    return kExitOk;
  }
  std::cout << supervisor::jobsText(stories);
  return kExitOk;
}

int inspectStory(const Options& o) {
  std::error_code ec;
  if (std::filesystem::is_directory(o.bundle, ec) && !recorder::isRecording(o.bundle)) return inspectJobs(o);
  auto reader = formats::BundleReader::open(o.bundle, o.read.limits(), progressPrinter("scanning"));
  endProgress();
  if (o.trace) return inspectTrace(o, *reader);
  inspect::StoryOptions so;
  so.lastOps = o.ops;
  if (o.read.json) {
    printJson(inspect::storyJson(*reader, so));
    return kExitOk;
  }
  std::cout << inspect::storyText(*reader, so);
  // The story has no room for the GPU side; say that there is one and where to read it.
  for (const auto& t : formats::readRecords(*reader).kernelTraces) {
    // The error that poisoned the context is the failure; a soft one may have come first.
    const auto& e = t.stickyError ? t.stickyError : t.firstError;
    std::string error;
    if (e)
      error = fmt::format("; first {}CUDA error {} in {}", t.stickyError ? "sticky " : "",
                          e->name.empty() ? std::to_string(e->code) : e->name, e->api);
    std::cout << fmt::format("trace      pid {}: {}{}  (crashcap inspect {} --trace)\n", t.pid, t.status, error, o.bundle);
  }
  return kExitOk;
}

Command inspectCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("inspect",
                                  "The story of a recorded run: steps, keyframes, the crash, last ops, the failing batch; "
                                  "of a directory: its multi-process jobs across their ranks");
  cmd->add_option("bundle", o->bundle,
                  "Bundle file (crash-*.ccap), or a directory (`crashcap run --nproc N --dir DIR`) or a job archive "
                  "(`crashcap merge`): which rank of each job failed first, at which step, phase and op, and what "
                  "every other rank was doing then. One bundle of an archive: JOB.ccap:crash-....ccap")
      ->required();
  auto* traceFlag = cmd->add_flag("--trace", o->trace,
                                  "The kernel trace instead: per traced process the first CUDA error (kernel, op), the "
                                  "last launches, kernels per op");
  cmd->add_option("--ops", o->ops, "How many of the last ops before the crash to list (the ring holds up to 256 by default)")
      ->capture_default_str();
  cmd->add_option("--launches", o->launches, "With --trace: how many of the last launches to list")
      ->capture_default_str()
      ->needs(traceFlag);
  cmd->footer("Example: crashcap inspect runs/crash-20261121T233427Z-4242.ccap --json | jq .crash\n"
              "         crashcap inspect runs/ --json | jq '.jobs[].headline'   (a job's ranks, one story)\n"
              "         crashcap inspect runs/crash-20261121T233427Z-4242.ccap --trace --launches 50\n"
              "The trace's time line: crashcap export B --chrome trace.json (docs/INSPECT.md).");
  addReadOptions(cmd, o->read);
  return {cmd,
          [o] {
            // A whole archive tells its job's story; one of its members ("JOB.ccap:crash-....ccap"), its own.
            if (supervisor::isJobArchive(o->bundle)) return inspectArchive(*o);
            return onBundleOrJobArchive(o->bundle, [&] { return inspectStory(*o); });
          },
          &o->read.json};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(5, crashcap::cli::inspectCommand)
