#pragma once
// `crashcap inspect`: the one-screen story of a recorded run — who ran what where, which
// steps and keyframes the bundle holds, how it died (phase, step, error, stack), the last
// ops before it, and the tensors of the failing step with their statistics.

#include <string>

#include <nlohmann/json.hpp>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/records.hpp"

namespace crashcap::inspect {

struct StoryOptions {
  size_t lastOps = 12;        ///< ops shown before the crash
  size_t lastCollectives = 8; ///< torch.distributed collectives shown
  size_t stackFrames = 12;    ///< stack frames shown in text (JSON has all)
  bool tensorStats = true;    ///< read the crash step's batch to compute statistics
};

/// Keys: bundle, state, sealed, run, env, program, optimizer, steps {first, last, count (steps
/// recorded), ended (steps fingerprinted: their loss reached end()), completed (ended, less the
/// step the process failed in: a crash's step unless between steps, a killed process's), last_loss, last_grad_norm, last_learning_rates (of
/// the last step begun, per parameter group), lost [steps the recorder lost]}, keyframes [steps], crash (null or {kind, step,
/// phase, error, error_type, signal (null when none), signal_name, stack, time}), last_ops,
/// op_trace {total_ops, capacity, total_collectives}, collectives (see collectivesJson), crash_tensors [{name, dtype, shape, stats}],
/// dropped_records, dropped_bytes, segments_deleted, keyframes_skipped, keyframe_interval (0 unknown),
/// buffer_pool_peak_bytes, status, warnings, problems.
nlohmann::json storyJson(const formats::BundleReader& reader, const StoryOptions& options = {});
std::string storyText(const formats::BundleReader& reader, const StoryOptions& options = {});

/// One collective: {seq, name, step (null between steps), thread, inputs [{dtype, shape}], ended,
/// end_observable, seconds (null while it had not ended)}.
nlohmann::json collectiveJson(const formats::CollectiveData& collective);
/// The last `last` collectives of the op trace, oldest first, each as collectiveJson. A
/// backend ends a collective when it completes and when it fails (a peer gone): "ended" does not
/// say which; one that had not ended is one the process was waiting in.
nlohmann::json collectivesJson(const formats::BundleRecords& records, size_t last);
/// Whether a collective's end says it completed: Gloo's and MPI's work ends when the collective
/// has; NCCL's and UCC's when it is queued on the GPU's stream, which says nothing of completion.
bool collectiveEndObservable(const std::string& name);
/// One collective of collectivesJson as a line: "#12 gloo:all_reduce at step 3 float32[10], had not ended".
std::string collectiveText(const nlohmann::json& collective);

}  // namespace crashcap::inspect
