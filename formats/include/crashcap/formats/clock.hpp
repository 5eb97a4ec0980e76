#pragma once
// The wall clock every record's time field uses (bundle.capnp: "ns since the Unix epoch").

#include <cstdint>
#include <string>

namespace crashcap::formats {

/// Nanoseconds since the Unix epoch (CLOCK_REALTIME). Thread-safe.
int64_t unixTimeNs();

/// "2026-11-21 21:40:01 UTC" from ns since the epoch.
std::string formatTime(int64_t ns);

}  // namespace crashcap::formats
