#pragma once
// A Python batch's structure (StepBegin.structure: how the batch nests, as JSON, with its lists of
// plain values kept in it as {"value": [...]}): the parts of it that belong to its rows.
// Without LibTorch: triage reads it too.

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "crashcap/formats/records.hpp"

namespace crashcap::formats {
class BundleReader;
}

namespace crashcap::replayer {

/// A Python batch's structure (StepBegin.structure: its nesting as JSON, with lists of plain values
/// kept in it as {"value": [...]}) with each such list that holds one value per row (`count`)
/// cut to `rows` in that order, as cutBatch cuts the tensors: a collate's lengths or file names
/// given as Python lists. So are the lists at the places `rowOwn` names (rowOwnLists: each row's
/// own tensors), their kept items' tensors renamed to their new places (movedItemInput). Other
/// values stay whole. "" (a flat batch of tensors) stays "".
std::string cutStructure(const std::string& structure, int64_t count, const std::vector<int64_t>& rows,
                         const std::set<std::string>& rowOwn = {});

/// A Python batch's lists of one integer per row (`count`) in its structure, each named by where it
/// nests ("list '3' of step 12's batch", "list 'inputs/lengths' of step 12's batch"; '' when the
/// batch itself is the list), in the order they nest: a collate's lengths given as Python lists,
/// which beside the batch's tensors of one integer per row can tell a concatenated tensor's spans
/// as its lengths (formats::raggedSpans' lengthsOnly). A list holding anything but integers (a bool, a name) is none.
std::vector<std::pair<std::string, std::vector<int64_t>>> perRowLists(const std::string& structure, int64_t step,
                                                                      int64_t count);

/// A list of a Python batch with one item per row whose items hold tensors (perSampleLists).
struct SampleList {
  std::string list;                              ///< its place in the batch, "1" ("" the batch itself)
  std::vector<std::vector<std::string>> tensors;  ///< per item (row): the input names of its tensors, "1/3/boxes"
  /// (rowOwnLists) Each of its items is a list of as many items of tensors alike too: the samples,
  /// each a list of its fields, or the batch's fields, each a list of the samples' own tensors
  /// (images and masks of their own sizes, `tuple(zip(*batch))` of a batch of 2), cannot be told
  /// apart. Cut neither way, nor judged by rows.
  bool ambiguous = false;
};

/// The lists (and tuples of no named type) of a Python batch with one item per row (`count`) whose
/// items each hold a tensor, outermost first: a collate's per-sample targets (each image's dict of
/// boxes and labels, of its own sizes; torchvision's `tuple(zip(*batch))`), or by coincidence a
/// list of the batch's fields, or of crops that each hold every row. The caller tells them apart by
/// the tensors' row dimensions: only each sample's own tensors have none.
std::vector<SampleList> perSampleLists(const std::string& structure, int64_t count);

/// The lists of perSampleLists that hold each row's own tensors (a collate's per-sample targets):
/// their items alike (the same tensors at the same places, of the same ranks and dtypes) and most
/// of their tensors without a row dimension in `batchRows` (a sample's own tensor can have as many
/// objects as the batch has rows). A list of the batch's fields, or of crops that each hold every
/// row, has rows in most of its tensors. Outermost first; a list inside one of them is not one.
/// One whose every item is such a list too is `ambiguous`.
std::vector<SampleList> rowOwnLists(const formats::StepBeginData& begin, const formats::BundleReader& reader,
                                    const formats::BatchRows& batchRows);

/// The bundle names of the tensors of `lists` (rowOwnLists of the batch of `step`).
std::set<std::string> rowOwnTensorNames(const std::vector<SampleList>& lists, int64_t step);

/// The input name a tensor of item `from` of the list at `list` takes as item `to` of a cut
/// ("1/5/boxes" -> "1/0/boxes"; an item that is a tensor, "0/5" -> "0/0"); nullopt when the name
/// does not nest under the item's place.
std::optional<std::string> movedItemInput(const std::string& list, int64_t from, int64_t to, const std::string& input);

/// A PackedSequence in a Python batch: a collate function that packs the batch itself.
struct PackedParts {
  std::string place;  ///< where it nests, "0" ("" the batch itself)
  /// The input names of its data, batch_sizes, sorted_indices and unsorted_indices ("0/2"); ""
  /// for one that is not a tensor (None: a batch packed already sorted).
  std::array<std::string, 4> tensors;
};
/// A Python batch's PackedSequences, outermost first. Their tensors hold no rows a plain cut could
/// select, whatever their sizes happen to be: the data interleaves the rows' time steps, sorted by
/// length; batch_sizes counts rows per time step; the indices are permutations (cutPacked).
std::vector<PackedParts> packedSequences(const std::string& structure);
/// The bundle names of the tensors of `packed` (packedSequences of the batch of `step`): the
/// tensors a cut, a row check or a pack treats as one PackedSequence, never as rows of their own.
std::set<std::string> packedTensorNames(const std::vector<PackedParts>& packed, int64_t step);

/// Where each row's time steps lie along a PackedSequence's data (dimension 0), in time order,
/// from its batch_sizes and sorted_indices (empty: packed already sorted, row r at place r): row
/// r's step t is at sum(batch_sizes[:t]) + its place, so its first is its place. nullopt when they
/// do not fit one another (sizes that grow or are not positive, indices that are no permutation).
std::optional<std::vector<std::vector<int64_t>>> packedRowPositions(const std::vector<int64_t>& batchSizes,
                                                                    const std::vector<int64_t>& sortedIndices);

}  // namespace crashcap::replayer
