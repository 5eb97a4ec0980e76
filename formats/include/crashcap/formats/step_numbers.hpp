#pragma once
// What the count of steps a recorder began proves about their numbers. A recorder's step
// numbers are 0 or more and only grow, so S + 1 steps begun, the newest S, are exactly 0..S.
// With fewer begun the numbers skipped (a program counting in tens, a run resumed at a later
// step) and, of the steps after the last recorded one, only S is known to have begun. The
// seal's warning and formats::lostSteps both name missing steps by this one rule.

#include <cstdint>

namespace crashcap::formats {

/// Whether `stepsBegun` steps, the newest numbered `newest`, are exactly the steps 0..newest.
inline bool begunStepsAreAllUpTo(uint64_t stepsBegun, int64_t newest) {
  return newest >= 0 && stepsBegun == static_cast<uint64_t>(newest) + 1;
}

}  // namespace crashcap::formats
