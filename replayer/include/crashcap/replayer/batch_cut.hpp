#pragma once
// Some rows of a recorded batch: what `replay --rows` feeds the step and `pack --rows` keeps.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "crashcap/formats/records.hpp"
#include "crashcap/replayer/batch_structure.hpp"

namespace crashcap::formats {
class BundleReader;
}

namespace crashcap::replayer {

/// A step's batch cut to some of its rows (cutBatch).
struct BatchCut {
  /// The cut tensors by bundle name: each replaces the recorded tensor of its name, or is one the
  /// recording lacks (a kept row's own tensor at a place past the batch's rows, when rows repeat).
  std::map<std::string, at::Tensor> tensors;
  /// The cut batch's tensor names (the StepBegin's `batch` of it): the recorded ones, but where a
  /// list of each row's own tensors was, its kept items' tensors at their new places.
  std::vector<std::string> batch;
  std::vector<int8_t> rowDims;  ///< parallel to `batch` when the StepBegin has them, else empty
  std::string structure;        ///< the StepBegin's structure, cut the same way (cutStructure)
};

/// The tensors of a step's batch cut to `rows` (in that order; a row may repeat): a tensor with
/// rows (formats::batchRows) keeps those rows along its row dimension; a tensor of the samples
/// concatenated (formats::concatenatedBatchTensors) keeps the kept rows' spans, told by the
/// batch's lengths or offsets (formats::raggedSpans), tensors of one integer per row or, for
/// lengths, Python lists of them in its structure (perRowLists); offsets are made anew for what is
/// kept, so only a tensor can give them. A PackedSequence in a Python batch (packedSequences) is
/// packed anew from the kept rows, its four tensors as one. A list of each row's own tensors
/// (rowOwnLists: a collate's per-sample targets) keeps the kept rows' items, renamed to their places
/// among them (movedItemInput), as its structure is.
/// The batch's other tensors (a causal mask, position ids) are not in `tensors`: they stay whole.
/// `rows` must each be within the batch. Throws Error(Unsupported) when a concatenated tensor's
/// spans are not told, a PackedSequence's tensors do not fit one another (or it was packed sorted,
/// without indices, and the rows are not in its order), or a list of each row's own tensors is
/// ambiguous (SampleList::ambiguous) or holds one not named by its item's place, with `refusal`
/// ("a replay that keeps some rows would ...") and `hint`.
BatchCut cutBatch(const formats::BundleReader& reader, const formats::BundleRecords& view,
                  const formats::StepBeginData& begin, const std::vector<int64_t>& rows, const std::string& refusal,
                  const std::string& hint);

}  // namespace crashcap::replayer
