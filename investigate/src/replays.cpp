#include "crashcap/investigate/replays.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <stdlib.h>
#include <unistd.h>

#include <csignal>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/signal_name.hpp"
#include "crashcap/replayer/program_replay.hpp"
#include "crashcap/replayer/replay_json.hpp"
#include "crashcap/supervisor/child_process.hpp"

namespace crashcap::investigate {
namespace {

namespace fs = std::filesystem;

/// The recorded program and where it ran, from a setModel recording that serves replays.
struct RecordedProgram {
  std::vector<std::string> commandLine;
  std::string cwd;
  std::vector<std::string> environment;  ///< NAME=VALUE the program needs again
};

RecordedProgram recordedProgram(const std::string& bundle) {
  auto reader = formats::BundleReader::open(bundle);
  auto view = formats::readRecords(*reader);
  if (!view.program) {
    auto env = reader->environment();
    throw replayer::noStepProgram(bundle, env ? env->fact("python.capture") : "",
                                  env ? env->fact("python.observed.loader") : "");
  }
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
  // A Python program runs again under the interpreter that recorded it, not whichever python3
  // comes first on this PATH (which may lack torch, or be another version).
  if (python && !env->fact("python.executable").empty()) p.commandLine.front() = env->fact("python.executable");
  // And finds its modules (crashcap's among them) where it found them.
  if (python && !env->fact("python.pythonpath").empty()) p.environment.push_back("PYTHONPATH=" + env->fact("python.pythonpath"));
  p.cwd = env->fact("process.cwd");
  if (p.cwd.empty() || p.cwd == "unknown") p.cwd.clear();
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
    std::error_code ec;
    fs::remove_all(path_, ec);
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

replayer::ReplayOutcome runInProgram(const std::string& bundle, replayer::ReplayRequest request) {
  RecordedProgram program = recordedProgram(bundle);
  request.options.allowChangedSources = request.options.allowChangedSources || gAllowChangedSources;
  ScratchDir scratch;
  request.bundle = fs::absolute(bundle).string();
  request.resultPath = scratch.path() + "/result.json";
  const std::string requestPath = scratch.path() + "/request.json";
  {
    std::ofstream out(requestPath);
    out << replayer::toJson(request).dump();
    out.close();
    if (!out) throw Error(ErrorCode::Io, fmt::format("cannot write the replay request {}", requestPath));
  }
  supervisor::ChildProcess::Options options;
  options.environment = program.environment;
  options.environment.push_back(std::string(replayer::kReplayRequestVariable) + "=" + requestPath);
  options.workingDirectory = program.cwd;
  options.dieWithParent = true;  // an experiment's timeout kills this process; the program goes with it
  options.noInput = true;        // a replay never waits for a terminal
  const std::string shown = fmt::format("{}", fmt::join(program.commandLine, " "));
  supervisor::CapturedRun run;
  try {
    run = supervisor::runCaptured(program.commandLine, 1e9, options);
  } catch (Error& e) {
    throw e.with(fmt::format("while starting the recorded program to replay {}", bundle));
  }
  std::ifstream in(request.resultPath);
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
  if (run.exitCode == -SIGKILL)
    // Not the failure in another form: something outside killed it (the kernel's OOM killer, most
    // likely, since every replay starts the whole program again).
    throw Error(ErrorCode::Unsupported,
                fmt::format("the recorded program ({}) was killed (SIGKILL) while it replayed {}: out of memory?{}", shown,
                            bundle, lastLines(run.err, 12)),
                "free memory, or replay on a machine with as much as the training had");
  if (run.exitCode < 0)
    throw ProgramKilled(-run.exitCode,
                        fmt::format("the recorded program ({}) died of {} while it replayed {}{}", shown,
                                    formats::signalName(-run.exitCode), bundle, lastLines(run.err, 12)));
  throw Error(ErrorCode::Unsupported,
              fmt::format("the recorded program ({}, in {}) exited with status {} without replaying{}", shown,
                          program.cwd.empty() ? "this directory" : program.cwd, run.exitCode,
                          lastLines(run.err.empty() ? run.out : run.err, 12)),
              "it must be the program that made the recording, built the same way, and construct its Recorder as "
              "it did then (C++: setModel and setStep; Python: crashcap.Recorder before its training loop)");
}

}  // namespace

void allowChangedSources(bool allow) { gAllowChangedSources = allow; }
bool changedSourcesAllowed() { return gAllowChangedSources; }

std::string replayRoute(const std::string& bundle) {
  auto reader = formats::BundleReader::open(bundle);
  auto view = formats::readRecords(*reader);
  if (view.program && (view.program->format == "module" || view.program->format == "python")) {
    recordedProgram(bundle);  // says what is missing
    return "program";
  }
  return "in-process";
}

replayer::ReplayResult replay(const std::string& bundle, const replayer::ReplayOptions& options) {
  if (replayRoute(bundle) == "in-process") return replayer::replay(bundle, options);
  replayer::ReplayRequest request;
  request.options = options;
  auto outcome = runInProgram(bundle, request);
  if (outcome.error) throw *outcome.error;
  if (!outcome.replay) throw Error(ErrorCode::Corrupt, "the program answered a replay request with no replay");
  return *outcome.replay;
}

replayer::ReferenceComparison compareWithReference(const std::string& bundle, const replayer::ReplayOptions& options,
                                                   double tolerance) {
  if (replayRoute(bundle) == "in-process") return replayer::compareWithReference(bundle, options, tolerance);
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

}  // namespace crashcap::investigate
