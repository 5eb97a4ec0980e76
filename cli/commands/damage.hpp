#pragma once
// The investigation commands (replay, bisect, triage, report) refuse a damaged bundle before any
// verdict, unless --allow-damaged, and then say on stderr what the verdict stands on.

#include <CLI/CLI.hpp>

#include <iostream>
#include <string>

#include "crashcap/investigate/intact.hpp"
#include "crashcap/investigate/replays.hpp"

namespace crashcap::cli {

inline void addAllowDamaged(CLI::App* cmd, bool& allowDamaged) {
  cmd->add_flag("--allow-damaged", allowDamaged,
                "Investigate a bundle that `crashcap verify` finds damaged, as it is (what it lost can change the verdict)");
}

/// --allow-changed-source: a Python recording replays even where its source files changed.
inline void addAllowChangedSource(CLI::App* cmd) {
  cmd->add_flag_callback(
      "--allow-changed-source", [] { investigate::allowChangedSources(true); },
      "Replay a Python recording even where its source files differ from the recorded ones (named in a warning)");
}

/// Throws crashcap::Error{Corrupt} for a damaged bundle; with `allowDamaged`, warns and goes on.
inline void checkIntact(const std::string& bundle, bool allowDamaged) {
  if (auto damage = investigate::requireIntact(bundle, allowDamaged))
    std::cerr << "crashcap: warning: " << damage->describe(bundle) << " (going on: --allow-damaged)\n";
}

}  // namespace crashcap::cli
