#pragma once
// `crashcap inspect`: the one-screen story of a recorded run — who ran what where, which
// steps and keyframes the bundle holds, how it died (phase, step, error, stack), the last
// ops before it, and the tensors of the failing step with their statistics.

#include <string>

#include <nlohmann/json.hpp>

#include "crashcap/formats/bundle_reader.hpp"

namespace crashcap::inspect {

struct StoryOptions {
  size_t lastOps = 12;        ///< ops shown before the crash
  size_t stackFrames = 12;    ///< stack frames shown in text (JSON has all)
  bool tensorStats = true;    ///< read the crash step's batch to compute statistics
};

/// Keys: bundle, state, sealed, run, env, program, optimizer, steps {first, last, count,
/// completed, last_loss, last_grad_norm, lost [steps the recorder lost]}, keyframes [steps], crash (null or {kind, step,
/// phase, error, error_type, signal (null when none), signal_name, stack, time}), last_ops,
/// op_trace {total_ops, capacity}, crash_tensors [{name, dtype, shape, stats}],
/// dropped_records, dropped_bytes, segments_deleted, keyframes_skipped, keyframe_interval (0 unknown),
/// buffer_pool_peak_bytes, status, warnings, problems.
nlohmann::json storyJson(const formats::BundleReader& reader, const StoryOptions& options = {});
std::string storyText(const formats::BundleReader& reader, const StoryOptions& options = {});

}  // namespace crashcap::inspect
