#pragma once
// Replay of any bundle. A TorchScript recording replays in this process (replayer::replay); a
// setModel recording replays in its own program, which `crashcap` starts again from the recorded
// command line and working directory with a replay request (crashcap/replayer/program_replay.hpp)
// and whose answer it reads back. Every command that replays goes through here, so `replay`,
// `bisect` and `triage` treat both kinds alike.

#include <stdexcept>
#include <string>

#include "crashcap/replayer/replay.hpp"

namespace crashcap::investigate {

/// The recorded program died of a signal while it replayed: the failure under test in another
/// form (a segfault where the recording saw an exception), as when an in-process replay dies.
/// SIGKILL is not one (something outside killed it, the OOM killer most likely): an Error.
class ProgramKilled : public std::runtime_error {
 public:
  ProgramKilled(int signal, const std::string& what) : std::runtime_error(what), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

/// How a bundle replays: "in-process" (a TorchScript step program) or "program" (setModel with a
/// step function: the recorded program serves the replay). Throws Error{Unsupported} naming what
/// is missing when it cannot be replayed from the command line at all.
std::string replayRoute(const std::string& bundle);

/// From now on, every replay this process runs in a recorded program lets it run source files
/// that differ from the recorded ones (ReplayOptions::allowChangedSources): the CLI's
/// --allow-changed-source, which applies to every experiment of a bisection or triage.
void allowChangedSources(bool allow);
bool changedSourcesAllowed();

/// Replays `bundle` by its route. Throws crashcap::Error as replayer::replay does (an error the
/// program hands back keeps its code and hint), Error{Unsupported} when the program cannot be
/// started or ends without an answer (its exit status and the last lines of its output say why),
/// and ProgramKilled.
replayer::ReplayResult replay(const std::string& bundle, const replayer::ReplayOptions& options);

/// replayer::compareWithReference by the bundle's route.
replayer::ReferenceComparison compareWithReference(const std::string& bundle, const replayer::ReplayOptions& options,
                                                   double tolerance);

}  // namespace crashcap::investigate
