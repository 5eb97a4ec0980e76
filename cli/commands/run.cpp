// crashcap run: a training command under supervision, one classified crash bundle per crash.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>

#include "../command.hpp"
#include "../output.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/signal_name.hpp"
#include "crashcap/supervisor/supervisor.hpp"

namespace crashcap::cli {
namespace {

struct Options {
  supervisor::SuperviseOptions supervise;
  bool noTrace = false;
  std::string nonFinite;                 ///< --nonfinite (with --record)
  int64_t keyframeEvery = 0;             ///< --keyframe-every (with --record); 0: the recorder's default
  bool hangGiven = false;                ///< --hang-timeout was given
  std::vector<std::string> afterDashes;  ///< the command, when given after --
  CLI::App* app = nullptr;
};

/// Supervises, then prints one screen per crash saying what happened and what to run next.
/// Exits with the command's status.
int run(Options& r) {
  auto& o = r.supervise;
  // An option crashcap does not know must not be dropped or taken for the command: `--out runs`
  // before -- would leave the bundles where the user did not look.
  std::vector<std::string> extra = r.app->remaining();
  if (!r.afterDashes.empty() && !extra.empty() && extra.front()[0] != '-') {
    // `crashcap run uv run -- python train.py`: the command began before a -- of its own.
    extra.push_back("--");
    extra.insert(extra.end(), r.afterDashes.begin(), r.afterDashes.end());
    r.afterDashes.clear();
  }
  if (!r.afterDashes.empty() && !extra.empty())
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("crashcap run does not know `{}` (before --)", fmt::join(extra, " ")),
                "crashcap run --help lists its options; the command goes after --");
  if (r.afterDashes.empty() && !extra.empty() && extra.front().size() > 1 && extra.front()[0] == '-')
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("crashcap run does not know the option `{}`", extra.front()),
                "crashcap run --help lists its options; put the command after --: crashcap run --record -- python "
                "train.py");
  o.command = r.afterDashes.empty() ? extra : r.afterDashes;
  o.kernelTrace = !r.noTrace;
  if (!o.observePython && (!r.nonFinite.empty() || r.keyframeEvery || o.keepRecording))
    throw Error(ErrorCode::InvalidArgument, "--nonfinite, --keyframe-every and --keep-recording set how --record records",
                "add --record: crashcap run --record --nonfinite record -- python train.py");
  if (o.nproc == 0 && (o.masterPort || r.hangGiven))
    throw Error(ErrorCode::InvalidArgument, "--master-port and --hang-timeout are for a job crashcap run starts",
                "add --nproc N: crashcap run --nproc 2 --hang-timeout 20 -- python train.py");
  if (o.observePython) {
    std::vector<std::string> policy;
    if (!r.nonFinite.empty()) policy.push_back(fmt::format("\"nonfinite\": \"{}\"", r.nonFinite));
    if (r.keyframeEvery) policy.push_back(fmt::format("\"keyframe_every\": {}", r.keyframeEvery));
    // A recording that ends clean is removed: the recorder need not sync it at its close.
    if (!o.keepRecording) policy.push_back("\"keep_recording\": false");
    o.observePolicy = fmt::format("{{{}}}", fmt::join(policy, ", "));
  }
  o.say = [](const std::string& line) { std::cerr << line << "\n"; };
  auto report = supervisor::supervise(o);
  std::string cmd = fmt::format("{}", fmt::join(o.command, " "));
  for (const auto& a : report.attempts) {
    if (a.bundle.empty()) {
      std::cerr << fmt::format("crashcap run: `{}` exited 0 after {:.1f} s (run {})\n", cmd, a.seconds, a.attempt);
      for (const auto& b : a.otherBundles)
        std::cerr << fmt::format("  sealed    {} (a crash the program recorded and went on from)\n", b);
      continue;
    }
    std::cerr << fmt::format("\ncrashcap run: `{}` crashed after {:.1f} s (run {}): {}\n", cmd, a.seconds, a.attempt,
                             a.classification.id);
    std::cerr << fmt::format("  evidence  {}\n", a.classification.evidence);
    const char* signal = a.signal ? formats::signalName(a.signal) : nullptr;
    std::cerr << fmt::format("  ended     {}\n",
                             a.signal ? fmt::format("killed by {}", signal ? signal : std::to_string(a.signal))
                                      : fmt::format("exit status {}", a.exitCode));
    std::cerr << fmt::format("  trace     {}\n", a.trace);
    std::cerr << fmt::format("  bundle    {}\n", a.bundle);
    for (const auto& b : a.otherBundles) std::cerr << fmt::format("  also      {}\n", b);
    bool hasSteps = false, rankOfJob = false;
    try {
      auto reader = formats::BundleReader::open(a.bundle);
      auto records = formats::readRecords(*reader);
      hasSteps = records.program.has_value();
      rankOfJob = records.distributed && records.distributed->worldSize > 1;
    } catch (const Error&) {
      // The summary still names the bundle; `crashcap inspect` says what is wrong with it.
    }
    // A rank of a job (crashcap run --nproc, or a launcher's: torch.multiprocessing.spawn): the
    // story across its ranks first.
    if (rankOfJob) {
      std::cerr << fmt::format("  next      crashcap inspect {}   (the job's story, every rank)\n", o.dir);
      std::cerr << fmt::format("            crashcap merge {} -o job.ccap   (the job in one file, to attach)\n", o.dir);
    }
    std::cerr << fmt::format("  {}crashcap inspect {}\n", rankOfJob ? "          " : "next      ", a.bundle);
    if (a.trace.rfind("recorded", 0) == 0) std::cerr << fmt::format("            crashcap inspect {} --trace\n", a.bundle);
    if (hasSteps) std::cerr << fmt::format("            crashcap triage {}\n", a.bundle);
    for (const auto& rk : a.ranks) {
      const char* sig = rk.signal ? formats::signalName(rk.signal) : nullptr;
      std::string how = rk.stopped ? fmt::format("stopped ({})", sig ? sig : "signal")
                        : rk.signal ? fmt::format("killed by {}", sig ? sig : std::to_string(rk.signal))
                                    : fmt::format("exit {}", rk.exitCode);
      std::cerr << fmt::format("  rank {:<4} {:<22} {:>6.1f} s  {:<18} {}\n", rk.rank, how, rk.seconds,
                               rk.classification.id.empty() ? "ok" : rk.classification.id,
                               rk.rank == a.firstFailedRank ? rk.bundle + "  (failed first)" : rk.bundle);
    }
  }
  if (!report.stoppedBecause.empty()) std::cerr << fmt::format("crashcap run: no more restarts: {}\n", report.stoppedBecause);
  return report.exitStatus();
}

Command runCommand(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto& s = o->supervise;
  auto* cmd = root.add_subcommand("run", "Run a training command under supervision: one crash bundle per crash, classified");
  o->app = cmd;
  cmd->add_option("--dir", s.dir, "Where bundles go (also $CRASHCAP_DIR for an in-process recorder)")->capture_default_str();
  cmd->add_option("--restart", s.restarts, "Restart after a crash up to N times (N+1 runs at most)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-consecutive", s.maxConsecutive,
                  "Stop restarting after K crashes in a row with the same classification (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--backoff", s.backoffSeconds, "Seconds before the first restart; doubles up to 60")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--grace", s.stopGraceSeconds, "After Ctrl-C: seconds until SIGKILL (SIGINT at once, SIGTERM at half)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--nproc", s.nproc,
                  "Start the command N times as the ranks of one torch.distributed job on this machine (RANK, "
                  "LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set as torchrun sets them); each failed rank gets "
                  "its own bundle")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--master-port", s.masterPort, "With --nproc: the rendezvous port (default: a free one)")
      ->check(CLI::Range(1, 65535));
  cmd->add_option("--hang-timeout", s.hangSeconds,
                  "With --nproc: seconds the other ranks have to end on their own once one rank has failed; then "
                  "they are stopped (SIGTERM, SIGKILL after half of --grace) instead of waiting in a collective "
                  "until its timeout")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber)
      ->each([o](const std::string&) { o->hangGiven = true; });
  cmd->add_flag("--blocking", s.launchBlocking, "CUDA_LAUNCH_BLOCKING=1: CUDA errors surface at the failing launch");
  cmd->add_flag("--dsa", s.deviceSideAssertions,
                "TORCH_USE_CUDA_DSA=1: device-side assertion details (needs a PyTorch built with it)");
  cmd->add_flag("--cudnn-log", s.cudnnLog,
                "cuDNN's own API log (CUDNN_LOGLEVEL_DBG=3) into a pipe; the last 256 KiB go into the bundle, so a "
                "CUDNN_STATUS_EXECUTION_FAILED carries the failing call's descriptors and engine. Slows cuDNN calls");
  cmd->add_flag("--record", s.observePython,
                "Record a Python training with no change to it: batches from its DataLoader, weights and optimizer "
                "state from its optimizer, the loss from backward() (docs/PYTHON.md); `crashcap replay` replays it");
  cmd->add_flag("--keep-recording", s.keepRecording,
                "With --record: keep a clean run's recording (for `crashcap seal`); by default it is removed");
  cmd->add_option("--nonfinite", o->nonFinite,
                  "With --record: a NaN/Inf loss or gradient norm seals a bundle and stops the training (raise, the "
                  "default) or is only recorded (record)")
      ->check(CLI::IsMember({"raise", "record"}));
  cmd->add_option("--keyframe-every", o->keyframeEvery,
                  "With --record: a keyframe (weights and optimizer state) every N steps (default: chosen from what a "
                  "keyframe costs, at least every 50 steps; docs/RECORDING.md)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--no-trace", o->noTrace, "Do not inject the kernel tracer (libcrashcap_inject.so via CUDA_INJECTION64_PATH): it costs some µs per CUDA launch, which a training of many small kernels feels (docs/RUN.md)");
  cmd->prefix_command();  // without --, the first word that is not an option starts the command
  cmd->footer("Everything after the options (or after --) is the command. Its output passes through; crashcap's\n"
              "lines go to stderr. Exit status: the command's (128+N when signal N ended it).\n"
              "Classifications: cuda-illegal-instruction, cuda-illegal-address, cuda-device-assert,\n"
              "cudnn-execution-failed, cudnn-error, cuda-oom, cuda-launch-failure, cuda-forked-subprocess,\n"
              "cuda-error, nccl-error, nonfinite-loss, dataloader-worker-died, python-exception, signal,\n"
              "exit-nonzero (docs/RUN.md).\n"
              "Kernel trace: on a machine with a GPU, CUDA loads libcrashcap_inject.so into the command's processes;\n"
              "their kernel launches and first sticky CUDA error go into the bundle (crashcap inspect B --trace).\n"
              "Recording: with --record, a Python training that iterates a torch DataLoader is recorded step by\n"
              "step as crashcap.Recorder would record it; a crash's bundle then replays (crashcap replay B), bisects\n"
              "and triages. What it cannot tell (two optimizers, gradient accumulation, no DataLoader) it says in\n"
              "one warning each, and records what it can.\n"
              "Jobs: with --nproc N the command runs as N ranks; when one fails, the others get --hang-timeout\n"
              "seconds and are then stopped, and every failed or stopped rank's recording is sealed.\n"
              "Example: crashcap run --dir runs --restart 3 --max-consecutive 2 -- python train.py --lr 3e-4\n"
              "         crashcap run --record --dir runs -- python train.py\n"
              "         crashcap run --record --nproc 4 --hang-timeout 20 --dir runs -- python train_ddp.py");
  Command c{cmd, [o] { return run(*o); }};
  c.commandAfterDashes = &o->afterDashes;
  return c;
}

}  // namespace
}  // namespace crashcap::cli

CRASHCAP_COMMAND(100, crashcap::cli::runCommand)
