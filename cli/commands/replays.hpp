#pragma once
// The commands that replay (replay, bisect) end as an in-process replay would when the recorded
// program they ran died of a signal: by that signal, so that the experiments of a triage see the
// failure in the same form whichever way the bundle replays.
#include <sys/resource.h>

#include <csignal>
#include <iostream>

#include "crashcap/investigate/replays.hpp"

namespace crashcap::cli {

template <typename Fn>
int endingLikeTheProgram(Fn&& fn) {
  try {
    return fn();
  } catch (const investigate::ProgramKilled& killed) {
    std::cerr << "crashcap: " << killed.what() << "\n";
    std::cerr.flush();
    rlimit noCore{0, 0};  // the core would be crashcap's, and blame it
    ::setrlimit(RLIMIT_CORE, &noCore);
    std::signal(killed.signal(), SIG_DFL);
    std::raise(killed.signal());
    throw;  // a signal that does not end the process (it is blocked): the error stands
  }
}

}  // namespace crashcap::cli
