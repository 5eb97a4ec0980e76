#pragma once
// The wall clock every record's time field uses (bundle.capnp: "ns since the Unix epoch").

#include <cstdint>

namespace crashcap::formats {

/// Nanoseconds since the Unix epoch (CLOCK_REALTIME). Thread-safe.
int64_t unixTimeNs();

}  // namespace crashcap::formats
