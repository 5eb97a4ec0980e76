#pragma once
// Some rows of a recorded batch: what `replay --rows` feeds the step and `pack --rows` keeps.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "crashcap/formats/records.hpp"

namespace crashcap::formats {
class BundleReader;
}

namespace crashcap::replayer {

/// The tensors of a step's batch cut to `rows` (in that order), by name: a tensor with rows
/// (formats::batchRows) keeps those rows along its row dimension; a tensor of the samples
/// concatenated (formats::concatenatedBatchTensors) keeps the kept rows' spans, told by the
/// batch's lengths or offsets (formats::raggedSpans); offsets are made anew for what is kept.
/// The batch's other tensors (a causal mask, position ids) are not in it: they stay whole.
/// `rows` must each be within the batch. Throws Error(Unsupported) when a concatenated tensor's
/// spans are not told, with `refusal` ("a replay that keeps some rows would ...") and `hint`.
std::map<std::string, at::Tensor> cutBatch(const formats::BundleReader& reader, const formats::BundleRecords& view,
                                           const formats::StepBeginData& begin, const std::vector<int64_t>& rows,
                                           const std::string& refusal, const std::string& hint);

/// A Python batch's structure (StepBegin.structure: its nesting as JSON, with lists of plain values
/// kept in it as {"value": [...]}) with each such list that holds one value per row (`count`)
/// cut to `rows` in that order, as cutBatch cuts the tensors: a collate's lengths or file names
/// given as Python lists. Other values stay whole. "" (a flat batch of tensors) stays "".
std::string cutStructure(const std::string& structure, int64_t count, const std::vector<int64_t>& rows);

}  // namespace crashcap::replayer
