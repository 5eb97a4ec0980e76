#pragma once
// `crashcap pack`: the smallest bundle that still replays a crash, to attach to a bug report.
// A crash bundle holds the whole retained window (several keyframes, every batch of every step
// in it); the crash needs one keyframe and the steps from it to the crash. Pack keeps the newest
// keyframe at or before the crash step from which every step up to the crash is in the bundle,
// those steps (batches, generator states, fingerprints), and everything that is not a step or
// a keyframe (program, optimizer spec, environment, crash, op and kernel traces, the run's
// record), copied record for record without recompression. It says what the attachment holds in
// the words a privacy reviewer needs: how many training samples, which dataset indices, whose
// weights, which source files.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "crashcap/formats/limits.hpp"

namespace crashcap::investigate {

struct PackOptions {
  std::string out;                  ///< the packed bundle; required
  bool force = false;               ///< replace `out` when it exists
  uint64_t maxBytes = 0;            ///< over this, nothing is written (tooLarge); 0: no limit
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
  uint64_t packedBytes = 0;         ///< 0 when nothing was written
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
};

/// Packs `in` into options.out (OUT.partial, renamed when whole). Throws Error{InvalidArgument}
/// when `out` exists (without force) or is the input, Error{NotFound}/{Corrupt}/{Truncated} as
/// the reader does for a file it cannot read at all. A damaged but readable bundle is packed from
/// what is intact, with a warning.
PackReport packBundle(const std::string& in, const PackOptions& options);

}  // namespace crashcap::investigate
