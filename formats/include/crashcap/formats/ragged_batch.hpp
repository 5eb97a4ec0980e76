#pragma once
// Ragged batches: a tensor that holds none of the batch's rows and still holds its samples,
// concatenated along a dimension of their own, and where each row's samples lie in it.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "crashcap/formats/records.hpp"

namespace crashcap::formats {

class BundleReader;

/// A batch tensor that holds its samples concatenated (concatenatedBatchTensors).
struct ConcatenatedTensor {
  std::string name;                ///< the bundle's tensor name, "steps/6/batch/1"
  std::string input;               ///< the batch input's name, "1"
  std::vector<int64_t> shape;      ///< at the step asked about
  int64_t otherStep = -1;          ///< a step at which it has another size
  std::vector<int64_t> otherShape;
  /// "'1' [79] ([82] at step 0)"
  std::string text() const;
};

/// The tensors of step `step`'s batch that hold none of its rows (formats::batchRows) and still
/// hold its samples: the samples concatenated along a dimension of their own (the tokens of a
/// ragged batch that offsets index into, a graph batch's nodes and edges). Each is told by a
/// dimension whose size differs at another recorded step and is neither 1 nor a size of the row
/// tensors' other dimensions (the length a padded batch is padded to, which a causal mask or
/// position ids share). A replay or a pack that keeps some rows would keep every value of such a
/// tensor: another batch, not a part of this one. None when the batch has no rows or no other
/// step tells. `shapeOf(name)`: a tensor's shape, empty when the bundle lacks it.
std::vector<ConcatenatedTensor> concatenatedBatchTensors(
    const std::vector<StepBeginData>& begins, int64_t step,
    const std::function<std::vector<int64_t>(const std::string&)>& shapeOf);
/// The same, with the shapes of the tensors `reader` holds.
std::vector<ConcatenatedTensor> concatenatedBatchTensors(const std::vector<StepBeginData>& begins, int64_t step,
                                                         const BundleReader& reader);
/// Why step `step`'s batch of `rows` rows cannot be cut, given its concatenatedBatchTensors: the
/// words `replay --rows` and `pack --rows` refuse with, before each says what it would have done.
std::string concatenatedBatchText(int64_t step, int64_t rows, const std::vector<ConcatenatedTensor>& tensors);

/// Where each row's samples lie along dimension 0 of a concatenated tensor (raggedSpans).
struct RaggedSpans {
  std::string by;        ///< the batch tensor of one integer per row that tells them
  bool offsets = false;  ///< its values are each row's first position (an EmbeddingBag's offsets), else each row's length
  std::vector<std::pair<int64_t, int64_t>> spans;  ///< per row, [begin, end)
  /// "the offsets in steps/6/batch/2", "the lengths in steps/17/batch/3"
  std::string text() const;
};

/// The spans of the rows of a tensor of `size` samples concatenated along dimension 0, told by one
/// of `perRow` (batch tensors of one integer per row, in row order, each with its name): as
/// lengths, when its values are >= 0 and sum to `size` (a CTC loss's target lengths); as offsets,
/// when it starts at 0, never decreases and ends within `size`. nullopt when none tells them, one
/// fits both ways, or two tell different spans: then no row can be placed or cut. `lengthsOnly` are
/// more candidates read as lengths only (a Python batch's lists of one integer per row: a cut keeps
/// a list's values of the kept rows, which would no longer be offsets into what is kept, and a list
/// of ids or flags could pass for offsets).
std::optional<RaggedSpans> raggedSpans(int64_t size,
                                       const std::vector<std::pair<std::string, std::vector<int64_t>>>& perRow,
                                       const std::vector<std::pair<std::string, std::vector<int64_t>>>& lengthsOnly = {});

}  // namespace crashcap::formats
