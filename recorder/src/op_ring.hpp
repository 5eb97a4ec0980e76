#pragma once
// The op observer: a global at::RecordFunction callback that writes each ATen op (name,
// forward/backward, autograd sequence number, step, thread, first input shapes and dtypes)
// into a fixed ring. It allocates nothing per op and never throws; the ring is read at crash
// time, racing writers tolerated (an entry being overwritten is skipped).

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "crashcap/formats/records.hpp"

namespace crashcap::recorder::detail {

/// Starts observing into a ring of `capacity` entries. `step` and `phase` are read and
/// (phase: forward -> backward) written by the callback; they must outlive stop().
/// Returns false (and does nothing) when an observer is already running.
bool startOpObserver(size_t capacity, std::atomic<int64_t>* step, std::atomic<int>* phase);
/// Removes the callbacks; the ring stays readable until the next start.
void stopOpObserver();
/// The ring's contents, oldest first; nullopt when the observer never ran.
std::optional<formats::OpTraceData> snapshotOps();

}  // namespace crashcap::recorder::detail
