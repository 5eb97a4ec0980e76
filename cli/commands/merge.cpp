// crashcap merge: every file of one multi-process job in one archive, to attach or move whole.
#include <fmt/format.h>

#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "crashcap/supervisor/job_archive.hpp"

namespace crashcap::cli {
namespace {

struct Options {
  supervisor::MergeOptions merge;
  bool json = false;
};

std::string sizeText(uint64_t bytes) {
  if (bytes >= (1ull << 20)) return fmt::format("{:.1f} MiB", double(bytes) / double(1ull << 20));
  if (bytes >= (1ull << 10)) return fmt::format("{:.1f} KiB", double(bytes) / double(1ull << 10));
  return fmt::format("{} bytes", bytes);
}

Command mergeCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* cmd = root.add_subcommand("merge", "One job's ranks in one file: every rank's bundle and its run log lines");
  cmd->add_option("dir", o->merge.dir, "The directory the job's ranks were recorded into (crashcap run --dir)")->required();
  cmd->add_option("-o,--out", o->merge.out, "The archive to write (JOB.ccap)")->required();
  cmd->add_option("--job", o->merge.jobId, "The job to keep when DIR holds several (its id, as crashcap inspect DIR shows it)");
  cmd->add_flag("--force", o->merge.overwrite, "Replace the archive when it exists");
  cmd->add_flag("--json", o->json, "Print JSON: {\"out\", \"job_id\", \"world_size\", \"first_failed\", \"headline\", "
                                   "\"members\", \"member_bytes\", \"archive_bytes\", \"missing\"}");
  cmd->footer(
      "A job's ranks each seal a bundle of their own; replaying, triaging or telling the job's story needs them\n"
      "all, side by side. merge puts them into one file, byte for byte (each checked by its checksums when it is\n"
      "read back), with the job's lines of runs.jsonl and its story as it was told here. The archive is a bundle:\n"
      "crashcap verify checks it and crashcap info lists it, and inspect, replay, triage, bisect and report take\n"
      "it as they take a rank's bundle. They start from the rank that failed first and replay every rank.\n"
      "Example: crashcap run --record --nproc 2 --dir runs -- python train.py\n"
      "         crashcap merge runs -o job.ccap && crashcap inspect job.ccap && crashcap replay job.ccap");
  return {cmd, [o] {
            auto r = supervisor::mergeJob(o->merge);
            if (o->json) {
              printJson(supervisor::toJson(r));
              return kExitOk;
            }
            std::cout << fmt::format("wrote {} ({}): job {}, {} rank{}, {} file{} ({})\n", r.out, sizeText(r.archiveBytes),
                                     r.jobId, r.worldSize, r.worldSize == 1 ? "" : "s", r.members.size(),
                                     r.members.size() == 1 ? "" : "s", sizeText(r.memberBytes));
            for (const auto& m : r.members) std::cout << fmt::format("  {}\n", m);
            std::cout << fmt::format("story     {}\n", r.headline);
            if (!r.missing.empty())
              std::cout << fmt::format("missing   rank{} {}: nothing of {} was in {}, so the archive lacks {} too\n",
                                       r.missing.size() == 1 ? "" : "s", fmt::join(r.missing, ", "),
                                       r.missing.size() == 1 ? "it" : "them", o->merge.dir,
                                       r.missing.size() == 1 ? "it" : "them");
            std::cout << fmt::format("next      crashcap inspect {}\n          crashcap replay {}\n", r.out, r.out);
            return kExitOk;
          },
          &o->json};
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(107, crashcap::cli::mergeCommand)
