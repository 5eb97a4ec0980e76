#pragma once
// A child process with its stdout and stderr on pipes: the one fork/exec/poll loop of crashcap.
// `crashcap run` pumps it to pass the output through while keeping tails; investigations run
// experiments to completion with a timeout (runCaptured).

#include <poll.h>
#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace crashcap::supervisor {

/// A started child. Move-only; destroying one that still runs kills it (SIGKILL) and reaps it.
/// Not thread-safe.
class ChildProcess {
 public:
  struct Options {
    /// NAME=VALUE entries that replace or extend the inherited environment.
    std::vector<std::string> environment;
    /// The child leads a process group of its own, and signal() reaches the whole group (its
    /// workers too).
    bool ownProcessGroup = false;
    /// The child's working directory; "": this process's.
    std::string workingDirectory;
    /// The child is killed (SIGKILL) when the thread that started it ends, which for a start from
    /// the main thread is when this process dies, however it dies: a helper that must not outlive
    /// the command that started it (a replay child under an experiment's timeout). The child's own
    /// children are not covered.
    bool dieWithParent = false;
    /// The child reads /dev/null, not this process's standard input: a helper that must not wait
    /// for a terminal.
    bool noInput = false;
  };
  /// Receives output as it arrives: `stream` is 1 (stdout) or 2 (stderr).
  using OutputHandler = std::function<void(int stream, const char* data, size_t size)>;

  /// Starts `argv` (argv[0] searched in PATH). Throws Error{NotFound} when it cannot be
  /// executed (naming the command and errno's reason), Error{Io} when a pipe or fork fails.
  static ChildProcess start(const std::vector<std::string>& argv, const Options& options);

  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess& operator=(ChildProcess&&) = delete;
  ChildProcess(const ChildProcess&) = delete;
  ~ChildProcess();

  pid_t pid() const { return pid_; }
  /// Waits up to `timeoutMs` for output, hands what arrived to `onOutput`, and reaps the child
  /// if it has exited. `extra` descriptors are polled too; their revents are filled in.
  void poll(int timeoutMs, const OutputHandler& onOutput, std::vector<pollfd>* extra = nullptr);
  /// The child has exited (and was reaped).
  bool exited() const { return exited_; }
  /// Either output pipe is still open (a grandchild may hold them after the child exited).
  bool outputOpen() const { return out_ >= 0 || err_ >= 0; }
  /// Seconds since the child was seen to exit (0 while it runs).
  double secondsSinceExit() const;
  /// Sends `signal` to the child, or to its group (Options::ownProcessGroup). No-op once reaped.
  void signal(int signal);
  /// Blocks until the child has exited; closes the pipes.
  void wait();
  /// The exit status, or -1 when a signal ended the child. Valid once exited().
  int exitCode() const;
  /// The signal that ended the child, or 0. Valid once exited().
  int termSignal() const;

 private:
  ChildProcess(pid_t pid, int out, int err, bool group) : pid_(pid), out_(out), err_(err), group_(group) {}
  void closePipes();

  pid_t pid_ = -1;
  int out_ = -1, err_ = -1;
  bool group_ = false;
  bool exited_ = false;
  int status_ = 0;
  std::chrono::steady_clock::time_point exitedAt_;
};

/// The result of runCaptured.
struct CapturedRun {
  int exitCode = -1;          ///< the exit status, or -signal
  bool timedOut = false;      ///< killed with SIGKILL at the timeout
  bool pastDeadline = false;  ///< runTogether: killed at its overall deadline (timedOut too)
  std::string out, err;
  double seconds = 0;
};
/// Runs `argv` to its end with its output captured, killing it after `timeoutSeconds`. Throws as
/// ChildProcess::start does.
CapturedRun runCaptured(const std::vector<std::string>& argv, double timeoutSeconds);
CapturedRun runCaptured(const std::vector<std::string>& argv, double timeoutSeconds, const ChildProcess::Options& options);

/// One command of runTogether.
struct TogetherCommand {
  std::vector<std::string> argv;
  ChildProcess::Options options;
};
/// Runs the commands at the same time, each to its end with its output captured: the processes of
/// one job. Once one has ended, those still running `hangSeconds` later are killed (SIGKILL,
/// `timedOut`): a peer of a process that is gone may wait for it forever. With `deadlineSeconds`
/// > 0, those still running that long after the start are killed too (`timedOut` and
/// `pastDeadline`): processes that all wait, none ending, would otherwise never be stopped.
/// Throws as ChildProcess::start does (the ones already started are killed).
std::vector<CapturedRun> runTogether(const std::vector<TogetherCommand>& commands, double hangSeconds,
                                     double deadlineSeconds = 0);

}  // namespace crashcap::supervisor
