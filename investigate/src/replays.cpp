#include "crashcap/investigate/replays.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/directory.hpp"
#include "crashcap/formats/environment_facts.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/signal_name.hpp"
#include "crashcap/replayer/no_steps.hpp"
#include "crashcap/replayer/program_replay.hpp"
#include "crashcap/replayer/replay_json.hpp"
#include "crashcap/supervisor/child_process.hpp"
#include "crashcap/supervisor/job.hpp"
#include "crashcap/supervisor/supervisor.hpp"

namespace crashcap::investigate {
namespace {

namespace fs = std::filesystem;

/// The recorded program and where it ran, from a setModel recording that serves replays.
struct RecordedProgram {
  std::vector<std::string> commandLine;
  std::string cwd;
  std::vector<std::string> environment;  ///< NAME=VALUE the program needs again
  std::string capture;                   ///< python.capture: "observed" (crashcap run --record), "api", "" (C++)
};

RecordedProgram recordedProgram(const std::string& bundle) {
  auto reader = formats::BundleReader::open(bundle);
  auto view = formats::readRecords(*reader);
  if (!view.program) throw replayer::noStepProgram(bundle, *reader, view);
  const bool python = view.program->format == "python";
  if (view.program->format != "module" && !python)
    throw Error(ErrorCode::Internal, fmt::format("{} holds a {} step program, which replays in crashcap", bundle,
                                                 view.program->format));
  if (!view.program->servesReplay)
    throw Error(ErrorCode::Unsupported,
                fmt::format("{} was recorded with Recorder::setModel but without Recorder::setStep, so crashcap "
                            "cannot run its step",
                            bundle),
                "give the Recorder the step's forward and loss with rec.setStep(...) after setModel and record again; "
                "or replay it from C++ with crashcap::replayer::replay(bundle, model, step) (replay_module.hpp)");
  auto env = reader->environment();
  if (!env || env->commandLine.empty())
    throw Error(ErrorCode::Unsupported, fmt::format("{} holds no command line to run its program again", bundle),
                "the environment record is missing (`crashcap inspect` says what the bundle holds)");
  std::vector<std::string> redactedArgs;
  for (const auto& name : env->redacted)
    if (name.rfind("argv[", 0) == 0) redactedArgs.push_back(name);
  if (!redactedArgs.empty())
    throw Error(ErrorCode::Unsupported,
                fmt::format("the recorded command line had {} withheld as secret, so crashcap cannot run it again",
                            fmt::join(redactedArgs, ", ")),
                "pass secrets to the training through the environment or a file, not its arguments");
  RecordedProgram p;
  p.commandLine = env->commandLine;
  if (env->fact("python.launcher") == "torch.multiprocessing.spawn") {
    // Its command line is multiprocessing's (`-c "from multiprocessing.spawn import spawn_main..."`),
    // which reads what to run from a pipe only the parent held; the recording kept what came
    // through it, and crashcap's own module runs the rank's function from that (crashcap/_spawn.py).
    if (env->fact("python.spawn").empty()) {
      const std::string why = env->fact("python.spawn.unrecordable");
      throw Error(ErrorCode::Unsupported,
                  fmt::format("the rank recorded in {} was started by torch.multiprocessing.spawn, and its recording "
                              "could not keep the function it ran{}; so crashcap cannot start it again",
                              bundle, why.empty() ? "" : " (" + why + ")"),
                  "start the ranks with `crashcap run --record --nproc N` or torchrun (the script reading RANK, "
                  "WORLD_SIZE and MASTER_ADDR/MASTER_PORT from its environment) and record again");
    }
    p.commandLine = {"python3", "-m", "crashcap._spawn"};
    p.environment.push_back("CRASHCAP_SPAWN=" + env->fact("python.spawn"));
  }
  // A Python program runs again under the interpreter that recorded it, not whichever python3
  // comes first on this PATH (which may lack torch, or be another version).
  if (python && !env->fact("python.executable").empty()) p.commandLine.front() = env->fact("python.executable");
  // And finds its modules (crashcap's among them) where it found them.
  if (python && !env->fact("python.pythonpath").empty()) p.environment.push_back("PYTHONPATH=" + env->fact("python.pythonpath"));
  p.cwd = env->fact("process.cwd");
  if (p.cwd.empty() || p.cwd == "unknown") p.cwd.clear();
  if (python) p.capture = env->fact("python.capture");
  std::error_code ec;
  if (!p.cwd.empty() && !fs::is_directory(p.cwd, ec))
    throw Error(ErrorCode::NotFound,
                fmt::format("the directory the program ran in, {}, is not here, so crashcap cannot run it again", p.cwd),
                "replay where the training ran, with its program and files where they were");
  const std::string& exe = p.commandLine.front();
  if (exe.find('/') != std::string::npos) {
    fs::path path = fs::path(exe).is_absolute() || p.cwd.empty() ? fs::path(exe) : fs::path(p.cwd) / exe;
    if (!fs::exists(path, ec))
      throw Error(ErrorCode::NotFound,
                  fmt::format("the recorded program {} is not there any more, so crashcap cannot run it again",
                              path.string()),
                  "replay where the training ran, with the program built as it was when it recorded");
  }
  return p;
}

/// A directory of its own for the request and the result, removed when done.
class ScratchDir {
 public:
  ScratchDir() {
    const char* tmp = std::getenv("TMPDIR");
    // Absolute: the program runs in another directory.
    std::string templ = fs::absolute(std::string(tmp && *tmp ? tmp : "/tmp")).string() + "/crashcap-replay-XXXXXX";
    if (!::mkdtemp(templ.data()))
      throw Error(ErrorCode::Io, fmt::format("cannot create a directory for the replay request: {}", std::strerror(errno)));
    path_ = templ;
  }
  ~ScratchDir() {
    formats::removeTree(path_);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string lastLines(const std::string& text, size_t count) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(line);
  if (lines.size() > count) lines.erase(lines.begin(), lines.end() - static_cast<long>(count));
  std::string out;
  for (const auto& l : lines) out += "\n  | " + l;
  return out;
}

bool gAllowChangedSources = false;
double gReplayTimeout = 0;  ///< setReplayTimeout

/// One replay request a recorded program is to serve: its command, and where its answer will be.
struct ProgramRun {
  RecordedProgram program;
  std::unique_ptr<ScratchDir> scratch;
  std::string resultPath;
  std::string progressPath;  ///< ReplayOptions::progressPath
  supervisor::ChildProcess::Options options;
  std::string shown;  ///< the command line, for messages
};

ProgramRun prepareProgramRun(const std::string& bundle, replayer::ReplayRequest request) {
  ProgramRun p;
  p.program = recordedProgram(bundle);
  request.options.allowChangedSources = request.options.allowChangedSources || gAllowChangedSources;
  p.scratch = std::make_unique<ScratchDir>();
  request.bundle = fs::absolute(bundle).string();
  request.resultPath = p.scratch->path() + "/result.json";
  p.resultPath = request.resultPath;
  request.options.progressPath = p.scratch->path() + "/progress";
  p.progressPath = request.options.progressPath;
  const std::string requestPath = p.scratch->path() + "/request.json";
  {
    std::ofstream out(requestPath);
    out << replayer::toJson(request).dump();
    out.close();
    if (!out) throw Error(ErrorCode::Io, fmt::format("cannot write the replay request {}", requestPath));
  }
  p.options.environment = p.program.environment;
  p.options.environment.push_back(std::string(replayer::kReplayRequestVariable) + "=" + requestPath);
  p.options.workingDirectory = p.program.cwd;
  p.options.dieWithParent = true;  // an experiment's timeout kills this process; the program goes with it
  p.options.noInput = true;        // a replay never waits for a terminal
  p.shown = fmt::format("{}", fmt::join(p.program.commandLine, " "));
  return p;
}

/// How far the program's replay got before it ended: nullopt when it cannot say, because its
/// recording does not say that its crashcap writes a progress file (formats::kReplayProgressFact:
/// an older crashcap); otherwise what its progress file says, {-1, -1} when it wrote none (it died
/// before its replay began).
std::optional<replayer::ReplayProgress> replayProgress(const std::string& bundle, const ProgramRun& p) {
  auto env = formats::BundleReader::open(bundle)->environment();
  if (!env || env->fact(formats::kReplayProgressFact) != "1") return std::nullopt;
  return replayer::readReplayProgress(p.progressPath).value_or(replayer::ReplayProgress{});
}

/// A program that died of a signal before it began the first replayed step died in its own
/// set-up (importing, building its model or loader, restoring the keyframe): whatever killed it,
/// not the recorded failure, which happened in a step. Throws that as an Error.
void refuseDeathBeforeSteps(const std::string& bundle, const ProgramRun& p, const supervisor::CapturedRun& run,
                            const std::optional<replayer::ReplayProgress>& progress) {
  if (run.exitCode >= 0 || run.exitCode == -SIGKILL) return;
  if (!progress || progress->step >= 0) return;
  throw Error(ErrorCode::Unsupported,
              fmt::format("the recorded program ({}) died of {} while it replayed {}, before it began the first replayed "
                          "step ({}): in its own set-up, not in the step the recording failed in{}",
                          p.shown, formats::signalName(-run.exitCode), bundle,
                          progress->keyframe >= 0 ? fmt::format("after restoring keyframe {}", progress->keyframe)
                                                  : "before it had restored the keyframe: in its start-up, or while "
                                                    "restoring it",
                          lastLines(run.err.empty() ? run.out : run.err, 12)),
              "run the recorded command as it is here to see where it dies: replay needs the program to reach its "
              "training loop as it did when it recorded");
}

/// The program's answer, once it has ended.
replayer::ReplayOutcome programOutcome(const std::string& bundle, const ProgramRun& p, const supervisor::CapturedRun& run) {
  std::ifstream in(p.resultPath);
  if (in) {
    std::stringstream text;
    text << in.rdbuf();
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text.str());
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCode::Corrupt, fmt::format("the program's replay result is not JSON: {}", e.what()));
    }
    const std::string theirs = j.is_object() && j.contains("crashcap_version") && j["crashcap_version"].is_string()
                                   ? j["crashcap_version"].get<std::string>()
                                   : "an unknown version";
    try {
      return replayer::replayOutcomeFromJson(j);
    } catch (Error& e) {
      if (theirs != formats::toolVersion())
        throw Error(e.code(),
                    fmt::format("{} (the program was built with crashcap {}, this is crashcap {})", e.message(), theirs,
                                formats::toolVersion()),
                    "rebuild the training against this crashcap, or replay with the crashcap it was built with");
      throw;
    }
  }
  if (run.timedOut)
    throw Error(ErrorCode::LimitExceeded,
                fmt::format("the recorded program ({}) had not answered {} s after it was started to replay {}, and "
                            "was stopped (--timeout){}",
                            p.shown, gReplayTimeout, bundle, lastLines(run.err.empty() ? run.out : run.err, 12)),
                "a replay that waits where the training hung shows the hang; for a program that is only slow, "
                "raise --timeout");
  if (run.exitCode == -SIGKILL)
    // Not the failure in another form: something outside killed it (the kernel's OOM killer, most
    // likely, since every replay starts the whole program again).
    throw Error(ErrorCode::Unsupported,
                fmt::format("the recorded program ({}) was killed (SIGKILL) while it replayed {}: out of memory?{}", p.shown,
                            bundle, lastLines(run.err, 12)),
                "free memory, or replay on a machine with as much as the training had");
  if (run.exitCode < 0) {
    const auto said = replayProgress(bundle, p);
    refuseDeathBeforeSteps(bundle, p, run, said);
    const auto progress = said.value_or(replayer::ReplayProgress{});
    throw ProgramKilled(-run.exitCode,
                        fmt::format("the recorded program ({}) died of {} while it replayed {}{}{}", p.shown,
                                    formats::signalName(-run.exitCode), bundle,
                                    progress.step >= 0 ? fmt::format(", in step {}", progress.step) : "",
                                    lastLines(run.err, 12)),
                        progress);
  }
  throw Error(ErrorCode::Unsupported,
              fmt::format("the recorded program ({}, in {}) exited with status {} without replaying{}", p.shown,
                          p.program.cwd.empty() ? "this directory" : p.program.cwd, run.exitCode,
                          lastLines(run.err.empty() ? run.out : run.err, 12)),
              p.program.capture == "observed"
                  ? "it must be the program that made the recording, with the files it read where they were: "
                    "crashcap run --record replays it from its training's DataLoader"
                  : "it must be the program that made the recording, built the same way, and construct its Recorder "
                    "as it did then (C++: setModel and setStep; Python: crashcap.Recorder before its training loop)");
}

replayer::ReplayOutcome runInProgram(const std::string& bundle, replayer::ReplayRequest request) {
  ProgramRun p = prepareProgramRun(bundle, std::move(request));
  supervisor::CapturedRun run;
  try {
    run = supervisor::runCaptured(p.program.commandLine, gReplayTimeout > 0 ? gReplayTimeout : 1e9, p.options);
  } catch (Error& e) {
    throw e.with(fmt::format("while starting the recorded program to replay {}", bundle));
  }
  return programOutcome(bundle, p, run);
}

/// A recorded program whose replay died of the very signal its recording died of (a segfault in
/// native code, a signal its own loop sends): the failure, again. Nothing in the process could
/// answer, so only the failure is compared, as for a rank of a job. nullopt when the recording
/// did not die of that signal: then the signal is the failure in another form, and the caller
/// ends as the program did.
std::optional<replayer::ReplayResult> killedAgain(const std::string& bundle, const replayer::ReplayOptions& options,
                                                  const ProgramKilled& killed) {
  auto reader = formats::BundleReader::open(bundle);
  auto view = formats::readRecords(*reader);
  if (!view.crash || view.crash->kind != "signal" || view.crash->signal != killed.signal()) return std::nullopt;
  replayer::ReplayResult r;
  r.verdict = replayer::Verdict::Reproduced;
  r.step = options.step >= 0 ? options.step : view.crash->step;
  // The keyframe the program starts from, as it picks one: the asked, else the newest (or, for a
  // bisection, the earliest) at or before the target.
  // (The program says which when it can: its progress file. Else as the program picks one.)
  std::vector<int64_t> keyframes;
  for (const auto& k : view.keyframes)
    if (k.step <= r.step) keyframes.push_back(k.step);
  std::sort(keyframes.begin(), keyframes.end());
  const auto& progress = killed.progress();
  if (progress.keyframe >= 0) r.keyframe = progress.keyframe;
  else if (options.keyframe >= 0) r.keyframe = options.keyframe;
  else if (!keyframes.empty()) r.keyframe = options.fromEarliestKeyframe ? keyframes.front() : keyframes.back();
  if (progress.step >= 0) r.diedInStep = progress.step;
  r.recordedError = view.crash->error;
  r.error = fmt::format("killed by {} again, as in the recording", formats::signalName(killed.signal()));
  r.sameSetup = false;  // nothing was compared but the failure
  r.rows = options.rows;
  // The target's rows, as a replay that answers says them: a sample bisection cuts them.
  for (const auto& b : view.stepBegins)
    if (b.step == r.step) r.batchSize = formats::batchRows(b, *reader).count;
  // Where the program replayed: the asked device, else the recorded one when this machine has it.
  r.recordedDevice = view.program ? view.program->device : "";
  const auto here = replayer::availableDevices();
  r.device = !options.device.empty() ? options.device
             : std::find(here.begin(), here.end(), r.recordedDevice) != here.end() ? r.recordedDevice
                                                                                  : "cpu";
  const std::string what = killed.what();
  const size_t outputAt = what.find('\n');  // the program's last lines, after the message
  const std::string where = r.diedInStep ? fmt::format("in step {}", *r.diedInStep) : "";
  r.notes.push_back(fmt::format("the program died of {} while it replayed (from keyframe {} towards step {}){}, as the "
                                "recording did: nothing in the process could write its steps, so only the failure "
                                "is compared, not where in the step it came{}",
                                formats::signalName(killed.signal()), r.keyframe, r.step,
                                where.empty() ? "" : ", " + where,
                                outputAt == std::string::npos ? std::string() : what.substr(outputAt)));
  if (r.diedInStep && view.crash->step >= 0 && *r.diedInStep != view.crash->step)
    r.notes.push_back(fmt::format("the replay died in step {}, the recording in step {}: the failure came back at "
                                  "another step{}",
                                  *r.diedInStep, view.crash->step,
                                  *r.diedInStep < view.crash->step
                                      ? ", one the recording ran through (it depends on more than the recorded state: "
                                        "memory layout, threads, a device)"
                                      : ""));
  return r;
}

}  // namespace

void allowChangedSources(bool allow) { gAllowChangedSources = allow; }
bool changedSourcesAllowed() { return gAllowChangedSources; }
void setReplayTimeout(double seconds) { gReplayTimeout = seconds > 0 ? seconds : 0; }

std::string replayRoute(const std::string& bundle) {
  auto reader = formats::BundleReader::open(bundle);
  auto view = formats::readRecords(*reader);
  if (view.distributed && view.distributed->worldSize > 1) {
    // Replayed alone, its program would wait in init_process_group or in its first collective for
    // peers that are not there: its ranks replay together, each in its recorded program.
    if (view.program && view.program->format != "module" && view.program->format != "python")
      throw Error(ErrorCode::Unsupported,
                  fmt::format("{} is rank {} of a {}-rank job with a {} step program: crashcap replays a job's ranks "
                              "in their recorded programs, which serve the replay (setModel and setStep, or "
                              "crashcap.Recorder in Python)",
                              bundle, view.distributed->rank, view.distributed->worldSize, view.program->format));
    recordedProgram(bundle);  // says what is missing
    return "job";
  }
  if (view.program && (view.program->format == "module" || view.program->format == "python")) {
    recordedProgram(bundle);  // says what is missing
    return "program";
  }
  return "in-process";
}

namespace {

replayer::ReplayResult replayByRoute(const std::string& bundle, const std::string& route,
                                     const replayer::ReplayOptions& options) {
  if (route == "in-process") return replayer::replay(bundle, options);
  if (route == "job") return askedRankReplay(replayJob(bundle, options));
  replayer::ReplayRequest request;
  request.options = options;
  replayer::ReplayOutcome outcome;
  try {
    outcome = runInProgram(bundle, request);
  } catch (const ProgramKilled& killed) {
    if (auto again = killedAgain(bundle, options, killed)) return *again;
    throw;
  }
  if (outcome.error) throw *outcome.error;
  if (!outcome.replay) throw Error(ErrorCode::Corrupt, "the program answered a replay request with no replay");
  return *outcome.replay;
}

}  // namespace

std::optional<int64_t> keyframeToTryInstead(const std::string& bundle, const replayer::ReplayOptions& options,
                                            const replayer::ReplayResult& r) {
  if (!r.divergedAt || options.keyframe >= 0 || options.fromEarliestKeyframe) return std::nullopt;
  // A TorchScript step program keeps no state between steps that its keyframe does not hold: a
  // departure there is the computation's own. A job's ranks replay from the keyframe they all hold.
  try {
    if (replayRoute(bundle) != "program") return std::nullopt;
  } catch (const Error&) {
    return std::nullopt;
  }
  try {
    auto view = formats::readRecords(*formats::BundleReader::open(bundle));
    std::optional<int64_t> earliest;
    for (const auto& k : view.keyframes)
      if (k.step < r.keyframe && (!earliest || k.step < *earliest)) earliest = k.step;
    return earliest;
  } catch (const Error&) {
    return std::nullopt;  // the replay that ran read it: nothing to try
  }
}

bool runsFurther(const replayer::ReplayResult& earlier, const replayer::ReplayResult& newer) {
  if (!newer.divergedAt || earlier.keyframe >= newer.keyframe) return false;
  if (earlier.divergedAt) return false;  // it departs too: nothing says the newer keyframe was the cause
  for (const auto& s : earlier.steps)
    if (s.step == *newer.divergedAt) return s.recorded && s.bitwise;
  return false;  // it never reached that step
}

replayer::ReplayResult replay(const std::string& bundle, const replayer::ReplayOptions& options) {
  const std::string route = replayRoute(bundle);
  auto run = [&](const replayer::ReplayOptions& o) { return replayByRoute(bundle, route, o); };
  return fromEarlierKeyframeIfItRunsFurther(bundle, options, run(options), run,
                                            [](replayer::ReplayResult& r) -> replayer::ReplayResult& { return r; });
}

replayer::ReferenceComparison compareWithReference(const std::string& bundle, const replayer::ReplayOptions& options,
                                                   double tolerance) {
  const std::string route = replayRoute(bundle);
  if (route == "in-process") return replayer::compareWithReference(bundle, options, tolerance);
  if (route == "job") {
    // The float64 reference would need every rank's reference run together, its all-reduces in
    // float64 too, and the two sides' ops matched rank by rank. Under DistributedDataParallel it
    // cannot be had by turning the model to float64 when the replay begins: the program built DDP
    // before, its gradient buckets keep the dtype of then, and the all-reduce no longer reaches
    // float64 gradients (torch 1.13: each rank keeps its own, silently).
    auto view = formats::readRecords(*formats::BundleReader::open(bundle));
    throw Error(ErrorCode::Unsupported,
                fmt::format("{} is rank {} of a {}-rank job: comparing its ops with a float64 replay is not built for "
                            "a job's ranks (under DistributedDataParallel it cannot be: DDP's gradient buckets keep the "
                            "dtype the program built them with, and its all-reduce does not reach float64 gradients)",
                            bundle, view.distributed->rank, view.distributed->worldSize),
                "crashcap replay " + bundle + " names the first op with a non-finite output on every rank");
  }
  replayer::ReplayRequest request;
  request.options = options;
  request.compare = true;
  request.tolerance = tolerance;
  auto ask = [&](replayer::ReplayRequest r) {
    auto outcome = runInProgram(bundle, std::move(r));
    if (outcome.error) throw *outcome.error;
    if (!outcome.comparison)
      throw Error(ErrorCode::Corrupt, "the program answered an ops bisection request with no comparison");
    return *outcome.comparison;
  };
  if (formats::readRecords(*formats::BundleReader::open(bundle)).program->format != "python") return ask(request);
  // A Python program's loop runs once per process: the reference in one, the replay compared
  // with it in another, the reference's op outputs handed over in a file.
  ScratchDir scratch;
  request.referenceOutputs = scratch.path() + "/reference-outputs.pt";
  request.side = replayer::ComparisonSide::Reference;
  replayer::ReferenceComparison reference = ask(request);
  request.side = replayer::ComparisonSide::Replay;
  replayer::ReferenceComparison c = ask(request);
  c.reference = std::move(reference.reference);
  return c;
}

bool isJobRank(const std::string& bundle) {
  auto view = formats::readRecords(*formats::BundleReader::open(bundle));
  return view.distributed && view.distributed->worldSize > 1;
}

JobReplay replayJob(const std::string& bundle, const replayer::ReplayOptions& options, double hangSeconds) {
  auto view = formats::readRecords(*formats::BundleReader::open(bundle));
  if (!view.distributed || view.distributed->worldSize <= 1)
    throw Error(ErrorCode::InvalidArgument, fmt::format("{} is no rank of a multi-process job", bundle));
  const auto& d = *view.distributed;
  const std::string dir = fs::absolute(bundle).parent_path().string();
  auto stories = supervisor::readJobs(dir);
  const supervisor::Job* job = nullptr;
  for (const auto& j : stories.jobs)
    if (j.jobId == d.jobId) job = &j;
  if (!job) throw Error(ErrorCode::NotFound, fmt::format("no job {} in {}", d.jobId, dir));
  JobReplay out;
  out.jobId = d.jobId;
  out.worldSize = d.worldSize;
  out.rank = d.rank;
  // Every rank, from its own bundle: the collectives need them all. The bundle asked for is its
  // rank's, whatever else of that rank the directory holds.
  std::vector<std::string> missing;
  std::vector<const supervisor::JobRank*> recorded;  // beside out.ranks
  std::optional<supervisor::JobRank> asked;
  for (int r = 0; r < d.worldSize; ++r) {
    auto it = std::find_if(job->ranks.begin(), job->ranks.end(), [&](const supervisor::JobRank& x) { return x.rank == r; });
    if (it == job->ranks.end()) {
      missing.push_back(fmt::format("rank {} (no bundle)", r));
    } else if (it->bundle.empty()) {
      missing.push_back(fmt::format("rank {} ({}: its recording was not kept)", r, it->how));
    } else {
      const std::string path = r == d.rank ? fs::absolute(bundle).string() : it->bundle;
      if (path != it->bundle) {  // an older bundle of its rank: its own steps and keyframes
        asked = *it;
        asked->bundle = path;
        asked->steps.clear();
        for (const auto& b : view.stepBegins) asked->steps.push_back(b.step);
        std::sort(asked->steps.begin(), asked->steps.end());
        asked->keyframes.clear();
        for (const auto& k : view.keyframes) asked->keyframes.push_back(k.step);
        asked->lostSteps = formats::lostSteps(view);
      }
      out.ranks.push_back({r, path, std::nullopt, "", "", std::nullopt});
      recorded.push_back(path == it->bundle ? &*it : &*asked);
    }
  }
  if (!missing.empty())
    throw Error(ErrorCode::NotFound,
                fmt::format("the {} ranks of job {} replay together, each from its own recorded batches and keyframe, "
                            "and {} {} not in {}: {}",
                            d.worldSize, d.jobId, missing.size(), missing.size() == 1 ? "is" : "are", dir,
                            fmt::join(missing, ", ")),
                "put every rank's bundle into one directory (crashcap run --nproc N --dir DIR does; --keep-recording "
                "keeps the recordings of ranks that end cleanly, to seal with crashcap seal)");
  // In float64, a DistributedDataParallel model's all-reduce no longer reaches its gradients: the
  // buckets DDP built keep the dtype of then, and each rank silently keeps its own gradients
  // (torch 1.13, measured), so every verdict would be the replay's own doing.
  if (options.dtype == "float64")
    for (const auto& r : out.ranks) {
      auto env = formats::BundleReader::open(r.bundle)->environment();
      if (env && env->fact("python.observed.model").find("DistributedDataParallel") != std::string::npos)
        throw Error(ErrorCode::Unsupported,
                    fmt::format("rank {} of job {} trains a DistributedDataParallel model, whose gradient buckets keep "
                                "the dtype the program built it with: in float64 its all-reduce would no longer reach "
                                "the gradients, each rank keeping its own, and the verdicts would be the replay's doing",
                                r.rank, d.jobId),
                    "replay the job as recorded (without --dtype): it names each rank's first op with a non-finite output");
    }
  // One target step and one keyframe for all: the one they all hold.
  out.step = options.step >= 0 ? options.step
             : view.crash && view.crash->step >= 0 ? view.crash->step
             : view.stepBegins.empty() ? -1
                                       : view.stepBegins.back().step;
  if (out.step < 0) throw Error(ErrorCode::NotFound, fmt::format("{} holds no recorded steps", bundle));
  for (const auto& r : job->ranks)
    if (r.rank == d.rank && options.step < 0 && r.step > out.step)
      out.notes.push_back(fmt::format("rank {} was in step {} when it ended ({}), but that step's batch is not in its "
                                      "bundle (the process died before the recorder's writer got to it): the replay "
                                      "ends at step {}, the last its bundle holds",
                                      r.rank, r.step, r.how, out.step));
  // Every rank must reach the target through steps its bundle holds: a rank that stops early
  // would leave the others waiting in a collective.
  for (const auto* r : recorded) {
    if (!std::binary_search(r->steps.begin(), r->steps.end(), out.step))
      throw Error(ErrorCode::NotFound,
                  fmt::format("rank {}'s bundle does not hold step {} ({}), so the ranks cannot replay to it together",
                              r->rank, out.step,
                              r->steps.empty() ? std::string("it holds no steps")
                                               : fmt::format("it holds steps {}..{}", r->steps.front(), r->steps.back())),
                  "replay an earlier step of the job with --step");
    for (int64_t lost : r->lostSteps)
      if (lost <= out.step)
        out.notes.push_back(fmt::format("rank {}'s recording lost step {}: a replay window that holds it stops before it",
                                        r->rank, lost));
  }
  std::vector<int64_t> common;
  std::string held;
  for (size_t i = 0; i < out.ranks.size(); ++i) {
    std::vector<int64_t> mine;
    for (int64_t k : recorded[i]->keyframes)
      if (k <= out.step) mine.push_back(k);
    std::sort(mine.begin(), mine.end());
    held += fmt::format("{}rank {}: {}", held.empty() ? "" : "; ", out.ranks[i].rank,
                        mine.empty() ? std::string("none") : fmt::format("{}", fmt::join(mine, ", ")));
    if (i == 0) {
      common = mine;
    } else {
      std::vector<int64_t> both;
      std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(), std::back_inserter(both));
      common = both;
    }
  }
  if (options.keyframe >= 0) {
    if (!std::binary_search(common.begin(), common.end(), options.keyframe))
      throw Error(ErrorCode::NotFound,
                  fmt::format("not every rank holds a keyframe at step {} (keyframes at or before step {}: {})",
                              options.keyframe, out.step, held));
    out.keyframe = options.keyframe;
  } else if (common.empty()) {
    throw Error(ErrorCode::NotFound,
                fmt::format("the ranks of job {} hold no keyframe of one step at or before step {} ({}), so they cannot "
                            "start from one state together",
                            d.jobId, out.step, held),
                "record every rank with the same keyframe policy (crashcap run --record does)");
  } else {
    out.keyframe = options.fromEarliestKeyframe ? common.front() : common.back();
  }
  if (!options.rows.empty())
    out.notes.push_back(fmt::format("rank {} kept rows [{}] of step {}'s batch; every other rank its whole batch", d.rank,
                                    fmt::join(options.rows, ","), out.step));
  // The ranks, started together on this machine as a launcher would, each serving its own request.
  const int port = supervisor::freePort();
  std::vector<ProgramRun> programs;
  std::vector<supervisor::TogetherCommand> commands;
  for (const auto& r : out.ranks) {
    replayer::ReplayRequest request;
    request.options = options;
    request.options.step = out.step;
    request.options.keyframe = out.keyframe;
    if (r.rank != d.rank) {  // the rows and a keyframe to write are the asked rank's
      request.options.rows.clear();
      request.options.keyframeOut.clear();
    }
    ProgramRun p = prepareProgramRun(r.bundle, request);
    for (const auto& v : {fmt::format("RANK={}", r.rank), fmt::format("LOCAL_RANK={}", r.rank),
                          fmt::format("WORLD_SIZE={}", d.worldSize), fmt::format("LOCAL_WORLD_SIZE={}", d.worldSize),
                          std::string("GROUP_RANK=0"), std::string("MASTER_ADDR=127.0.0.1"),
                          fmt::format("MASTER_PORT={}", port)})
      p.options.environment.push_back(v);
    p.options.ownProcessGroup = true;  // a stop reaches the rank's DataLoader workers too
    commands.push_back({p.program.commandLine, p.options});
    programs.push_back(std::move(p));
  }
  std::vector<supervisor::CapturedRun> runs;
  try {
    runs = supervisor::runTogether(commands, hangSeconds, gReplayTimeout);
  } catch (Error& e) {
    throw e.with(fmt::format("while starting the ranks of job {} to replay them", d.jobId));
  }
  const bool anyRankEnded =
      std::any_of(runs.begin(), runs.end(), [](const supervisor::CapturedRun& x) { return !x.timedOut; });
  const char* waitedForNoPeer = "waited for something no peer did (a collective, a barrier) or hung on its own";
  for (size_t i = 0; i < out.ranks.size(); ++i) {
    auto& r = out.ranks[i];
    const supervisor::JobRank& was = *recorded[i];
    // A rank crashcap run stopped (SIGKILL after its SIGTERM) did not fail of that signal.
    const int recordedSignal = was.outcome == "failed" ? was.signal : 0;
    // A rank stopped after it wrote its answer (it hung on its way out) is judged by the answer.
    const bool answered = fs::exists(programs[i].resultPath);
    // Where a rank that was stopped or died without an answer was: the step it had begun.
    const auto progress = replayProgress(r.bundle, programs[i]);
    const bool inStep = progress && progress->step >= 0;
    const std::string where = inStep ? fmt::format(" in step {}", progress->step) : std::string();
    const std::string recordedWhere = was.step >= 0 ? fmt::format(" in step {}", was.step) : std::string();
    if ((runs[i].pastDeadline || runs[i].timedOut) && !answered && inStep) r.stoppedInStep = progress->step;
    // Stopped at --timeout without an answer. After a peer ended, a rank crashcap run had stopped in
    // the recording hangs again; with no rank ended, whatever they wait for is not what was recorded.
    if (runs[i].pastDeadline && !answered) {
      if (anyRankEnded && was.outcome == "stopped") {
        r.verdict = "reproduced";
        r.error = fmt::format("had not ended when the replay's --timeout of {} s came, after another rank's replay "
                              "ended, as in the recording (where crashcap run stopped it{}): stopped{}, so only the "
                              "hang is compared{}",
                              gReplayTimeout, recordedWhere, where, lastLines(runs[i].err, 4));
      } else {
        r.error = fmt::format("rank {} had not ended {} s after the job's replay began, and was stopped{} (--timeout): {}{}{}",
                              r.rank, gReplayTimeout, where,
                              anyRankEnded ? "it " : "no rank ended, so every one ", waitedForNoPeer,
                              lastLines(runs[i].err, 6));
      }
      continue;
    }
    // Died of the signal the recorded rank died of: the failure, again (the process could not answer).
    // Not when it died before its first replayed step: that is its set-up (programOutcome says so).
    if (!runs[i].timedOut && recordedSignal && runs[i].exitCode < 0 && -runs[i].exitCode == recordedSignal &&
        !(progress && progress->step < 0)) {
      r.verdict = "reproduced";
      r.error = fmt::format("killed by {} again{}, as in the recording: nothing in the process could write its "
                            "steps, so only the failure is compared{}",
                            formats::signalName(recordedSignal), where, lastLines(runs[i].err, 4));
      if (inStep) r.diedInStep = progress->step;
      continue;
    }
    // Still running long after a peer ended, as in the recording, where crashcap run stopped it: the
    // hang, again.
    if (runs[i].timedOut && !answered && was.outcome == "stopped") {
      r.verdict = "reproduced";
      r.error = fmt::format("had not ended {:.0f} s after another rank's replay ended, as in the recording (where "
                            "crashcap run stopped it{}): stopped again{}, so only the hang is compared{}",
                            hangSeconds, recordedWhere, where, lastLines(runs[i].err, 4));
      continue;
    }
    try {
      if (runs[i].timedOut && !answered)
        throw Error(ErrorCode::Unsupported,
                    fmt::format("rank {} had not ended {:.0f} s after another rank's replay ended, and was stopped{}: "
                                "it {}{}",
                                r.rank, hangSeconds, where, waitedForNoPeer, lastLines(runs[i].err, 6)));
      auto outcome = programOutcome(r.bundle, programs[i], runs[i]);
      if (outcome.error) throw *outcome.error;
      if (!outcome.replay) throw Error(ErrorCode::Corrupt, "the program answered a replay request with no replay");
      r.result = std::move(*outcome.replay);
      // Stopped in the recording after another rank failed (by crashcap run, or by a launcher that
      // stops the rest of its ranks when one exits), or failed there of a peer going away, it ends
      // at the same step when a peer goes away: the same consequence of the other rank's failure,
      // which is all there is to compare. The transport's words for it are not (another port, a
      // reset instead of a close, depending on which end noticed first).
      const bool peerEnded = was.outcome == "stopped" || (was.outcome == "failed" && was.fromPeer &&
                                                           supervisor::isPeerError(r.result->recordedError));
      if (peerEnded && anyRankEnded && r.result->verdict == replayer::Verdict::NotReproduced &&
          !r.result->divergedAt && supervisor::isPeerError(r.result->error)) {
        r.result->verdict = replayer::Verdict::Reproduced;
        auto& notes = r.result->notes;  // the replayer's "not the recorded failure" is answered here
        notes.erase(std::remove_if(notes.begin(), notes.end(),
                                   [](const std::string& n) {
                                     return n.find("raised another error than the recorded one") != std::string::npos;
                                   }),
                    notes.end());
        notes.push_back(
            was.outcome == "stopped"
                ? fmt::format("it was stopped in the recording after another rank failed ({}); here it ended when a "
                              "peer went away, as a rank does once another has failed: only that is compared",
                              r.result->recordedError.empty() ? "no error of its own"
                                                              : lastLine(r.result->recordedError))
                : fmt::format("it failed in the recording when a peer went away ({}), and did again here (the "
                              "transport words it differently): only that is compared",
                              lastLine(r.result->recordedError)));
      }
      r.verdict = replayer::verdictName(r.result->verdict);
    } catch (const Error& e) {
      r.error = e.message() + (e.hint().empty() ? "" : " (" + e.hint() + ")");
    } catch (const ProgramKilled& e) {
      r.error = e.what();
    }
  }
  return out;
}

replayer::ReplayResult askedRankReplay(const JobReplay& job) {
  auto it = std::find_if(job.ranks.begin(), job.ranks.end(), [&](const RankReplay& r) { return r.rank == job.rank; });
  if (it == job.ranks.end())
    throw Error(ErrorCode::Internal, fmt::format("the replay of job {} has no rank {}", job.jobId, job.rank));
  std::vector<std::string> others;
  for (const auto& r : job.ranks)
    if (r.rank != job.rank)
      others.push_back(fmt::format("rank {} {}", r.rank, r.verdict.empty() ? "gave no replay" : r.verdict));
  std::vector<std::string> notes = job.notes;
  notes.push_back(fmt::format("replayed with the {} ranks of job {}: {}", job.worldSize, job.jobId, fmt::join(others, ", ")));
  replayer::ReplayResult out;
  if (it->result) {
    out = *it->result;
  } else if (it->verdict == "reproduced") {
    out.verdict = replayer::Verdict::Reproduced;
    out.step = job.step;
    out.keyframe = job.keyframe;
    out.error = it->error;
    out.diedInStep = it->diedInStep;
    out.stoppedInStep = it->stoppedInStep;
    out.sameSetup = false;  // nothing was compared but the failure
    // The target's rows, as an answering replay says them: a sample bisection cuts the rank's rows.
    try {
      auto reader = formats::BundleReader::open(it->bundle);
      for (const auto& b : formats::readRecords(*reader).stepBegins)
        if (b.step == job.step) out.batchSize = formats::batchRows(b, *reader).count;
    } catch (const Error&) {
      // Its bundle cannot be read here (a job's replay read from another machine's JSON): no rows.
    }
  } else {
    throw Error(ErrorCode::Unsupported,
                fmt::format("rank {}'s replay within its job gave no result: {}", job.rank, it->error));
  }
  out.notes.insert(out.notes.begin(), notes.begin(), notes.end());
  return out;
}

JobRankOrigin jobRankOrigin(const std::string& bundle) {
  auto view = formats::readRecords(*formats::BundleReader::open(bundle));
  if (!view.distributed || view.distributed->worldSize <= 1)
    throw Error(ErrorCode::InvalidArgument, fmt::format("{} is no rank of a multi-process job", bundle));
  JobRankOrigin o;
  o.rank = view.distributed->rank;
  o.worldSize = view.distributed->worldSize;
  o.jobId = view.distributed->jobId;
  auto stories = supervisor::readJobs(fs::absolute(bundle).parent_path().string());
  for (const auto& j : stories.jobs) {
    if (j.jobId != o.jobId) continue;
    for (const auto& r : j.ranks) {
      // A rank crashcap run stopped after another failed ended because of it too.
      if (r.rank == o.rank)
        o.fromPeer = r.fromPeer || (r.outcome == "stopped" && j.firstFailed >= 0 && j.firstFailed != r.rank);
      // A first failure that itself came from a peer (no rank failed on its own) names no cause.
      if (r.rank == j.firstFailed && !r.fromPeer) {
        o.firstFailed = r.rank;
        o.firstFailedBundle = r.rank == o.rank ? fs::absolute(bundle).string() : r.bundle;
      }
    }
  }
  return o;
}

}  // namespace crashcap::investigate
