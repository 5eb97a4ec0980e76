#pragma once
// `crashcap pack`: the smallest bundle that still replays a crash, to attach to a bug report.
// A crash bundle holds the whole retained window (several keyframes, every batch of every step
// in it); the crash needs the state its step started from and that step's batch. Pack replays
// the crash from the newest keyframe at or before it; when every step up to the crash replays bit
// for bit, the replay writes the state the crash step starts from as a keyframe (a keyframe *at*
// the failing step), and the attachment holds that keyframe and the one step. When it cannot
// (the replay departs, runs elsewhere, or is not asked for), pack falls back to the newest
// keyframe and every step from it to the crash. Everything that is not a step or a keyframe
// (program, optimizer spec, environment, crash, op and kernel traces, the run's record) is copied
// record for record without recompression. It says what the attachment holds in the words a
// privacy reviewer needs: how many training samples, which dataset indices, whose weights, which
// source files.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "crashcap/formats/limits.hpp"
#include "crashcap/replayer/replay.hpp"

namespace crashcap::investigate {

struct PackOptions {
  std::string out;                  ///< the packed bundle; required
  bool force = false;               ///< replace `out` when it exists
  uint64_t maxBytes = 0;            ///< over this, nothing is written (tooLarge); 0: no limit
  /// Replay the crash first (by the bundle's route, as `crashcap replay` does): to write the
  /// keyframe at the failing step, and to say whether the attachment reproduces. false: pack
  /// from the recorded keyframes alone, checking nothing.
  bool replay = true;
  /// Which rows of the crash step's batch to keep: "all" (default), "culprit" (the rows `bisect
  /// samples` finds the failure needs, searched on the packed bundle), or a list "3,5". Only the
  /// crash step's batch is cut (the tensors that hold its rows, each along its row dimension,
  /// its dataset index among them), and its recorded fingerprint goes with the rows it no longer
  /// matches.
  std::string rows = "all";
  /// Of the culprit search's experiments.
  double experimentTimeoutSeconds = 300;
  bool progress = false;
  /// OUT is a .zip holding the packed bundle (named as OUT with .ccap) and report.md: the form an
  /// issue tracker takes. --max-size applies to the zip.
  bool zip = false;
  formats::ReaderLimits limits;
};

/// A part of the packed bundle and its size on disk.
struct PackPart {
  std::string what;                 ///< "the batches of steps 40..49", "the keyframe at step 40"
  uint64_t bytes = 0;
};

struct PackReport {
  std::string in, out;
  uint64_t originalBytes = 0;
  uint64_t packedBytes = 0;         ///< 0 when nothing was written; with zip, the zip's size
  uint64_t bundleBytes = 0;         ///< the packed bundle's (inside the zip, with zip)
  std::vector<std::string> zipEntries;  ///< the names inside the zip
  int64_t crashStep = -1;           ///< the step the crash happened in; -1: no crash record
  int64_t keyframeStep = -1;        ///< the one keyframe kept; -1: none could be
  int64_t firstStep = -1, lastStep = -1;  ///< the steps kept
  uint64_t steps = 0;
  uint64_t samples = 0;             ///< batch rows over the kept steps
  /// Per kept step whose batch names its rows' dataset indices (an `index` tensor).
  std::vector<std::pair<int64_t, std::vector<int64_t>>> datasetIndices;
  uint64_t weightTensors = 0;       ///< the keyframe's tensors (weights, buffers, optimizer state)
  uint64_t otherTensors = 0;        ///< neither a step's nor a keyframe's (the step program, sources)
  std::vector<std::string> sources; ///< the program's source files kept
  uint64_t keyframesLeftOut = 0, stepsLeftOut = 0;
  std::vector<std::string> contents;  ///< what the attachment holds, one line each, plain words
  std::vector<std::string> warnings;  ///< what makes it less than a full reproduction
  std::vector<PackPart> parts;        ///< biggest first
  bool tooLarge = false;              ///< over maxBytes: nothing written
  /// The replay of the crash from the original bundle (PackOptions::replay); nullopt when none
  /// ran. Its keyframeWritten says whether the kept keyframe is one it materialised.
  std::optional<replayer::ReplayResult> replay;
  /// The crash step's batch rows kept (PackOptions::rows), empty: all of them.
  std::vector<int64_t> rows;
  int64_t batchSize = 0;              ///< rows of the crash step's batch as recorded
  int rowReplays = 0;                 ///< experiments of the culprit search
  /// With zip: the packed bundle's own replay, which its report states.
  std::optional<replayer::ReplayResult> packedReplay;
  std::string replayFailed;           ///< why the replay could not run ("" when it ran or was not asked for)
  double packMs = 0;                  ///< the whole pack, its replay included
};

/// Packs `in` into options.out (OUT.partial, renamed when whole). Throws Error{InvalidArgument}
/// when `out` exists (without force) or is the input, or rows names a row outside the batch, Error{NotFound}/{Corrupt}/{Truncated} as
/// the reader does for a file it cannot read at all. A damaged but readable bundle is packed from
/// what is intact, with a warning.
PackReport packBundle(const std::string& in, const PackOptions& options);

}  // namespace crashcap::investigate
