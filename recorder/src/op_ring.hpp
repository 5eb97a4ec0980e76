#pragma once
// The op observer: at::RecordFunction callbacks that write each ATen op (name, forward/backward,
// autograd sequence number, step, thread, first input shapes and dtypes) into a fixed ring. They
// allocate nothing per op and never throw; the ring is read at crash time, racing writers
// tolerated (an entry being overwritten is skipped).
//
// The callbacks are the training thread's own (thread-local, and carried by LibTorch to the
// threads it runs that thread's work on, the autograd engine's), and they are registered only
// while a step computes: from beginStep to the step's end(loss), its forward and backward. With a
// callback registered, LibTorch builds a RecordFunction and boxes the arguments of every op it
// dispatches, 0.1-0.2 us per op here whatever the callback does; the optimizer's update (36 ops
// per parameter for torch 1.13's Adam on the CPU, more than half of a small model's ops) and what
// runs between steps run without. A recording without steps (a training crashcap only watches for
// its crash) observes its thread from the recorder's start.
//
// The ring keeps the outermost ops: the ones the program called (aten::linear, not the aten::t
// and aten::addmm inside it), the autograd nodes of the backward, and the ops the autograd engine
// runs between nodes (gradient sums). Once an op has been seen calling others, the callback is
// switched off on its thread for the duration of its later calls, so the ops inside are not built
// at all (aten::linear: 1.75 -> 0.39 us of overhead a call). Only while crashcap's is the thread's
// only op callback when the step begins: with a profiler, the replayer's observer or a fault
// injector also registered, every op is built and kept as before. The autograd engine's device
// threads (a backward on a GPU) keep every op too: their callbacks are copies they cannot switch.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>

#include "crashcap/formats/records.hpp"
#include "crashcap/recorder/recording_dir.hpp"

namespace crashcap::recorder::detail {

/// Starts observing into a ring of `capacity` entries, on the calling thread. `step` and `phase`
/// are read and (phase: forward -> backward) written by the callback; they must outlive stop().
/// Returns false (and does nothing) when an observer is already running.
/// `progress` (nullable) gets the newest op's name and the collectives issued, which outlive a
/// SIGKILL there; it too must outlive stop().
bool startOpObserver(size_t capacity, std::atomic<int64_t>* step, std::atomic<int>* phase, ProgressPage* progress);
/// Observes the calling thread's ops (on) or stops (off): beginStep turns it on, the step's
/// end(loss) off. Cheap when nothing changes; does nothing while no observer runs.
void observeOpsOnThisThread(bool on);
/// Stops the observer; the ring stays readable until the next start. Callbacks other threads
/// registered stay, doing nothing, until those threads next call observeOpsOnThisThread.
void stopOpObserver();
/// The ring's contents, oldest first; nullopt when the observer never ran.
std::optional<formats::OpTraceData> snapshotOps();

}  // namespace crashcap::recorder::detail
