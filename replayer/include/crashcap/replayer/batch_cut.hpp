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

/// The tensors of a step's batch cut to `rows` (in that order), by name: a tensor with rows
/// (formats::batchRows) keeps those rows along its row dimension; a tensor of the samples
/// concatenated (formats::concatenatedBatchTensors) keeps the kept rows' spans, told by the
/// batch's lengths or offsets (formats::raggedSpans), tensors of one integer per row or, for
/// lengths, Python lists of them in its structure (perRowLists); offsets are made anew for what is
/// kept, so only a tensor can give them. A PackedSequence in a Python batch (packedSequences) is
/// packed anew from the kept rows, its four tensors as one.
/// The batch's other tensors (a causal mask, position ids) are not in it: they stay whole.
/// `rows` must each be within the batch. Throws Error(Unsupported) when a concatenated tensor's
/// spans are not told, a PackedSequence's tensors do not fit one another (or it was packed sorted,
/// without indices, and the rows are not in its order), or the batch holds a list of each sample's
/// own tensors (perSampleLists), with
/// `refusal` ("a replay that keeps some rows would ...") and `hint`.
std::map<std::string, at::Tensor> cutBatch(const formats::BundleReader& reader, const formats::BundleRecords& view,
                                           const formats::StepBeginData& begin, const std::vector<int64_t>& rows,
                                           const std::string& refusal, const std::string& hint);

}  // namespace crashcap::replayer
