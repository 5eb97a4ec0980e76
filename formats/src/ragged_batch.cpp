#include "crashcap/formats/ragged_batch.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <set>

#include "crashcap/formats/bundle_reader.hpp"

namespace crashcap::formats {

std::string ConcatenatedTensor::text() const {
  return fmt::format("'{}' [{}] ([{}] at step {})", input, fmt::join(shape, ", "), fmt::join(otherShape, ", "), otherStep);
}

std::vector<ConcatenatedTensor> concatenatedBatchTensors(
    const std::vector<StepBeginData>& begins, int64_t step,
    const std::function<std::vector<int64_t>(const std::string&)>& shapeOf) {
  std::vector<ConcatenatedTensor> out;
  const StepBeginData* begin = nullptr;
  for (const auto& b : begins)
    if (b.step == step) begin = &b;
  if (!begin) return out;
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& name : begin->batch) shapes.push_back(shapeOf(name));
  const auto rows = batchRows(*begin, shapes);
  if (rows.count == 0) return out;
  std::set<int64_t> padded;  // the sizes of the row tensors' other dimensions
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (rows.dims[i] < 0) continue;
    for (size_t d = 0; d < shapes[i].size(); ++d)
      if (static_cast<int>(d) != rows.dims[i]) padded.insert(shapes[i][d]);
  }
  const std::string prefix = batchTensorName(step, "");
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (rows.dims[i] >= 0 || begin->batch[i].rfind(prefix, 0) != 0) continue;
    const std::string input = begin->batch[i].substr(prefix.size());
    const auto& shape = shapes[i];
    for (const auto& other : begins) {
      if (other.step == step) continue;
      const auto otherShape = shapeOf(batchTensorName(other.step, input));
      if (otherShape.size() != shape.size()) continue;
      bool samples = false;
      for (size_t d = 0; d < shape.size(); ++d)
        samples = samples || (otherShape[d] != shape[d] && shape[d] != 1 && !padded.count(shape[d]));
      if (samples) {
        out.push_back({begin->batch[i], input, shape, other.step, otherShape});
        break;
      }
    }
  }
  return out;
}

std::vector<ConcatenatedTensor> concatenatedBatchTensors(const std::vector<StepBeginData>& begins, int64_t step,
                                                         const BundleReader& reader) {
  return concatenatedBatchTensors(begins, step, [&](const std::string& name) {
    const auto* t = reader.find(name);
    return t ? t->shape : std::vector<int64_t>{};
  });
}

std::string concatenatedBatchText(int64_t step, int64_t rows, const std::vector<ConcatenatedTensor>& tensors) {
  std::vector<std::string> texts;
  for (const auto& t : tensors) texts.push_back(t.text());
  return fmt::format("step {}'s batch cannot be cut to some of its {} rows: {} {} none of its rows and changes size from "
                     "step to step, so it holds the samples concatenated (a ragged batch read through offsets, a graph "
                     "batch)",
                     step, rows, fmt::join(texts, ", "), tensors.size() == 1 ? "holds" : "hold");
}

std::string RaggedSpans::text() const { return fmt::format("the {} in {}", offsets ? "offsets" : "lengths", by); }

std::optional<RaggedSpans> raggedSpans(int64_t size,
                                       const std::vector<std::pair<std::string, std::vector<int64_t>>>& perRow,
                                       const std::vector<std::pair<std::string, std::vector<int64_t>>>& lengthsOnly) {
  std::vector<std::pair<const std::pair<std::string, std::vector<int64_t>>*, bool>> candidates;  // with: lengths only
  for (const auto& c : perRow) candidates.emplace_back(&c, false);
  for (const auto& c : lengthsOnly) candidates.emplace_back(&c, true);
  std::optional<RaggedSpans> found;
  for (const auto& [candidate, onlyLengths] : candidates) {
    const auto& [name, values] = *candidate;
    if (values.empty()) continue;
    int64_t sum = 0;
    bool lengths = true, offsets = !onlyLengths && values.front() == 0;
    for (size_t r = 0; r < values.size(); ++r) {
      lengths = lengths && values[r] >= 0 && values[r] <= size - sum;
      if (lengths) sum += values[r];
      offsets = offsets && (r == 0 || values[r] >= values[r - 1]);
    }
    lengths = lengths && sum == size;
    offsets = offsets && values.back() <= size;
    if (lengths && offsets) return std::nullopt;  // either reading fits: neither can be trusted
    if (!lengths && !offsets) continue;
    RaggedSpans s{name, offsets, {}};
    for (size_t r = 0, begin = 0; r < values.size(); ++r) {
      const int64_t b = offsets ? values[r] : static_cast<int64_t>(begin);
      const int64_t e = offsets ? (r + 1 < values.size() ? values[r + 1] : size) : b + values[r];
      s.spans.emplace_back(b, e);
      begin = static_cast<size_t>(e);
    }
    if (found && found->spans != s.spans) return std::nullopt;  // two that disagree: neither says
    if (!found) found = std::move(s);
  }
  return found;
}

}  // namespace crashcap::formats
