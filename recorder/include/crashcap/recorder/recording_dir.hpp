#pragma once
// A recording on disk and how it becomes a bundle. A recording is a directory
//   <dir>/recording-<UTC time>-<pid>/
//     run.ccap              recording info, environment, step program, optimizer spec
//     segment-000001.ccap   a keyframe, then the steps after it; one file per keyframe
//     segment-000002.ccap   ...
// where every file is a bundle that may be unsealed or cut short (the writer died). Sealing
// copies every intact record of run.ccap and the retained segments, in order, into one
// sealed bundle (no recompression), adds what the caller knows (crash, op trace, status),
// and removes the recording. No LibTorch here: the CLI's `crashcap seal` uses it too.

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
  std::vector<std::string> lost;   ///< one line per file that was cut short or damaged
  uint64_t bytes = 0;
};

/// Seals one recording into a bundle. Writes OUT.partial and renames it, so a failure leaves
/// no half-written bundle. Throws Error{NotFound} when `recording` is not a recording,
/// Error{Io} when the output cannot be written.
SealReport sealRecording(const std::string& recording, const SealOptions& options = {});

}  // namespace crashcap::recorder
