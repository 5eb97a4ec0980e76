#pragma once
// A Python batch's structure (StepBegin.structure: how the batch nests, as JSON, with its lists of
// plain values kept in it as {"value": [...]}): the parts of it that belong to its rows.
// Without LibTorch: triage reads it too.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace crashcap::replayer {

/// A Python batch's structure (StepBegin.structure: its nesting as JSON, with lists of plain values
/// kept in it as {"value": [...]}) with each such list that holds one value per row (`count`)
/// cut to `rows` in that order, as cutBatch cuts the tensors: a collate's lengths or file names
/// given as Python lists. Other values stay whole. "" (a flat batch of tensors) stays "".
std::string cutStructure(const std::string& structure, int64_t count, const std::vector<int64_t>& rows);

/// A Python batch's lists of one integer per row (`count`) in its structure, each named by where it
/// nests ("list '3' of step 12's batch", "list 'inputs/lengths' of step 12's batch"; '' when the
/// batch itself is the list), in the order they nest: a collate's lengths given as Python lists,
/// which beside the batch's tensors of one integer per row can tell a concatenated tensor's spans
/// (formats::raggedSpans). A list holding anything but integers (a bool, a name) is none.
std::vector<std::pair<std::string, std::vector<int64_t>>> perRowLists(const std::string& structure, int64_t step,
                                                                      int64_t count);

/// A tensor of a Python batch that lies in one item of a list of one item per row (perSampleTensors).
struct SampleTensor {
  std::string list;  ///< the list's place in the batch, "1" ("" when the batch itself is the list)
  int64_t row = 0;   ///< the item, and so the row, it lies in
};

/// The tensors (by their batch input names, "1/3/boxes") in the items of a list of one item per row
/// (`count`) whose items hold tensors: a collate's per-sample targets (a list of each image's dict
/// of boxes and labels, of its own sizes), with the list and the row each lies in. The outermost
/// such list only. A list of `count` tensors that each hold every row (the crops of a multi-crop
/// batch) is one too by its nesting alone: the caller tells it by the tensors' row dimensions.
std::map<std::string, SampleTensor> perSampleTensors(const std::string& structure, int64_t count);

}  // namespace crashcap::replayer
