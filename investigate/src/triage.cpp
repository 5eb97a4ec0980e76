// `crashcap triage`: the plan of experiments that establishes the facts, and the facts read
// from the bundle itself; the rules that judge them are in triage_rules.cpp.
#include "crashcap/investigate/triage.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
#include <map>
#include <regex>
#include <set>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/dtype.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/ragged_batch.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/formats/torch/settings.hpp"
#include "crashcap/inspect/host_tensor.hpp"
#include "crashcap/inspect/slice.hpp"
#include "crashcap/inspect/stats.hpp"
#include "crashcap/investigate/replays.hpp"
#include "crashcap/investigate/results_json.hpp"
#include "crashcap/replayer/batch_structure.hpp"

namespace crashcap::investigate {

using nlohmann::json;

namespace {

bool integerDtype(const std::string& dtype) { return dtype.rfind("int", 0) == 0 || dtype.rfind("uint", 0) == 0; }

int64_t elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

/// The index domain one recorded op call declares, if it is an op with one.
std::optional<IndexDomain> domainOf(const formats::OpData& op) {
  const auto& in = op.inputs;
  if (in.size() < 2) return std::nullopt;
  IndexDomain d;
  d.op = op.name;
  // aten::embedding(weight [V, D], indices), aten::embedding_bag(weight, indices, offsets, ...)
  if (op.name.find("embedding") != std::string::npos && op.name.find("backward") == std::string::npos &&
      in[0].shape.size() == 2 && integerDtype(in[1].dtype)) {
    d.size = in[0].shape[0];
    d.indexShape = in[1].shape;
    d.sourceShape = in[0].shape;
    return d;
  }
  // aten::nll_loss*(logits [N, C, ...], target): also what cross_entropy calls.
  if ((op.name.find("nll_loss") != std::string::npos || op.name.find("cross_entropy") != std::string::npos) &&
      op.name.find("backward") == std::string::npos && in[0].shape.size() >= 2 && integerDtype(in[1].dtype)) {
    d.size = in[0].shape[1];
    d.indexShape = in[1].shape;
    d.sourceShape = in[0].shape;
    d.ignoreIndex = -100;  // the loss's ignore_index: PyTorch's default (the op trace keeps no scalar values)
    return d;
  }
  // aten::gather(self, dim, index), aten::scatter*(self, dim, index, src|value), and the same with
  // the dim last (take_along_dim): the index has self's rank, and along every dimension but the
  // indexed one it is no larger than self. The trace keeps no scalar values, so the dimension is
  // the one where their sizes differ; where several do, or none does and self's sizes differ, the
  // op names no one domain.
  const bool gather = op.name == "aten::gather" || op.name == "aten::take_along_dim";
  const bool scatter = op.name.rfind("aten::scatter", 0) == 0 && op.name.find("backward") == std::string::npos;
  if ((gather || scatter) && in.size() >= 2) {
    const auto& self = in[0];
    const formats::OpInputData* index = nullptr;
    for (size_t k = 1; k < in.size() && !index; ++k)
      if (integerDtype(in[k].dtype) && in[k].shape.size() == self.shape.size()) index = &in[k];
    if (!index || self.shape.empty() || self.dtype == "scalar" || self.dtype == "none" || self.dtype == "other")
      return std::nullopt;
    int64_t dim = -1;
    int differing = 0;
    for (size_t k = 0; k < self.shape.size(); ++k)
      if (index->shape[k] != self.shape[k]) {
        dim = static_cast<int64_t>(k);
        ++differing;
      }
    if (differing == 0 && std::all_of(self.shape.begin(), self.shape.end(),
                                      [&](int64_t s) { return s == self.shape[0]; }))
      dim = 0;
    else if (differing != 1 || self.shape[static_cast<size_t>(dim)] == 1)  // 1: broadcast (take_along_dim)
      return std::nullopt;
    d.size = self.shape[static_cast<size_t>(dim)];
    d.indexShape = index->shape;
    d.sourceShape = self.shape;
    return d;
  }
  return std::nullopt;
}

/// The largest finite magnitude in `t`, 0 when none.
double largestMagnitude(const inspect::TensorStats& st) {
  double m = 0;
  if (st.min) m = std::max(m, std::abs(*st.min));
  if (st.max) m = std::max(m, std::abs(*st.max));
  return m;
}

/// The first value of `row` outside `d` (a loss's ignore_index is inside), nullopt when none.
std::optional<double> firstOutside(const inspect::HostTensor& row, const IndexDomain& d) {
  const uint64_t n = row.numel();
  for (uint64_t i = 0; i < n; ++i) {
    double v = row.at(i);
    if (v >= static_cast<double>(d.size)) return v;
    if (v < 0 && !d.negativesInside && !(d.ignoreIndex && v == static_cast<double>(*d.ignoreIndex))) return v;
  }
  return std::nullopt;
}

/// Whether an op's index input of shape `index` can be a part of a batch tensor of shape `shape`
/// whose rows run along `rowDim`: the index's dimensions are the tensor's in order, some of them
/// dropped (an integer index, `labels[:, 0]`) and the others no larger (a slice, a language model's
/// `tokens[:, :-1]`), the rows kept whole. Shapes alone: the op trace does not say which tensor an
/// op took.
bool partOf(const std::vector<int64_t>& index, const std::vector<int64_t>& shape, int rowDim) {
  if (index.empty() || index.size() > shape.size() || rowDim < 0 || static_cast<size_t>(rowDim) >= shape.size())
    return false;
  // Match index dimension i with tensor dimension j or a later one; the row dimension is never dropped.
  std::function<bool(size_t, size_t)> match = [&](size_t i, size_t j) {
    if (i == index.size()) return j > static_cast<size_t>(rowDim);
    if (j == shape.size()) return false;
    const bool row = j == static_cast<size_t>(rowDim);
    if ((row ? index[i] == shape[j] : index[i] <= shape[j]) && match(i + 1, j + 1)) return true;
    return !row && match(i, j + 1);
  };
  return match(0, 0);
}

/// Whether two domains are one table's, one logits' or one indexed tensor's: a loss and the ops
/// nested in it (cross_entropy_loss, nll_loss_nd, nll_loss or nll_loss2d, nll_loss_forward) are one
/// domain, as are a loss's default and inferred ignore_index.
bool sameTable(const IndexDomain& a, const IndexDomain& b) {
  // By element count: nll_loss_nd reshapes logits of more than two dimensions for nll_loss2d.
  return a.size == b.size && elements(a.sourceShape) == elements(b.sourceShape) &&
         a.ignoreIndex.has_value() == b.ignoreIndex.has_value();
}

/// How many times every other row's largest magnitude a row must reach to be an outlier.
constexpr double kOutlierFactor = 100;

/// For a [rows, features] tensor: the feature of row `r` that is furthest beyond the other rows'
/// largest magnitude in that feature (by kOutlierFactor or more), as an Outlier finding (row
/// and tensor left to the caller). A feature of small scale hides in a row-wide maximum.
template <typename IsCulprit>
std::optional<RowFinding> columnOutlier(const inspect::HostTensor& t, int64_t r, const IsCulprit& isCulprit) {
  if (t.shape.size() != 2 || formats::isComplex(t.dtype)) return std::nullopt;
  const int64_t rows = t.shape[0], features = t.shape[1];
  std::optional<RowFinding> best;
  double bestRatio = kOutlierFactor;
  for (int64_t j = 0; j < features; ++j) {
    double others = 0;
    for (int64_t o = 0; o < rows; ++o) {
      if (isCulprit(o)) continue;
      double v = std::abs(t.at(static_cast<uint64_t>(o * features + j)));
      if (std::isfinite(v)) others = std::max(others, v);
    }
    double mine = std::abs(t.at(static_cast<uint64_t>(r * features + j)));
    if (others > 0 && std::isfinite(mine) && mine > bestRatio * others) {
      bestRatio = mine / others;
      RowFinding f;
      f.kind = RowFinding::Kind::Outlier;
      f.value = mine;
      f.othersMax = others;
      f.column = j;
      best = f;
    }
  }
  return best;
}

/// Step `step`'s StepBegin record, the last when the bundle holds several (nullptr: none).
const formats::StepBeginData* stepBeginOf(const formats::BundleRecords& records, int64_t step) {
  const formats::StepBeginData* begin = nullptr;
  for (const auto& b : records.stepBegins)
    if (b.step == step) begin = &b;
  return begin;
}

}  // namespace

std::string IndexDomain::describe() const {
  if (raisedValue && ignoreIndex)
    return fmt::format("the error says target {} is out of bounds, and the loss ({}) sees {} classes (logits [{}])",
                       *raisedValue, op, size, fmt::join(sourceShape, ","));
  if (raisedValue)
    return fmt::format("the error says index {} is out of bounds for dimension {} with size {}", *raisedValue,
                       raisedDim, size);
  if (ignoreIndex)
    return fmt::format("the loss ({}) sees {} classes (logits [{}])", op, size, fmt::join(sourceShape, ","));
  if (op.find("embedding") != std::string::npos)
    return fmt::format("the embedding ({}) has {} rows (table [{}])", op, size, fmt::join(sourceShape, ","));
  return fmt::format("{} indexes {} positions along a dimension of its input [{}] (index [{}])", op, size,
                     fmt::join(sourceShape, ","), fmt::join(indexShape, ","));
}

std::optional<IndexDomain> domainOfError(const std::string& error, const std::vector<IndexDomain>& traced) {
  // "index 9 is out of bounds for dimension 1 with size 4", possibly after an op's name; a
  // classification loss's "Target 9 is out of bounds." (nll_loss, and cross_entropy through it).
  static const std::regex pattern(
      R"(index (-?[0-9]+) is out of bounds for dimension (-?[0-9]+) with size ([0-9]+)|Target (-?[0-9]+) is out of bounds)");
  // The last such sentence: an error text may carry earlier, chained ones before it.
  std::smatch m;
  bool found = false;
  for (auto it = std::sregex_iterator(error.begin(), error.end(), pattern); it != std::sregex_iterator(); ++it) {
    m = *it;
    found = true;
  }
  if (!found) return std::nullopt;
  try {
    if (m[4].matched) {
      // The loss's wording has no size: the loss that raised is the newest one the trace holds.
      const auto loss = std::find_if(traced.begin(), traced.end(),
                                     [](const IndexDomain& d) { return d.ignoreIndex && !d.raisedValue; });
      if (loss == traced.end()) return std::nullopt;
      IndexDomain d = *loss;
      d.raisedValue = std::stoll(m[4].str());
      d.indexShape.clear();  // judged by the value it names, as the other errors' domains
      return d;
    }
    IndexDomain d;
    d.raisedValue = std::stoll(m[1].str());
    d.raisedDim = std::stoll(m[2].str());
    d.size = std::stoll(m[3].str());
    return d;
  } catch (const std::exception&) {  // a number beyond int64: no domain
    return std::nullopt;
  }
}

std::vector<IndexDomain> findIndexDomains(const std::string& bundle, bool beyondRing) {
  auto reader = formats::BundleReader::open(bundle);
  auto records = formats::readRecords(*reader);
  std::vector<IndexDomain> out;
  // The ring's ops, then the index ops older than its oldest that the recorder kept beside it:
  // the newest step's of them (an earlier step's may have indexed other shapes).
  std::vector<formats::OpData> ops;
  if (records.opTrace) {
    static const std::vector<formats::OpData> none;
    const auto& kept = beyondRing ? records.opTrace->indexOps : none;
    int64_t newest = INT64_MIN;
    for (const auto& op : kept) newest = std::max(newest, op.step);
    for (const auto& op : kept)
      if (op.step == newest) ops.push_back(op);
    ops.insert(ops.end(), records.opTrace->ops.begin(), records.opTrace->ops.end());
  }
  // Every distinct domain, newest first (several embedding tables: tokens, positions, segments).
  for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
    auto d = domainOf(*it);
    if (!d) continue;
    bool seen = std::any_of(out.begin(), out.end(), [&](const IndexDomain& o) {
      return o.op == d->op && o.sourceShape == d->sourceShape && o.indexShape == d->indexShape;
    });
    if (!seen) out.push_back(*d);
  }
  // The error's own domain first: it is the check that failed.
  if (records.crash)
    if (auto d = domainOfError(records.crash->error, out)) out.insert(out.begin(), *d);
  return out;
}

std::optional<ValueFloor> valueFloorOf(const replayer::ProbedOp& op) {
  std::string name = op.name;
  if (name.size() > 1 && name.back() == '_') name.pop_back();  // in place: aten::log_
  static const std::set<std::string> belowZeroIsNaN = {"aten::log", "aten::log2", "aten::log10", "aten::sqrt",
                                                       "aten::rsqrt"};
  if (op.phase != "forward" || !belowZeroIsNaN.count(name)) return std::nullopt;
  std::optional<ValueFloor> floor;
  for (const auto& in : op.inputs)
    if (in.min && *in.min < 0 && (!floor || *in.min < floor->given)) floor = ValueFloor{op.name, *in.min};
  return floor;
}

std::optional<ZeroGiven> zeroGivenOf(const replayer::ProbedOp& op) {
  std::string name = op.name;
  if (name.size() > 1 && name.back() == '_') name.pop_back();
  static const std::set<std::string> noFiniteResultAtZero = {
      "aten::div", "aten::true_divide", "aten::reciprocal", "aten::log", "aten::log2", "aten::log10",
      "aten::rsqrt", "aten::pow"};
  if (!noFiniteResultAtZero.count(name)) return std::nullopt;
  // The input that has no finite result at 0: a division's divisor (a 0 it divides is 0), else the
  // one the op takes the log, reciprocal or power of.
  const size_t at = name == "aten::div" || name == "aten::true_divide" ? 1 : 0;
  if (op.inputs.size() <= at) return std::nullopt;
  const auto& in = op.inputs[at];
  if ((in.min && *in.min == 0.0) || (in.max && *in.max == 0.0)) return ZeroGiven{op.name, op.phase};
  return std::nullopt;
}

std::vector<RowFinding> findRowOddities(const std::string& bundle, int64_t step, const std::vector<int64_t>& rows,
                                        const std::vector<IndexDomain>& domains, const std::optional<ValueFloor>& floor,
                                        const std::optional<ZeroGiven>& zero) {
  std::vector<RowFinding> out;
  auto reader = formats::BundleReader::open(bundle);
  const std::string index = formats::batchTensorName(step, formats::kDatasetIndexName);
  auto isCulprit = [&](int64_t r) { return std::find(rows.begin(), rows.end(), r) != rows.end(); };
  const auto records = formats::readRecords(*reader);
  // Another loader's batch, kept at a crash between steps, is read as a step's.
  const auto other = step == formats::kCrashBatchStep && records.crash ? formats::otherBatchBegin(*records.crash)
                                                                       : std::nullopt;
  const formats::StepBeginData* begin = other ? &*other : stepBeginOf(records, step);
  if (!begin) return out;
  const auto batchRows = formats::batchRows(*begin, *reader);
  const int64_t batch = batchRows.count;
  // Every batch tensor with rows, and each of its rows with its statistics: a culprit row is
  // judged against the batch's other rows. A row is an index into the tensor's row dimension
  // (":,5" in a sequence-first tensor). Loaded once per tensor, not per culprit row. Only what
  // the findings below read is kept: the rows of integer tensors (judged against the ops' index
  // domains) and the values of [rows, features] floating ones (a feature's outlier); of the
  // others (images, activations: the batch's bulk), the statistics, so that a large batch is
  // held about one tensor at a time, not twice over.
  struct Loaded {
    const formats::TensorInfo* info = nullptr;
    int rowDim = 0;
    inspect::HostTensor t;  ///< its bytes only when a [rows, features] floating tensor
    std::vector<inspect::HostTensor> rowTensors;  ///< integer tensors only
    std::vector<inspect::TensorStats> stats;
    bool floating = false, integer = false;
    std::vector<IndexDomain> applicable;
    std::vector<std::string> rowNames;  ///< per row, its own tensor (a list of rows' own); else empty
  };
  // A PackedSequence's tensors hold no rows, whatever their sizes: its rows are gathered below.
  const auto packedSequences = replayer::packedSequences(begin->structure);
  const auto packedNames = replayer::packedTensorNames(packedSequences, step);
  // Nor do a list of each row's own tensors (replayer::rowOwnLists): their rows are gathered below.
  const auto rowOwn = batch > 0 ? replayer::rowOwnLists(*begin, *reader, batchRows) : std::vector<replayer::SampleList>{};
  const auto ownNames = replayer::rowOwnTensorNames(rowOwn, step);
  std::vector<Loaded> loaded;
  for (size_t i = 0; i < begin->batch.size(); ++i) {
    const auto* info = reader->find(begin->batch[i]);
    const int rowDim = batchRows.dims[i];
    if (!info || info->name == index || rowDim < 0 || batch == 0 || packedNames.count(info->name) ||
        ownNames.count(info->name))
      continue;
    Loaded l;
    l.info = info;
    l.rowDim = rowDim;
    l.t = inspect::loadTensor(*reader, info->name);
    l.floating = formats::isFloating(l.t.dtype) || formats::isComplex(l.t.dtype);
    l.integer = !l.floating && l.t.dtype != formats::DType::Bool;
    std::string leading;
    for (int d = 0; d < rowDim; ++d) leading += ":,";
    for (int64_t r = 0; r < batch; ++r) {
      auto row = inspect::applySlice(l.t, inspect::parseSlice(leading + std::to_string(r)));
      l.stats.push_back(inspect::computeStats(row));
      if (l.integer) l.rowTensors.push_back(std::move(row));
    }
    if (!(l.floating && rowDim == 0 && l.t.shape.size() == 2)) std::vector<uint8_t>().swap(l.t.bytes);
    loaded.push_back(std::move(l));
  }
  // A PackedSequence's data holds each row's time steps at the places its batch_sizes and
  // sorted_indices tell (replayer::packedRowPositions): each row's are gathered and judged as a row
  // of a tensor with rows is. Its integer data (token ids) is judged against the domains too.
  for (const auto& packed : packedSequences) {
    auto name = [&](size_t k) { return formats::batchTensorName(step, packed.tensors[k]); };
    const auto* info = packed.tensors[0].empty() ? nullptr : reader->find(name(0));
    if (!info || packed.tensors[1].empty() || !reader->find(name(1))) continue;
    auto longs = [&](size_t k) {
      const auto t = inspect::loadTensor(*reader, name(k));
      std::vector<int64_t> v;
      for (uint64_t i = 0; i < t.numel(); ++i) v.push_back(static_cast<int64_t>(t.at(i)));
      return v;
    };
    const bool sorted = !packed.tensors[2].empty() && reader->find(name(2));
    const auto sizes = longs(1);
    const auto positions = replayer::packedRowPositions(sizes, sorted ? longs(2) : std::vector<int64_t>{});
    if (!positions || static_cast<int64_t>(positions->size()) != batch) continue;
    Loaded l;
    l.info = info;
    l.rowDim = -1;  // no row dimension: no feature columns to judge
    const auto data = inspect::loadTensor(*reader, info->name);
    int64_t total = 0;
    for (int64_t n : sizes) total += n;
    if (data.shape.empty() || data.shape[0] != total) continue;  // data that does not fit its batch_sizes
    l.t.dtype = data.dtype;  // its shape for the domains an op's index input of that shape has; no bytes
    l.t.shape = data.shape;
    l.floating = formats::isFloating(data.dtype) || formats::isComplex(data.dtype);
    l.integer = !l.floating && data.dtype != formats::DType::Bool;
    uint64_t stride = 1;  // elements per time step
    for (size_t d = 1; d < data.shape.size(); ++d) stride *= static_cast<uint64_t>(data.shape[d]);
    const size_t rowBytes = stride * formats::elementSize(data.dtype);
    for (const auto& at : *positions) {
      inspect::HostTensor row;
      row.dtype = data.dtype;
      row.shape = data.shape;
      row.shape[0] = static_cast<int64_t>(at.size());
      for (int64_t p : at) {
        if (p < 0 || p >= data.shape[0]) break;
        const auto* from = data.bytes.data() + static_cast<size_t>(p) * rowBytes;
        row.bytes.insert(row.bytes.end(), from, from + rowBytes);
      }
      if (row.bytes.size() != at.size() * rowBytes) break;  // data shorter than its batch_sizes
      l.stats.push_back(inspect::computeStats(row));
      if (l.integer) l.rowTensors.push_back(std::move(row));
    }
    if (static_cast<int64_t>(l.stats.size()) == batch) loaded.push_back(std::move(l));
  }
  // A list of each row's own tensors (replayer::rowOwnLists: a collate's per-sample targets): row
  // r's tensor at a place in its item ("boxes") is that row's, judged against the other rows' at
  // the same place, and named as itself ("1/5/boxes").
  for (const auto& list : rowOwn) {
    if (list.ambiguous || static_cast<int64_t>(list.tensors.size()) != batch) continue;  // rows unknown
    for (size_t k = 0; k < list.tensors.front().size(); ++k) {
      Loaded l;
      l.rowDim = -1;  // no row dimension: no feature columns to judge
      for (int64_t r = 0; r < batch; ++r) {
        const auto& item = list.tensors[static_cast<size_t>(r)];
        const auto* info = k < item.size() ? reader->find(formats::batchTensorName(step, item[k])) : nullptr;
        if (!info) break;
        const auto row = inspect::loadTensor(*reader, info->name);
        if (r == 0) {
          l.info = info;
          l.t.dtype = row.dtype;
          l.floating = formats::isFloating(row.dtype) || formats::isComplex(row.dtype);
          l.integer = !l.floating && row.dtype != formats::DType::Bool;
        }
        if (row.dtype != l.t.dtype) break;
        // As a loss takes them, concatenated (an index domain of that shape applies).
        if (r == 0 || l.t.shape.empty() || row.shape.empty()) l.t.shape = row.shape;
        else l.t.shape[0] += row.shape[0];
        l.rowNames.push_back(info->name);
        l.stats.push_back(inspect::computeStats(row));
        if (l.integer) l.rowTensors.push_back(row);
      }
      if (static_cast<int64_t>(l.stats.size()) == batch) loaded.push_back(std::move(l));
    }
  }
  // The domains that apply to each tensor: an op's index input of its shape (or element count,
  // when the program flattens it) that every other row of the batch fits. Two tables indexed by
  // same-shaped tensors (user and item ids) are told apart by the rows that work.
  auto othersFit = [&](const Loaded& l, const IndexDomain& d) {
    for (int64_t o = 0; o < batch; ++o)
      if (!isCulprit(o) && firstOutside(l.rowTensors[o], d)) return false;
    return true;
  };
  // A domain read from the error has no index shape: it applies to the tensors whose culprit rows
  // hold the value the error names and nothing else outside it (ids of a larger table that happen
  // to include the value are not what the error indexed with; with every row a culprit, the other
  // rows tell nothing). A loss's target may also hold its ignore_index, which the trace does not
  // keep: one negative value the tensor's rows share is taken for it, as below.
  auto raisedIn = [&](const Loaded& l, const IndexDomain& d) -> std::optional<IndexDomain> {
    const double value = static_cast<double>(*d.raisedValue);
    bool holds = false;
    std::set<double> negatives;
    for (int64_t r = 0; r < batch; ++r) {
      const auto& row = l.rowTensors[static_cast<size_t>(r)];
      for (uint64_t i = 0; i < row.numel(); ++i) {
        const double v = row.at(i);
        if (v == value) {
          holds = holds || isCulprit(r);
        } else if (d.ignoreIndex && v < 0) {
          negatives.insert(v);
        } else if (isCulprit(r) && (v < 0 || v >= static_cast<double>(d.size))) {
          return std::nullopt;
        }
      }
    }
    if (!holds || negatives.size() > 1) return std::nullopt;
    IndexDomain applied = d;
    if (!negatives.empty()) applied.ignoreIndex = static_cast<int64_t>(*negatives.begin());
    return applied;
  };
  for (IndexDomain d : domains) {
    if (d.raisedValue) {
      for (auto& l : loaded)
        if (l.integer)
          if (auto applied = raisedIn(l, d); applied && othersFit(l, *applied)) l.applicable.push_back(*applied);
      continue;
    }
    std::vector<Loaded*> candidates;
    std::set<const Loaded*> parts;  // candidates the op's index input is only a part of, by shape
    for (auto& l : loaded) {
      if (!l.integer) continue;
      if (d.indexShape == l.t.shape || elements(d.indexShape) == elements(l.t.shape)) {
        candidates.push_back(&l);
      } else if (partOf(d.indexShape, l.t.shape, l.rowDim)) {
        candidates.push_back(&l);
        parts.insert(&l);
      }
    }
    auto apply = [&](Loaded& l, IndexDomain applied) {
      if (parts.count(&l)) applied.wholeShape = l.t.shape;
      l.applicable.push_back(std::move(applied));
    };
    if (!d.ignoreIndex) {
      for (Loaded* l : candidates)
        if (othersFit(*l, d)) apply(*l, d);
      continue;
    }
    // A loss's target. Its ignore_index is not in the op trace. Where a tensor's working rows hold
    // PyTorch's default (-100) and fit it, that is the target's padding: the tensors that fit the
    // default get the domain, and no other value is inferred (ids beside it with their own -1
    // marker would pass for the target). Otherwise each tensor's working rows hold no negative
    // target but the ignore_index (the loss raises on any other), so one negative value they
    // share, the padding of a sequence's targets, is the program's ignore_index.
    auto holdsDefault = [&](const Loaded& l) {
      for (int64_t o = 0; o < batch; ++o) {
        if (isCulprit(o)) continue;
        const auto& row = l.rowTensors[o];
        for (uint64_t i = 0; i < row.numel(); ++i)
          if (row.at(i) == static_cast<double>(*d.ignoreIndex)) return true;
      }
      return false;
    };
    const bool defaultHeld = std::any_of(candidates.begin(), candidates.end(),
                                         [&](const Loaded* l) { return holdsDefault(*l) && othersFit(*l, d); });
    for (Loaded* l : candidates) {
      if (othersFit(*l, d)) {
        apply(*l, d);
        continue;
      }
      if (defaultHeld) continue;
      std::set<double> negatives;
      for (int64_t o = 0; o < batch && negatives.size() < 2; ++o) {
        if (isCulprit(o)) continue;
        const auto& row = l->rowTensors[o];
        for (uint64_t i = 0; i < row.numel() && negatives.size() < 2; ++i)
          if (row.at(i) < 0) negatives.insert(row.at(i));
      }
      if (negatives.size() != 1) continue;
      IndexDomain inferred = d;
      inferred.ignoreIndex = static_cast<int64_t>(*negatives.begin());
      if (othersFit(*l, inferred)) apply(*l, inferred);
    }
  }
  // A domain matched by the tensor's whole shape (or named by the error) before one matched by a
  // part of it: the first a row falls outside is the finding's.
  for (auto& l : loaded)
    std::stable_partition(l.applicable.begin(), l.applicable.end(),
                          [](const IndexDomain& d) { return d.wholeShape.empty(); });
  // No value of the rows that work is 0, judged against enough values that a feature often 0
  // would have shown one: 8 other rows and 64 values at least, as for a sign.
  auto othersNeverZero = [&](const Loaded& l) {
    int64_t otherRows = 0;
    uint64_t otherValues = 0;
    for (int64_t o = 0; o < batch; ++o) {
      if (isCulprit(o)) continue;
      if (l.stats[o].zeroCount > 0) return false;
      ++otherRows;
      otherValues += l.stats[o].count;
    }
    return otherRows >= 8 && otherValues >= 64;
  };
  for (const Loaded& l : loaded) {
    const auto* info = l.info;
    const int rowDim = l.rowDim;
    const auto& t = l.t;
    const auto& rowTensors = l.rowTensors;
    const auto& stats = l.stats;
    const bool floating = l.floating;
    const auto& applicable = l.applicable;
    for (int64_t r : rows) {
      if (r < 0 || r >= batch) continue;
      const auto& st = stats[r];
      RowFinding f;
      f.row = r;
      f.tensor = l.rowNames.empty() ? info->name : l.rowNames[static_cast<size_t>(r)];
      f.oneElement = st.count == 1;
      double othersMax = 0;
      bool othersAllZero = true;
      for (int64_t o = 0; o < batch; ++o) {
        if (isCulprit(o)) continue;
        othersMax = std::max(othersMax, largestMagnitude(stats[o]));
        othersAllZero = othersAllZero && stats[o].zeroCount == stats[o].count;
      }
      if (st.nanCount || st.posInfCount || st.negInfCount) {
        f.kind = RowFinding::Kind::NonFinite;
        f.nanCount = st.nanCount;
        f.infCount = st.posInfCount + st.negInfCount;
        out.push_back(f);
        continue;
      }
      bool found = false;
      for (const IndexDomain& d : applicable) {
        if (auto bad = firstOutside(rowTensors[r], d)) {
          f.kind = RowFinding::Kind::OutOfDomain;
          f.value = *bad;
          f.domain = d;
          // A domain the step's error named is the check that failed; one matched by shape alone
          // has rivals wherever another op takes an index input of the same shape.
          if (!d.raisedValue)
            for (const IndexDomain& other : applicable)
              if (!other.raisedValue && !sameTable(other, d) &&
                  std::none_of(f.otherDomains.begin(), f.otherDomains.end(),
                               [&](const auto& o) { return sameTable(o.first, other); }))
                f.otherDomains.emplace_back(other, firstOutside(rowTensors[r], other));
          out.push_back(f);
          found = true;
          break;
        }
      }
      if (found) continue;
      // A length or a count of nothing: one integer per row, 0 in this row and positive in every
      // other (sequence lengths, a 0 where the rest hold 3..11). A tensor an op indexes with (a
      // label, a token) is left to its domain: class 0 is an ordinary label. 8 other rows at least.
      if (l.integer && applicable.empty() && st.count == 1 && st.min && *st.min == 0) {
        int64_t otherRows = 0;
        double othersMin = 0;
        bool othersPositive = true;
        for (int64_t o = 0; o < batch && othersPositive; ++o)
          if (!isCulprit(o)) {
            othersPositive = stats[o].count == 1 && stats[o].min && *stats[o].min >= 1;
            if (othersPositive) othersMin = otherRows++ ? std::min(othersMin, *stats[o].min) : *stats[o].min;
          }
        if (othersPositive && otherRows >= 8) {
          f.kind = RowFinding::Kind::LoneZero;
          f.value = 0;
          f.othersMin = othersMin;
          f.othersMax = othersMax;
          out.push_back(f);
          continue;
        }
      }
      // A sign the rest of the batch never has (pixels, probabilities below 0): what a log or a
      // square root downstream cannot take. Floating tensors only (a negative integer target is
      // padding, which a loss's domain judges), and against enough values that a signed feature
      // would have shown its sign: 8 other rows and 64 values at least.
      int64_t otherRows = 0;
      uint64_t otherValues = 0;
      bool othersNonNegative = formats::isFloating(t.dtype);
      for (int64_t o = 0; o < batch && othersNonNegative; ++o)
        if (!isCulprit(o)) {
          ++otherRows;
          otherValues += stats[o].count;
          othersNonNegative = stats[o].min && *stats[o].min >= 0;
        }
      // Where the step's first NaN is an op's that takes nothing below 0 and was given this row's
      // very lowest value, two other rows that are never negative are enough: the op says what the
      // tensor may hold (a log-space target), and the value ties the row to the op.
      const bool byBatch = otherRows >= 8 && otherValues >= 64;
      const bool byOp = floor && otherRows >= 2 && st.min && *st.min == floor->given;
      if (othersNonNegative && (byBatch || byOp) && st.min && *st.min < 0) {
        f.kind = RowFinding::Kind::Negative;
        f.value = *st.min;
        if (!byBatch) f.floor = floor;
        out.push_back(f);
        continue;
      }
      const double magnitude = largestMagnitude(st);
      if (floating && othersMax > 0 && magnitude > kOutlierFactor * othersMax) {
        f.kind = RowFinding::Kind::Outlier;
        f.value = magnitude;
        f.othersMax = othersMax;
        out.push_back(f);
      } else if (auto column = floating && rowDim == 0 ? columnOutlier(t, r, isCulprit) : std::nullopt) {
        out.push_back(*column);
        out.back().row = r;
        out.back().tensor = info->name;
      } else if (st.count > 1 && st.zeroCount == st.count && !othersAllZero) {
        f.kind = RowFinding::Kind::AllZeros;
        out.push_back(f);
      } else if (zero && floating && st.zeroCount > 0 && othersNeverZero(l)) {
        // Exact zeros no other row has, and an op that has no finite result at 0 was given one:
        // what it divided by, or took the log of.
        f.kind = RowFinding::Kind::ZeroGiven;
        f.value = static_cast<double>(st.zeroCount);
        f.zero = zero;
        if (rowDim == 0 && t.shape.size() == 2)
          for (int64_t j = 0; j < t.shape[1] && f.column < 0; ++j)
            if (t.at(static_cast<uint64_t>(r * t.shape[1] + j)) == 0.0) f.column = j;
        out.push_back(f);
      }
    }
  }
  return out;
}

std::optional<std::vector<RowFinding>> findOtherBatchOddities(const std::string& bundle,
                                                              const std::vector<IndexDomain>& domains) {
  std::vector<IndexDomain> applied;
  int64_t rows = 0;
  {
    auto reader = formats::BundleReader::open(bundle);
    const auto records = formats::readRecords(*reader);
    const auto other = records.crash ? formats::otherBatchBegin(*records.crash) : std::nullopt;
    if (!other) return std::nullopt;
    const auto batchRows = formats::batchRows(*other, *reader);
    rows = batchRows.count;
    const std::string index = formats::batchTensorName(formats::kCrashBatchStep, formats::kDatasetIndexName);
    bool samples = false;  // a tensor with rows that is the batch's own, not its dataset indices
    for (size_t i = 0; i < other->batch.size(); ++i)
      samples = samples || (other->batch[i] != index && batchRows.dims[i] >= 0 && reader->find(other->batch[i]));
    if (rows <= 0 || !samples) return std::nullopt;
    // The op trace holds the steps' ops (what runs between steps is not traced): an index input
    // with the steps' row count first is the steps' batch's, and the same op given this batch
    // takes it with this batch's row count (a validation batch of another size).
    const int64_t stepRows = records.stepBegins.empty() ? 0 : formats::batchRows(records.stepBegins.back(), *reader).count;
    for (const auto& d : domains) {
      IndexDomain own = d;
      own.negativesInside = !d.raisedValue;  // padding, as a rule; a negative index the error names is judged
      applied.push_back(own);
      if (d.raisedValue || d.indexShape.empty() || stepRows <= 0 || rows == stepRows || d.indexShape[0] != stepRows)
        continue;
      own.indexShape[0] = rows;
      if (d.ignoreIndex && !own.sourceShape.empty() && own.sourceShape[0] == stepRows)
        own.sourceShape[0] = rows;  // a loss's logits have the batch's rows too
      applied.push_back(std::move(own));
    }
  }
  // No row was tested by leaving it out, so each row is judged against the batch's others. First
  // the suspects: the rows that hold NaN/Inf, and those outside a domain the rest of the batch
  // fits. Only a few rows (a quarter of the batch at most) can be suspects of one domain: a domain
  // many rows fall outside is not this batch's (another vocabulary, a label tensor shaped like the
  // tokens), and a value outside it that several rows share alike is a marker (a segmentation's
  // void 255), not bad data. Then the suspects against the rest, as culprit rows are judged (a
  // domain applies only where every other row fits it).
  std::vector<int64_t> all(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) all[static_cast<size_t>(r)] = r;
  const auto few = [&](size_t n) { return n > 0 && static_cast<int64_t>(n) * 4 <= std::max<int64_t>(rows, 4); };
  std::set<int64_t> suspects, nonFinite;
  for (const auto& finding : findRowOddities(bundle, formats::kCrashBatchStep, all, {}))
    if (finding.kind == RowFinding::Kind::NonFinite) nonFinite.insert(finding.row);
  if (static_cast<int64_t>(nonFinite.size()) < rows) suspects = nonFinite;  // NaN in every row tells nothing of one
  for (const auto& d : applied) {
    std::map<int64_t, double> outside;  // row -> its first value outside
    for (const auto& finding : findRowOddities(bundle, formats::kCrashBatchStep, all, {d}))
      if (finding.kind == RowFinding::Kind::OutOfDomain) outside.emplace(finding.row, finding.value);
    std::set<double> values;
    for (const auto& [row, value] : outside) values.insert(value);
    const bool marker = outside.size() > 1 && values.size() == 1 && !d.raisedValue;
    if (few(outside.size()) && !marker)
      for (const auto& [row, value] : outside) suspects.insert(row);
  }
  std::vector<RowFinding> out;
  if (suspects.empty()) return out;
  if (static_cast<int64_t>(suspects.size()) < rows)
    out = findRowOddities(bundle, formats::kCrashBatchStep, {suspects.begin(), suspects.end()}, applied);
  out.erase(std::remove_if(out.begin(), out.end(), [](const RowFinding& r) { return !r.invalid(); }), out.end());
  for (auto& finding : out)
    if (auto index = datasetIndices(bundle, formats::kCrashBatchStep, {finding.row}, std::nullopt))
      finding.datasetIndex = index->front();
  return out;
}

std::vector<ConcatenatedValue> findConcatenatedValues(const std::string& bundle, int64_t step,
                                                      const std::vector<IndexDomain>& domains,
                                                      const std::optional<replayer::RowOrder>& order) {
  std::vector<ConcatenatedValue> out;
  auto reader = formats::BundleReader::open(bundle);
  const auto records = formats::readRecords(*reader);
  const formats::StepBeginData* begin = stepBeginOf(records, step);
  if (!begin) return out;
  const auto concatenated = formats::concatenatedBatchTensors(records.stepBegins, step, *reader);
  if (concatenated.empty()) return out;
  const auto batchRows = formats::batchRows(*begin, *reader);
  const std::string index = formats::batchTensorName(step, formats::kDatasetIndexName);
  // A PackedSequence's tensors are neither concatenated samples with spans nor lengths or offsets
  // (its batch_sizes sums to its data's length), nor are a list of each row's own tensors (their
  // sizes change from row to row): findRowOddities gathers the rows of both.
  auto rowsGathered = replayer::packedTensorNames(replayer::packedSequences(begin->structure), step);
  for (const auto& name : replayer::rowOwnTensorNames(replayer::rowOwnLists(*begin, *reader, batchRows), step))
    rowsGathered.insert(name);
  // Tensors of one integer per row: the candidates for lengths or offsets (formats::raggedSpans).
  std::vector<std::pair<std::string, std::vector<int64_t>>> perRow;
  for (size_t i = 0; i < begin->batch.size(); ++i) {
    const auto* info = reader->find(begin->batch[i]);
    if (!info || info->name == index || batchRows.dims[i] != 0 || info->shape.size() != 1 || rowsGathered.count(info->name))
      continue;
    if (formats::isFloating(info->dtype) || formats::isComplex(info->dtype) || info->dtype == formats::DType::Bool) continue;
    const auto t = inspect::loadTensor(*reader, info->name);
    std::vector<int64_t> values;
    for (uint64_t r = 0; r < t.numel(); ++r) values.push_back(static_cast<int64_t>(t.at(r)));
    perRow.emplace_back(info->name, std::move(values));
  }
  const auto lists = replayer::perRowLists(begin->structure, step, batchRows.count);  // lengths as Python lists
  std::optional<inspect::HostTensor> indices;
  if (reader->find(index)) indices = inspect::loadTensor(*reader, index);
  for (const auto& c : concatenated) {
    const auto* info = reader->find(c.name);
    if (!info || c.shape.empty() || formats::isFloating(info->dtype) || formats::isComplex(info->dtype) ||
        info->dtype == formats::DType::Bool || rowsGathered.count(c.name))
      continue;
    // Where each row's samples lie in it, along dimension 0.
    const auto spans = c.shape[0] != (c.otherShape.empty() ? c.shape[0] : c.otherShape[0])
                           ? formats::raggedSpans(c.shape[0], perRow, lists)
                           : std::nullopt;
    std::optional<inspect::HostTensor> t;
    for (const IndexDomain& d : domains) {
      if (d.indexShape != c.shape && !d.raisedValue) continue;
      if (!t) t = inspect::loadTensor(*reader, c.name);
      const uint64_t n = t->numel();
      // ... and only in a tensor whose every other value it holds: ids of a larger table that
      // happen to include the value are not what the error indexed with.
      if (d.raisedValue) {
        bool fits = true;
        for (uint64_t i = 0; i < n && fits; ++i) {
          const double v = t->at(i);
          fits = v == static_cast<double>(*d.raisedValue) || (v >= 0 && v < static_cast<double>(d.size)) ||
                 (d.ignoreIndex && v < 0);  // a loss's ignore_index, as below
        }
        if (!fits) continue;
      }
      for (uint64_t i = 0; i < n; ++i) {
        const double v = t->at(i);
        if (v >= 0 && v < static_cast<double>(d.size)) continue;
        // A domain read from the error judges only the value the error names.
        if (d.raisedValue && v != static_cast<double>(*d.raisedValue)) continue;
        // A loss's negative targets are its ignore_index, which only rows could tell (findRowOddities).
        if (d.ignoreIndex && v < 0) continue;
        ConcatenatedValue f;
        f.tensor = c.name;
        f.element = static_cast<int64_t>(i);
        f.position = c.shape[0] > 0 ? static_cast<int64_t>(i / (n / static_cast<uint64_t>(c.shape[0]))) : 0;
        f.value = v;
        f.domain = d;
        // The row whose span holds its position.
        if (spans)
          for (size_t r = 0; r < spans->spans.size(); ++r)
            if (spans->spans[r].first <= f.position && f.position < spans->spans[r].second) {
              f.row = static_cast<int64_t>(r);
              f.spansBy = spans->by;
              f.byOffsets = spans->offsets;
            }
        if (f.row && order && order->matched()) {  // a collate function reordered the rows
          if (auto own = datasetIndices(bundle, step, {*f.row}, order)) f.datasetIndex = own->front();
        } else if (f.row && indices && static_cast<uint64_t>(*f.row) < indices->numel()) {
          f.datasetIndex = static_cast<int64_t>(indices->at(static_cast<uint64_t>(*f.row)));
        }
        out.push_back(std::move(f));
        break;
      }
    }
  }
  return out;
}

std::optional<ShortBatch> findShortBatch(const std::string& bundle, int64_t step) {
  auto reader = formats::BundleReader::open(bundle);
  const auto records = formats::readRecords(*reader);
  const formats::StepBeginData* begin = stepBeginOf(records, step);
  if (!begin) return std::nullopt;
  const int64_t rows = formats::batchRows(*begin, *reader).count;
  if (rows <= 0) return std::nullopt;
  std::map<int64_t, int64_t> counts;  // rows -> earlier steps with that many
  int64_t earlier = 0;
  for (const auto& b : records.stepBegins) {
    if (b.step >= step || b.batch.size() != begin->batch.size()) continue;  // another loader's batch
    const int64_t n = formats::batchRows(b, *reader).count;
    if (n <= 0) continue;  // its tensors are gone (retention)
    ++earlier;
    ++counts[n];
  }
  const auto usual = std::max_element(counts.begin(), counts.end(),
                                      [](const auto& a, const auto& b) { return a.second < b.second; });
  if (usual == counts.end() || usual->first <= rows || usual->second < 3 || 2 * usual->second <= earlier)
    return std::nullopt;
  return ShortBatch{rows, usual->first, usual->second};
}

std::optional<PaddingRow> findPaddingRow(const std::string& bundle, int64_t step,
                                         const std::optional<replayer::RowOrder>& order) {
  auto reader = formats::BundleReader::open(bundle);
  const auto records = formats::readRecords(*reader);
  const formats::StepBeginData* begin = stepBeginOf(records, step);
  if (!begin) return std::nullopt;
  const auto batchRows = formats::batchRows(*begin, *reader);
  const int64_t batch = batchRows.count;
  if (batch < 3) return std::nullopt;
  const std::string index = formats::batchTensorName(step, formats::kDatasetIndexName);
  const std::string prefix = formats::batchTensorName(step, "");
  // The largest size along `dim` the batch tensor `name` had in the steps before `step`.
  auto earlierExtent = [&](const std::string& name, int dim) {
    int64_t largest = 0;
    for (const auto& b : records.stepBegins) {
      if (b.step >= step) continue;
      const auto* info = reader->find(formats::batchTensorName(b.step, name));
      if (info && static_cast<int>(info->shape.size()) > dim) largest = std::max(largest, info->shape[dim]);
    }
    return largest;
  };
  constexpr uint64_t kLargest = uint64_t(1) << 26;  // elements read; a larger tensor is passed over
  for (size_t i = 0; i < begin->batch.size(); ++i) {
    const auto* info = reader->find(begin->batch[i]);
    const int rowDim = batchRows.dims[i];
    if (!info || info->name == index || rowDim < 0 || info->shape.size() < 2 || formats::isComplex(info->dtype) ||
        info->dtype == formats::DType::Bool || elements(info->shape) > static_cast<int64_t>(kLargest))
      continue;
    const auto t = inspect::loadTensor(*reader, info->name);
    const auto& shape = t.shape;
    const int dims = static_cast<int>(shape.size());
    // Per row: its non-zeros, and along each dimension its extent (one past the last non-zero
    // index).
    std::vector<int64_t> extent(static_cast<size_t>(batch * dims), 0), nonZero(static_cast<size_t>(batch), 0);
    const uint64_t n = t.numel();
    std::vector<int64_t> at(dims, 0);
    for (uint64_t k = 0; k < n; ++k) {
      if (t.at(k) != 0) {
        const int64_t r = at[rowDim];
        ++nonZero[r];
        for (int d = 0; d < dims; ++d) extent[r * dims + d] = std::max(extent[r * dims + d], at[d] + 1);
      }
      for (int d = dims - 1; d >= 0 && ++at[d] == shape[d]; --d) at[d] = 0;
    }
    for (int d = 0; d < dims; ++d) {
      if (d == rowDim || shape[d] < 2) continue;
      int64_t top = -1, first = 0, second = 0;
      bool dense = true;
      for (int64_t r = 0; r < batch && dense; ++r) {
        const int64_t e = extent[r * dims + d];
        // Non-zero in 90% of its own extent (its elements per index along d, times e): padded
        // values, not sparse ones (a one-hot row, an image's black background).
        const int64_t perIndex = elements(shape) / shape[rowDim] / shape[d];
        dense = e > 0 && 10 * nonZero[r] >= 9 * perIndex * e;
        if (e > first) {
          second = first;
          first = e;
          top = r;
        } else if (e > second) {
          second = e;
        }
      }
      // The row sets the padded size (the tensor ends where it does: a batch padded to a fixed
      // length is not one), and that size is new: every earlier step the bundle holds, which the
      // recording saw pass, had this tensor shorter along d. A flag column set in one row, or a
      // longest sequence no longer than earlier batches', is not it.
      if (!dense || top < 0 || first <= second || first != shape[d] ||
          earlierExtent(info->name.substr(prefix.size()), d) >= first)
        continue;
      PaddingRow p{info->name, d, top, first, second, std::nullopt};
      if (auto indices = datasetIndices(bundle, step, {top}, order); indices && indices->size() == 1) p.datasetIndex = indices->front();
      return p;
    }
  }
  return std::nullopt;
}

Triage runTriage(const std::string& asked, const TriageOptions& options) {
  ExperimentRunner runner(options.experiments);
  const std::string timeout = fmt::format("{}", runner.timeoutSeconds());
  // A failed experiment, or one whose output holds no result of the bundle (a job's rank that gave
  // none), is a missing fact: its log entry says why.
  auto run = [&](const std::string& name, std::vector<std::string> args, auto fromJson, double scale = 1) {
    auto e = runner.run(name, args, scale);
    using Result = decltype(fromJson(*e.output));
    if (!e.output) return std::optional<Result>();
    try {
      return std::optional(fromJson(*e.output));
    } catch (const Error&) {
      return std::optional<Result>();
    }
  };
  Triage t;
  TriageFacts& f = t.facts;
  f.bundle = asked;
  std::optional<formats::BundleRecords> records;
  try {
    records = formats::readRecords(*formats::BundleReader::open(asked));
  } catch (const Error&) {
    // A bundle too damaged to read (investigated with --allow-damaged): the experiments say what fails.
  }
  if (records && records->distributed && records->distributed->worldSize > 1) {
    // A job's rank: a rank whose failure came from a peer holds no cause in its own batch; the
    // rank that failed first on its own does.
    auto origin = jobRankOrigin(asked);
    JobTriage j;
    j.jobId = origin.jobId;
    j.worldSize = origin.worldSize;
    j.rank = j.askedRank = origin.rank;
    j.askedBundle = asked;
    j.firstFailed = origin.firstFailed;
    if (origin.fromPeer && origin.firstFailed >= 0 && origin.firstFailed != origin.rank &&
        !origin.firstFailedBundle.empty()) {
      try {
        records = formats::readRecords(*formats::BundleReader::open(origin.firstFailedBundle));
        j.rank = origin.firstFailed;
        f.bundle = origin.firstFailedBundle;
      } catch (const Error&) {
        // Unreadable: the asked rank is triaged; its replay still runs the whole job.
      }
    }
    f.job = j;
  }
  const std::string& bundle = f.bundle;
  if (records) {
    if (records->crash) {
      f.crashStep = records->crash->step;
      f.crashPhase = records->crash->phase;
      f.crashError = records->crash->error;
      if (formats::otherBatchBegin(*records->crash)) f.otherLoader = records->crash->otherLoader;
    }
    if (records->program && records->program->format != "torchscript") {
      // A setModel recording replays in its own program, which needs its step function and its
      // command line: when one is missing, every experiment would fail the same way; say it once.
      try {
        replayRoute(bundle);
      } catch (const Error& e) {
        f.replayOutcome = e.message() + (e.hint().empty() ? "" : "; " + e.hint());
        t.hypotheses = judge(f);
        t.culprit = findCulprit(f);
        return t;
      }
    }
  }
  {
    auto e = runner.run("reproduce", {"replay", bundle, "--json"});
    if (e.output) {
      try {
        f.replay = bundleReplayFromJson(*e.output);
      } catch (const Error& err) {
        f.replayOutcome = err.message();
      }
      if (f.job && e.output->contains("ranks")) try {
          for (const auto& r : jobReplayFromJson(*e.output).ranks) f.job->verdicts.emplace_back(r.rank, r.verdict);
        } catch (const Error&) {
          // f.replay's reading said the same
        }
    } else {
      f.replayOutcome = e.outcome;
    }
  }
  // When the replay gave up the newest keyframe (it misses state the program keeps), the
  // bisections start from the one it settled on instead of finding it again each.
  auto withKeyframe = [&](std::vector<std::string> args) {
    if (f.replay)
      for (auto& a : keyframeArgs(*f.replay)) args.push_back(std::move(a));
    return args;
  };
  f.steps = run("bisect-steps", {"bisect", "steps", bundle, "--json"}, stepBisectionFromJson);
  // A program killed or hung again answered with no steps: its batch can be tested only when it
  // died in the failing step itself (its rows are cut there). A batch that failed to load is not
  // the recorded one: the replay that loaded it again named its samples that fail.
  if (f.reproduced() && !f.replay->batchLoad && (!f.replay->steps.empty() || f.replay->diedInStep == f.replay->step)) {
    const int64_t batchSize = f.replay->batchSize;
    f.samples = run("bisect-samples", withKeyframe({"bisect", "samples", bundle, "--json", "--timeout", timeout}),
                    sampleBisectionFromJson,
                    // + a smallest set's rows each; a second search in full-size batches may follow, with its control
                    2 * (2 * std::log2(batchSize + 1) + 3 + 3) + 1);
    if (!f.samples) f.samplesOutcome = runner.log().back().outcome;
    const auto rows = f.culpritRows();
    std::vector<int64_t> rest;
    for (int64_t r = 0; r < batchSize; ++r)
      if (std::find(rows.begin(), rows.end(), r) == rows.end()) rest.push_back(r);
    if (!rows.empty() && !rest.empty()) {
      // A step that cannot run on fewer rows: the rest copied in turn to the batch's size.
      if (!f.samples->filledBecause.empty()) rest = filledRows(rest, batchSize);
      std::vector<std::string> extra = {"--rows", fmt::format("{}", fmt::join(rest, ","))};
      for (auto& a : keyframeArgs(*f.replay)) extra.push_back(std::move(a));
      // Instrumented for a mean of nothing: the op the rows left fail at tells whether they too give
      // the loss nothing to average.
      f.withoutRows = run("without-rows", replayArgs(bundle, f.step(), extra, f.emptyMean() != nullptr),
                          bundleReplayFromJson);
      if (!f.withoutRows) {
        f.withoutRowsOutcome = runner.log().back().outcome;
      } else if (f.withoutRows->steps.empty() && f.withoutRows->diedInStep && *f.withoutRows->diedInStep < f.step()) {
        // Killed again before the step whose rows it cut: it says nothing about them.
        f.withoutRowsOutcome = fmt::format("it died in step {}, before step {} whose rows it cut",
                                           *f.withoutRows->diedInStep, f.step());
        f.withoutRows.reset();
      }
    }
    const auto domains = findIndexDomains(bundle);
    if (!rows.empty()) {
      std::optional<ValueFloor> floor;
      std::optional<ZeroGiven> zero;
      if (f.replay && f.replay->firstNonFiniteOp) {
        floor = valueFloorOf(*f.replay->firstNonFiniteOp);
        zero = zeroGivenOf(*f.replay->firstNonFiniteOp);
      }
      f.rowFindings = findRowOddities(bundle, f.step(), rows, domains, floor, zero);
    } else if (f.samples ? !f.samples->cutsFail.empty() : !f.samplesOutcome.empty()) {
      // No part of the batch can run, or the search gave no result (a batch that cannot be cut to
      // some of its rows: a PackedSequence; a timeout), so no row was tested: what each row holds
      // is still worth saying, where it needs no other rows to judge it (NaN/Inf, the index the
      // error names).
      std::vector<int64_t> all(static_cast<size_t>(std::max<int64_t>(batchSize, 0)));
      for (int64_t r = 0; r < batchSize; ++r) all[static_cast<size_t>(r)] = r;
      std::vector<IndexDomain> raised;
      for (const auto& d : domains)
        if (d.raisedValue) raised.push_back(d);
      try {
        for (auto& finding : findRowOddities(bundle, f.step(), all, raised))
          if (finding.kind == RowFinding::Kind::NonFinite || finding.kind == RowFinding::Kind::OutOfDomain)
            f.untestedRowFindings.push_back(std::move(finding));
      } catch (const Error&) {
        // A batch tensor that cannot be read (a damaged bundle): the experiments said what they could.
      }
      if (f.untestedRowFindings.size() > kListedUntestedFindings) {
        f.untestedFindingsLeftOut = f.untestedRowFindings.size() - kListedUntestedFindings;
        f.untestedRowFindings.resize(kListedUntestedFindings);
      }
      try {
        for (auto& finding : f.untestedRowFindings)
          if (auto index = datasetIndices(bundle, f.step(), {finding.row}, f.replay ? f.replay->rowOrder : std::nullopt))
            finding.datasetIndex = index->front();
      } catch (const Error&) {
        // An index tensor that cannot be read: the rows are named by their place.
      }
    }
    try {
      f.paddingRow = findPaddingRow(bundle, f.step(), f.replay ? f.replay->rowOrder : std::nullopt);
      f.shortBatch = findShortBatch(bundle, f.step());
      f.concatenatedValues = findConcatenatedValues(bundle, f.step(), domains, f.replay ? f.replay->rowOrder : std::nullopt);
    } catch (const Error&) {
      // A batch tensor that cannot be read: the experiments above said what they could.
    }
    if (f.emptyMean()) {
      // The batch as a whole is the finding: all its samples are named.
      std::vector<int64_t> all(static_cast<size_t>(std::max<int64_t>(batchSize, 0)));
      for (int64_t r = 0; r < batchSize; ++r) all[static_cast<size_t>(r)] = r;
      try {
        f.batchDatasetIndices = datasetIndices(bundle, f.step(), all, f.replay->rowOrder);
      } catch (const Error&) {
        // An index tensor that cannot be read: the batch is named without its samples.
      }
    }
  }
  // Another loader's batch, kept at a crash between steps: no experiment can cut its rows.
  if (f.otherLoader >= 0) try {
      if (auto findings = findOtherBatchOddities(bundle, findIndexDomains(bundle, /*beyondRing=*/true))) {
        f.otherBatchFindings = std::move(*findings);
        f.otherBatchJudged = true;
      }
    } catch (const Error&) {
      // A tensor of it that cannot be read (a damaged bundle): the crash is judged without it.
    }
  // Ops and settings are tested at the failing step: pointless when replay cannot reach it. A batch
  // that failed to load failed in no op of the step (whose float64 replay loads nothing after it).
  if (!f.replayBlocked()) {
    if (!(f.replay && f.replay->batchLoad))
      f.ops = run("bisect-ops", withKeyframe({"bisect", "ops", bundle, "--json"}), opBisectionFromJson);
    f.config = run("bisect-config", withKeyframe({"bisect", "config", bundle, "--json", "--timeout", timeout}),
                   configBisectionFromJson,
                   formats::torch::settingNames().size() + replayer::availableDevices().size() + 1);
  }
  t.hypotheses = judge(f);
  t.culprit = findCulprit(f);
  t.experiments = runner.log();
  return t;
}

json toJson(const Hypothesis& h) {
  return {{"id", h.id}, {"verdict", verdictName(h.verdict)}, {"evidence", h.evidence}, {"rerun", h.rerun}};
}

json toJson(const Triage& t, bool withReplay) {
  const auto& f = t.facts;
  json hypotheses = json::array();
  for (const auto& h : t.hypotheses) hypotheses.push_back(toJson(h));
  auto opt = [](const auto& v) { return v ? json(*v) : json(nullptr); };
  const auto& c = t.culprit;
  json out = {{"bundle", f.bundle},
              {"reproduced", f.reproduced()},
              {"verdict", f.replay ? json(replayer::verdictName(f.replay->verdict)) : json(nullptr)},
              {"step", f.step() >= 0 ? json(f.step()) : json(nullptr)},
              {"hypotheses", hypotheses},
              {"culprit",
               {{"rank", opt(c.rank)},
                {"step", opt(c.step)},
                {"loader", opt(c.loader)},
                {"rows", opt(c.rows)},
                {"dataset_indices", opt(c.datasetIndices)},
                {"op", opt(c.op)},
                {"phase", opt(c.phase)},
                {"node", opt(c.node)},
                {"changes", opt(c.changes)},
                {"value", c.value ? json{{"tensor", c.value->tensor},
                                         {"element", c.value->element},
                                         {"value", c.value->value},
                                         {"spans_by", c.value->row ? json(c.value->spansBy) : json(nullptr)},
                                         {"spans", c.value->row ? json(c.value->byOffsets ? "offsets" : "lengths")
                                                                : json(nullptr)},
                                         {"row", opt(c.value->row)},
                                         {"dataset_index", opt(c.value->datasetIndex)}}
                                  : json(nullptr)},
                {"short_batch", c.shortBatch ? json{{"rows", c.shortBatch->rows},
                                                    {"usual_rows", c.shortBatch->usualRows},
                                                    {"steps_usual", c.shortBatch->stepsUsual}}
                                             : json(nullptr)},
                {"empty_mean", c.emptyMean ? json{{"empty", c.emptyMean->empty},
                                                  {"targets", c.emptyMean->targets},
                                                  {"ignored", c.emptyMean->ignored},
                                                  {"ignore_index", opt(c.emptyMean->ignoreIndex)},
                                                  {"of", c.emptyMean->of.empty() ? json(nullptr) : json(c.emptyMean->of)}}
                                           : json(nullptr)}}},
              {"notes", f.replay ? json(f.replay->notes) : json::array()},
              {"job", nullptr},
              {"experiments", experimentLogJson(t.experiments)}};
  if (f.job) {
    json ranks = json::array();
    for (const auto& [rank, verdict] : f.job->verdicts)
      ranks.push_back({{"rank", rank}, {"verdict", verdict.empty() ? json(nullptr) : json(verdict)}});
    out["job"] = {{"job_id", f.job->jobId},
                  {"world_size", f.job->worldSize},
                  {"rank", f.job->rank},
                  {"asked_rank", f.job->askedRank},
                  {"asked_bundle", f.job->askedBundle},
                  {"first_failed", f.job->firstFailed >= 0 ? json(f.job->firstFailed) : json(nullptr)},
                  {"ranks", ranks}};
  }
  if (withReplay) out["replay"] = f.replay ? toJson(*f.replay) : json(nullptr);
  return out;
}

}  // namespace crashcap::investigate
