#include "crashcap/replayer/batch_cut.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>
#include <set>
#include <utility>

#include "crashcap/formats/dtype.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/ragged_batch.hpp"
#include "crashcap/formats/torch/tensor_bridge.hpp"

namespace crashcap::replayer {

namespace {

/// The bundle names of the tensors of `lists` (rowOwnLists of the batch of `step`), each with its
/// list's index there. Throws Error(Unsupported) for an ambiguous list (the samples or the batch's
/// fields), or a tensor not named by its item's place: the kept items could not be renamed to theirs.
std::map<std::string, size_t> rowOwnTensors(const std::vector<SampleList>& lists, int64_t step, int64_t count,
                                            const std::string& refusal, const std::string& hint) {
  std::map<std::string, size_t> out;
  for (size_t k = 0; k < lists.size(); ++k) {
    if (lists[k].ambiguous)
      throw Error(ErrorCode::Unsupported,
                  fmt::format("step {}'s batch cannot be cut to some of its {} rows: its list '{}' holds {} items that "
                              "each hold {} items of tensors alike without rows, so whether its items are the samples "
                              "(each with its fields) or the batch's fields (each with every sample's own tensor) "
                              "cannot be told; {}",
                              step, count, lists[k].list, count, count, refusal),
                  hint);
    for (size_t row = 0; row < lists[k].tensors.size(); ++row)
      for (const auto& input : lists[k].tensors[row]) {
        const auto r = static_cast<int64_t>(row);
        if (!movedItemInput(lists[k].list, r, r, input))
          throw Error(ErrorCode::Unsupported,
                      fmt::format("step {}'s batch cannot be cut to some of its {} rows: its list '{}' holds one item "
                                  "per row whose tensors are that row's own (a collate's per-sample targets), and its "
                                  "tensor '{}' is not named by its item's place, so a kept item cannot be given its "
                                  "new one; {}",
                                  step, count, lists[k].list, input, refusal),
                      hint);
        out.emplace(formats::batchTensorName(step, input), k);
      }
  }
  return out;
}

/// A PackedSequence's tensors cut to `rows` (of the batch, in that order; a row may repeat), into
/// `out` by their bundle names: the kept rows packed anew, as pack_padded_sequence packs them. Row
/// r's time step t is at data[sum(batch_sizes[:t]) + unsorted_indices[r]]; the kept rows are
/// sorted by their place in the recorded order (so still longest first, and every row kept gives
/// back the recorded tensors), and batch_sizes counts the kept rows each time step has. Throws
/// Error(Unsupported) when its tensors do not fit one another (a PackedSequence built by hand), or
/// when it has no sorted_indices (packed already sorted) and the kept rows are not in that order.
void cutPacked(const formats::BundleReader& reader, int64_t step, int64_t count, const PackedParts& packed,
               const std::vector<int64_t>& rows, std::map<std::string, at::Tensor>& out, const std::string& refusal,
               const std::string& hint) {
  auto name = [&](size_t k) { return formats::batchTensorName(step, packed.tensors[k]); };
  auto refuse = [&](const std::string& why) {
    throw Error(ErrorCode::Unsupported,
                fmt::format("step {}'s batch cannot be cut to some of its {} rows: its PackedSequence '{}' {}; {}", step,
                            count, packed.place, why, refusal),
                hint);
  };
  if (packed.tensors[0].empty() || packed.tensors[1].empty() || !reader.find(name(0)) || !reader.find(name(1)))
    refuse("lacks its data or its batch_sizes");
  const at::Tensor data = formats::torch::readTensor(reader, name(0));
  auto longs = [&](size_t k) {
    const at::Tensor t = formats::torch::readTensor(reader, name(k)).to(at::kLong).contiguous();
    return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  };
  const auto sizes = longs(1);
  const bool sorted = !packed.tensors[2].empty() && reader.find(name(2));
  const auto positions = packedRowPositions(sizes, sorted ? longs(2) : std::vector<int64_t>{});
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  if (!positions) refuse("has batch_sizes or sorted_indices that do not fit one another");
  if (static_cast<int64_t>(positions->size()) != count || data.dim() == 0 || data.size(0) != total)
    refuse(fmt::format("packs {} rows in {} time steps ({} elements) beside a batch of {} rows and data of {}",
                       positions->size(), sizes.size(), total, count, data.dim() ? data.size(0) : 0));
  // The kept rows in packed order (a row's first position is its place); a repeated row after its first.
  auto place = [&](size_t j) { return (*positions)[static_cast<size_t>(rows[j])].front(); };
  std::vector<size_t> order(rows.size());
  for (size_t j = 0; j < order.size(); ++j) order[j] = j;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return place(a) < place(b); });
  if (!sorted)
    for (size_t i = 0; i < order.size(); ++i)
      if (order[i] != i) refuse("was packed already sorted (no sorted_indices), and the rows kept are not in its order");
  std::vector<int64_t> gather, keptSizes;
  for (size_t t = 0; t < sizes.size(); ++t) {
    int64_t n = 0;
    for (size_t j : order)
      if (const auto& at = (*positions)[static_cast<size_t>(rows[j])]; t < at.size()) {
        gather.push_back(at[t]);
        ++n;
      }
    if (n == 0) break;
    keptSizes.push_back(n);
  }
  out[name(0)] = data.index_select(0, at::tensor(gather, at::kLong));
  out[name(1)] = at::tensor(keptSizes, at::kLong).to(formats::torch::readTensor(reader, name(1)).scalar_type());
  if (sorted) {
    std::vector<int64_t> sortedIndices, unsortedIndices(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      sortedIndices.push_back(static_cast<int64_t>(order[i]));
      unsortedIndices[order[i]] = static_cast<int64_t>(i);
    }
    out[name(2)] = at::tensor(sortedIndices, at::kLong);
    if (!packed.tensors[3].empty() && reader.find(name(3))) out[name(3)] = at::tensor(unsortedIndices, at::kLong);
  }
}

}  // namespace

BatchCut cutBatch(const formats::BundleReader& reader, const formats::BundleRecords& view,
                  const formats::StepBeginData& begin, const std::vector<int64_t>& rows, const std::string& refusal,
                  const std::string& hint) {
  const auto batchRows = formats::batchRows(begin, reader);
  // A list of each row's own tensors keeps the kept rows' items, whatever their sizes happen to be.
  const auto rowOwn = rowOwnLists(begin, reader, batchRows);
  const auto ownNames = rowOwnTensors(rowOwn, begin.step, batchRows.count, refusal, hint);
  // A PackedSequence's tensors are cut as one (cutPacked), never as rows or spans of their own.
  std::map<std::string, at::Tensor> out;
  const auto packedParts = packedSequences(begin.structure);
  for (const auto& packed : packedParts) cutPacked(reader, begin.step, batchRows.count, packed, rows, out, refusal, hint);
  const auto packedNames = packedTensorNames(packedParts, begin.step);
  // Each concatenated tensor's spans, from the batch's tensors of one integer per row.
  std::map<std::string, formats::RaggedSpans> ragged;
  auto whole = formats::concatenatedBatchTensors(view.stepBegins, begin.step, reader);
  whole.erase(std::remove_if(whole.begin(), whole.end(),
                             [&](const formats::ConcatenatedTensor& c) {
                               return packedNames.count(c.name) > 0 || ownNames.count(c.name) > 0;
                             }),
              whole.end());
  if (!whole.empty()) {
    std::vector<std::pair<std::string, std::vector<int64_t>>> perRow;
    for (size_t i = 0; i < begin.batch.size(); ++i) {
      const auto& name = begin.batch[i];
      const auto* info = reader.find(name);
      if (!info || packedNames.count(name) || ownNames.count(name) || batchRows.dims[i] != 0 || info->shape.size() != 1 ||
          name == formats::batchTensorName(begin.step, formats::kDatasetIndexName) || formats::isFloating(info->dtype) ||
          formats::isComplex(info->dtype) || info->dtype == formats::DType::Bool)
        continue;
      const at::Tensor v = formats::torch::readTensor(reader, name).to(at::kLong).contiguous();
      perRow.emplace_back(name, std::vector<int64_t>(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + v.numel()));
    }
    const auto lists = perRowLists(begin.structure, begin.step, batchRows.count);  // lengths as Python lists
    std::vector<formats::ConcatenatedTensor> uncut;
    for (const auto& c : whole) {
      std::optional<formats::RaggedSpans> spans;
      // Only along dimension 0, the one the spans count in.
      if (!c.shape.empty() && !c.otherShape.empty() && c.shape[0] != c.otherShape[0])
        spans = formats::raggedSpans(c.shape[0], perRow, lists);
      if (spans && static_cast<int64_t>(spans->spans.size()) == batchRows.count)
        ragged.emplace(c.name, std::move(*spans));
      else
        uncut.push_back(c);
    }
    if (!uncut.empty())
      throw Error(ErrorCode::Unsupported,
                  formats::concatenatedBatchText(begin.step, batchRows.count, uncut) +
                      ", and no tensor of one length or offset per row tells where each row's samples lie in it; " +
                      refusal,
                  hint);
  }
  const at::Tensor keep = at::tensor(rows, at::kLong);
  for (size_t i = 0; i < begin.batch.size(); ++i) {
    const auto& name = begin.batch[i];
    if (packedNames.count(name) || ownNames.count(name)) continue;
    if (auto c = ragged.find(name); c != ragged.end()) {
      const at::Tensor t = formats::torch::readTensor(reader, name);
      std::vector<at::Tensor> parts;
      for (int64_t row : rows) {
        const auto [b, e] = c->second.spans.at(static_cast<size_t>(row));
        parts.push_back(t.narrow(0, b, e - b));
      }
      out[name] = at::cat(parts, 0);
    } else if (batchRows.dims[i] >= 0) {
      out[name] = formats::torch::readTensor(reader, name).index_select(batchRows.dims[i], keep);
    }
  }
  // Offsets index into what is kept: each kept row's first position there.
  for (const auto& [name, spans] : ragged) {
    if (!spans.offsets) continue;
    std::vector<int64_t> starts;
    int64_t at = 0;
    for (int64_t row : rows) {
      starts.push_back(at);
      const auto [b, e] = spans.spans.at(static_cast<size_t>(row));
      at += e - b;
    }
    out[spans.by] = at::tensor(starts, at::kLong).to(out.at(spans.by).scalar_type());
  }
  // The batch's names in order; where a list of each row's own tensors began, its kept items'.
  BatchCut cut;
  const std::string prefix = formats::batchTensorName(begin.step, "");
  const bool dims = begin.rowDims.size() == begin.batch.size();
  std::set<size_t> listsDone;
  for (size_t i = 0; i < begin.batch.size(); ++i) {
    const auto own = ownNames.find(begin.batch[i]);
    if (own == ownNames.end()) {
      cut.batch.push_back(begin.batch[i]);
      if (dims) cut.rowDims.push_back(begin.rowDims[i]);
      continue;
    }
    if (!listsDone.insert(own->second).second) continue;
    const auto& list = rowOwn[own->second];
    for (size_t j = 0; j < rows.size(); ++j)
      for (const auto& input : list.tensors.at(static_cast<size_t>(rows[j]))) {
        const std::string name = prefix + *movedItemInput(list.list, rows[j], static_cast<int64_t>(j), input);
        out[name] = formats::torch::readTensor(reader, prefix + input);
        cut.batch.push_back(name);
        if (dims) cut.rowDims.push_back(-1);  // a row's own tensor holds no rows
      }
  }
  std::set<std::string> places;
  for (const auto& list : rowOwn) places.insert(list.list);
  cut.structure = cutStructure(begin.structure, batchRows.count, rows, places);
  cut.tensors = std::move(out);
  return cut;
}

}  // namespace crashcap::replayer
