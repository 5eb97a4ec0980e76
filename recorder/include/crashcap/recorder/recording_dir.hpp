#pragma once
// A recording on disk and how it becomes a bundle. A recording is a directory
//   <dir>/recording-<UTC time>-<pid>/
//     run.ccap              recording info, environment, step program, optimizer spec
//     segment-000001.ccap   a keyframe, then the steps after it; one file per keyframe
//     segment-000002.ccap   ...
//     progress              where the process is: step, phase, steps begun (ProgressPage)
// where every .ccap file is a bundle that may be unsealed or cut short (the writer died). Sealing
// copies every intact record of run.ccap and the retained segments, in order, into one
// sealed bundle (no recompression), adds what the caller knows (crash, op trace, status),
// and removes the recording. No LibTorch here: the CLI's `crashcap seal` uses it too.

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "crashcap/formats/limits.hpp"
#include "crashcap/formats/records.hpp"

namespace crashcap::recorder {

/// The output directory a Recorder constructed with "" uses: `crashcap run` sets it for the
/// command it supervises, so the recorder's crash bundles land where the supervisor seals.
inline constexpr const char* kOutputDirVariable = "CRASHCAP_DIR";
inline constexpr const char* kRunFileName = "run.ccap";
inline constexpr const char* kRecordingPrefix = "recording-";
inline constexpr const char* kProgressFileName = "progress";

/// Where in a step the training is.
enum class Phase : int { Setup = 0, Forward, Backward, Optimizer, BetweenSteps };
/// "setup", "forward", "backward", "optimizer", "between-steps"; "unknown" for anything else.
const char* phaseName(Phase p);

/// The progress file's layout. The recorder maps it shared and stores into it as the training
/// goes (a few relaxed stores per step, no system call); the page cache keeps the newest values
/// when the process is killed, so `seal` knows the step a SIGKILL or the OOM killer cut short
/// even when its records never left the writer's queue. Native byte order: read on the machine
/// that wrote it.
struct ProgressPage {
  static constexpr char kMagic[8] = {'C', 'C', 'P', 'R', 'O', 'G', '1', '\n'};
  char magic[8];
  std::atomic<int64_t> step;         ///< the newest step begun; -1 none
  std::atomic<int32_t> phase;        ///< a Phase
  uint32_t reserved;
  std::atomic<uint64_t> stepsBegun;
  // Where the ops were, stored by the op ring's callbacks (op_ring.cpp): what a SIGKILLed process
  // leaves of its op trace. Zero in a progress file written before they existed.
  std::atomic<uint64_t> collectivesIssued;  ///< the last one issued is #collectivesIssued-1
  std::atomic<int64_t> lastCollectiveStep;  ///< its step; -1 between steps
  char lastCollective[64];                  ///< its name, NUL-terminated
  char lastOp[64];                          ///< the newest op begun in `step`, NUL-terminated ("" none)
};
static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<int32_t>::is_always_lock_free,
              "the progress page is shared with the page cache: its atomics must be plain memory");

struct Progress {
  int64_t step = -1;
  std::string phase;                 ///< phaseName
  uint64_t stepsBegun = 0;
  uint64_t collectivesIssued = 0;
  int64_t lastCollectiveStep = -1;
  std::string lastCollective;        ///< "" none
  std::string lastOp;                ///< "" none
};
/// The recording's progress file; nullopt when it has none (written before it existed, or on a
/// file system that cannot map it) or it is not one.
std::optional<Progress> readProgress(const std::string& recording);

/// "recording-20261121T233427Z-4242".
std::string recordingDirName(int64_t timeNs, uint32_t pid);
/// "segment-000001.ccap".
std::string segmentFileName(uint64_t index);
/// "20261121T233427Z" (UTC).
std::string compactUtcTime(int64_t timeNs);
/// "<dir>/<kind>-<time>-<pid>.ccap" ("crash", "recording"), with "-2", "-3"... added when
/// the name is taken.
std::string bundlePath(const std::string& dir, const std::string& kind, int64_t timeNs, uint32_t pid);

/// True when `path` is a recording directory (holds run.ccap).
bool isRecording(const std::string& path);
/// `path` itself when it is a recording, else its recording-* subdirectories, oldest first.
std::vector<std::string> findRecordings(const std::string& path);
/// The segment files of a recording, in order.
std::vector<std::string> segmentFiles(const std::string& recording);
/// How a recording's process left it, from its last segment: "finished" (closed by a clean
/// end), "crashed" (a crash is in it) or "interrupted" (killed before it could say).
std::string recordingState(const std::string& recording);

struct SealOptions {
  /// Output bundle; empty: <parent of the recording>/crash-<time>-<pid>.ccap for a recording
  /// that crashed or was interrupted, recording-<time>-<pid>.ccap for one that finished.
  std::string out;
  bool removeRecording = true;              ///< delete the recording once the bundle is sealed
  std::optional<formats::CrashData> crash;  ///< written into the bundle (the crash guard's)
  std::optional<formats::OpTraceData> ops;
  std::optional<formats::RunStatusData> status;
  std::optional<formats::SupervisionData> supervision;  ///< `crashcap run`'s record of the process
  std::vector<formats::KernelTraceData> kernelTraces;   ///< the process's kernel traces
  bool decodeChunks = true;                 ///< test-decompress every chunk before copying (see copyRecords)
  formats::ReaderLimits limits;
  formats::Progress progress;
};

struct SealReport {
  std::string out;                 ///< the sealed bundle
  std::string state;               ///< "finished" | "crashed" | "interrupted"
  uint64_t records = 0;
  uint64_t tensors = 0;
  uint64_t steps = 0;              ///< step_begin records in the bundle
  int64_t firstStep = -1, lastStep = -1;
  /// For an interrupted recording: the step its progress file says the process had begun (it
  /// may be newer than lastStep when the newest records never reached the disk); -1 unknown.
  int64_t begunStep = -1;
  std::vector<std::string> lost;   ///< one line per file that was cut short or damaged
  uint64_t bytes = 0;
  /// When SealOptions::removeRecording could not remove all of the recording: what is left and
  /// why ("" when it was removed, or kept on purpose). The bundle is complete either way.
  std::string notRemoved;
};

/// Seals one recording into a bundle. Writes OUT.partial and renames it, so a failure leaves
/// no half-written bundle. Throws Error{NotFound} when `recording` is not a recording,
/// Error{Io} when the output cannot be written.
SealReport sealRecording(const std::string& recording, const SealOptions& options = {});

}  // namespace crashcap::recorder
