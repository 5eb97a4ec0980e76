#pragma once
// Names of environment facts (EnvironmentData::facts) that crashcap's own parts read back, beside
// the facts that only describe the machine.

namespace crashcap::formats {

/// Set by a recording whose program, when it replays, writes the progress file a replay request
/// names (replayer's ReplayOptions::progressPath). Without it, a program that dies while it
/// replays cannot say how far it got (an older crashcap).
inline constexpr const char* kReplayProgressFact = "crashcap.replay_progress";

}  // namespace crashcap::formats
