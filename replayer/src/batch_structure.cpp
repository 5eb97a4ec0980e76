#include "crashcap/replayer/batch_structure.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <optional>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/dtype.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"

namespace crashcap::replayer {

namespace {

std::optional<nlohmann::json> parsed(const std::string& structure) {
  try {
    return nlohmann::json::parse(structure);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;  // not one the Python recorder wrote: the replay reports it as it rebuilds
  }
}

/// A dict key or field as the recorder names a batch part by it: its text, with each '/' and
/// unprintable character replaced by '_', at most 100 characters.
std::string part(const nlohmann::json& key) {
  std::string text = key.is_string() ? key.get<std::string>() : key.dump();
  std::string out;
  size_t characters = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    const bool continuation = (c & 0xC0) == 0x80;
    if (!continuation && ++characters > 100) break;
    out += c == '/' || c < 0x20 || c == 0x7F ? '_' : text[i];
  }
  return out.empty() ? "_" : out;
}

/// Calls `visit(node, path)` on `node` and, unless it returns true (the node is taken whole), on
/// each part nested in it: tuple and list items, dict values, object fields. `path` is the
/// node's place in the batch as the recorder names its parts ("1/3/boxes"; "" the batch itself).
template <typename Json>
void walk(Json& node, const std::string& path, const std::function<bool(Json&, const std::string&)>& visit) {
  if (!node.is_object() || visit(node, path)) return;
  auto place = [&](const std::string& part) { return path.empty() ? part : path + "/" + part; };
  for (const char* key : {"tuple", "list"})
    if (auto items = node.find(key); items != node.end() && items->is_array()) {
      // A namedtuple's parts are named by its fields, as the recorder names their tensors.
      const auto fields = node.find("fields");
      const bool named = std::strcmp(key, "tuple") == 0 && fields != node.end() && fields->is_array() &&
                         fields->size() == items->size();
      for (size_t i = 0; i < items->size(); ++i)
        walk<Json>((*items)[i], place(named ? part((*fields)[i]) : std::to_string(i)), visit);
    }
  for (const char* key : {"dict", "object"})
    if (auto items = node.find(key); items != node.end() && items->is_array())
      for (auto& pair : *items)
        if (pair.is_array() && pair.size() == 2)
          walk<Json>(pair[1], place(part(pair[0])), visit);
}

/// The names of the tensors under `node`.
void tensorsUnder(const nlohmann::json& node, std::vector<std::string>& out) {
  if (node.is_object())
    if (auto t = node.find("tensor"); t != node.end() && t->is_string()) out.push_back(t->get<std::string>());
  if (node.is_object() || node.is_array())
    for (const auto& sub : node) tensorsUnder(sub, out);
}

/// The place of item `row` of the list at `list` ("1/5"; "5" for the batch itself).
std::string itemPlace(const std::string& list, int64_t row) {
  return (list.empty() ? "" : list + "/") + std::to_string(row);
}

/// Renames the tensors under `node` from item `from` of the list at `list` to item `to`.
void moveItem(nlohmann::json& node, const std::string& list, int64_t from, int64_t to) {
  if (node.is_object())
    if (auto t = node.find("tensor"); t != node.end() && t->is_string())
      if (auto moved = movedItemInput(list, from, to, t->get<std::string>())) *t = *moved;
  if (node.is_object() || node.is_array())
    for (auto& sub : node) moveItem(sub, list, from, to);
}

}  // namespace

std::optional<std::string> movedItemInput(const std::string& list, int64_t from, int64_t to, const std::string& input) {
  const std::string place = itemPlace(list, from);
  if (input == place) return itemPlace(list, to);
  if (input.size() > place.size() && input.compare(0, place.size(), place) == 0 && input[place.size()] == '/')
    return itemPlace(list, to) + input.substr(place.size());
  return std::nullopt;
}

std::string cutStructure(const std::string& structure, int64_t count, const std::vector<int64_t>& rows,
                         const std::set<std::string>& rowOwn) {
  if (structure.empty() || count <= 0) return structure;
  for (int64_t row : rows)
    if (row < 0 || row >= count)
      throw Error(ErrorCode::Internal, fmt::format("cutStructure(): row {} of a batch of {}", row, count));
  auto root = parsed(structure);
  if (!root) return structure;
  auto pick = [&](nlohmann::json& items) {
    nlohmann::json kept = nlohmann::json::array();
    for (int64_t row : rows) kept.push_back(items[static_cast<size_t>(row)]);
    items = std::move(kept);
  };
  // A list of `count` plain values, or a list node of `count` items without a tensor (a collate's
  // per-sample lists of boxes or words), is the rows' (and is not looked into: its items are
  // whole samples). A tuple is the batch's fields.
  bool cut = false;
  walk<nlohmann::json>(*root, "", [&](nlohmann::json& node, const std::string& path) {
    if (rowOwn.count(path)) {
      // Each row's own tensors: the kept items, renamed to their places among the kept rows.
      auto items = node.find("list");
      if (items == node.end()) items = node.find("tuple");
      if (items == node.end() || !items->is_array() || static_cast<int64_t>(items->size()) != count) return false;
      nlohmann::json kept = nlohmann::json::array();
      for (size_t j = 0; j < rows.size(); ++j) {
        kept.push_back((*items)[static_cast<size_t>(rows[j])]);
        moveItem(kept.back(), path, rows[j], static_cast<int64_t>(j));
      }
      *items = std::move(kept);
      return cut = true;
    }
    if (auto v = node.find("value"); v != node.end()) {
      if (v->is_array() && static_cast<int64_t>(v->size()) == count) pick(*v), cut = true;
      return true;
    }
    auto items = node.find("list");
    if (items == node.end() || !items->is_array() || static_cast<int64_t>(items->size()) != count) return false;
    std::vector<std::string> tensors;
    tensorsUnder(*items, tensors);
    if (!tensors.empty()) return false;
    pick(*items);
    return cut = true;
  });
  return cut ? root->dump() : structure;  // nothing cut: as written, byte for byte
}

std::vector<std::pair<std::string, std::vector<int64_t>>> perRowLists(const std::string& structure, int64_t step,
                                                                      int64_t count) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  if (structure.empty() || count <= 0) return out;
  const auto root = parsed(structure);
  if (!root) return out;
  walk<const nlohmann::json>(*root, "", [&](const nlohmann::json& node, const std::string& path) {
    auto v = node.find("value");
    if (v == node.end()) return false;
    if (!v->is_array() || static_cast<int64_t>(v->size()) != count) return true;
    std::vector<int64_t> values;
    for (const auto& x : *v) {
      if (!x.is_number_integer()) return true;
      values.push_back(x.get<int64_t>());
    }
    out.emplace_back(fmt::format("list '{}' of step {}'s batch", path, step), std::move(values));
    return true;
  });
  return out;
}

std::vector<SampleList> perSampleLists(const std::string& structure, int64_t count) {
  std::vector<SampleList> out;
  if (structure.empty() || count <= 0) return out;
  const auto root = parsed(structure);
  if (!root) return out;
  walk<const nlohmann::json>(*root, "", [&](const nlohmann::json& node, const std::string& path) {
    auto items = node.find("list");
    if (items == node.end() && !node.contains("type")) items = node.find("tuple");
    if (items == node.end() || !items->is_array() || static_cast<int64_t>(items->size()) != count) return false;
    SampleList list{path, {}};
    for (const auto& item : *items) {
      list.tensors.emplace_back();
      tensorsUnder(item, list.tensors.back());
      if (list.tensors.back().empty()) return false;
    }
    out.push_back(std::move(list));
    return false;  // a deeper one may be the samples' when this one is the batch's fields
  });
  return out;
}

std::vector<SampleList> rowOwnLists(const formats::StepBeginData& begin, const formats::BundleReader& reader,
                                    const formats::BatchRows& batchRows) {
  const std::string prefix = formats::batchTensorName(begin.step, "");
  std::map<std::string, size_t> position;  // input name -> index in begin.batch
  for (size_t i = 0; i < begin.batch.size(); ++i)
    if (begin.batch[i].rfind(prefix, 0) == 0) position[begin.batch[i].substr(prefix.size())] = i;
  std::vector<SampleList> out;
  auto lists = perSampleLists(begin.structure, batchRows.count);
  std::set<std::string> places;
  for (const auto& list : lists) places.insert(list.list);
  for (auto& list : lists) {
    const bool nested = std::any_of(out.begin(), out.end(), [&](const SampleList& o) {
      return o.list.empty() || list.list.rfind(o.list + "/", 0) == 0;
    });
    if (nested) continue;
    size_t withRows = 0, tensors = 0;
    // Each item's tensors by their place in it, with their rank and dtype: a sample's items are
    // alike (each image's boxes and labels), a batch's fields are not (tokens, a float mask).
    std::vector<std::vector<std::string>> kinds;
    for (size_t row = 0; row < list.tensors.size(); ++row) {
      kinds.emplace_back();
      const std::string place = itemPlace(list.list, static_cast<int64_t>(row));
      for (const auto& input : list.tensors[row]) {
        const auto at = position.find(input);
        const auto* info = at == position.end() ? nullptr : reader.find(begin.batch[at->second]);
        if (!info) continue;
        ++tensors;
        if (at->second < batchRows.dims.size() && batchRows.dims[at->second] >= 0) ++withRows;
        kinds.back().push_back(fmt::format("{}:{}:{}", input.substr(std::min(input.size(), place.size())),
                                           info->shape.size(), formats::dtypeName(info->dtype)));
      }
    }
    bool alike = true;
    for (const auto& k : kinds) alike = alike && k == kinds.front();
    if (tensors > 0 && alike && withRows * 2 < tensors) {
      list.ambiguous = true;
      for (size_t row = 0; row < list.tensors.size(); ++row)
        list.ambiguous = list.ambiguous && places.count(itemPlace(list.list, static_cast<int64_t>(row)));
      out.push_back(std::move(list));
    }
  }
  return out;
}

std::set<std::string> rowOwnTensorNames(const std::vector<SampleList>& lists, int64_t step) {
  std::set<std::string> out;
  for (const auto& list : lists)
    for (const auto& item : list.tensors)
      for (const auto& input : item) out.insert(formats::batchTensorName(step, input));
  return out;
}

std::vector<PackedParts> packedSequences(const std::string& structure) {
  std::vector<PackedParts> out;
  if (structure.empty()) return out;
  const auto root = parsed(structure);
  if (!root) return out;
  walk<const nlohmann::json>(*root, "", [&](const nlohmann::json& node, const std::string& path) {
    const auto type = node.find("type");
    if (type == node.end() || !type->is_string() || *type != "torch.nn.utils.rnn:PackedSequence") return false;
    PackedParts parts{path, {}};
    if (const auto items = node.find("tuple"); items != node.end() && items->is_array())
      for (size_t i = 0; i < items->size() && i < parts.tensors.size(); ++i)
        if (const auto t = (*items)[i].find("tensor"); (*items)[i].is_object() && t != (*items)[i].end() && t->is_string())
          parts.tensors[i] = t->get<std::string>();
    out.push_back(std::move(parts));
    return true;
  });
  return out;
}

std::set<std::string> packedTensorNames(const std::vector<PackedParts>& packed, int64_t step) {
  std::set<std::string> out;
  for (const auto& p : packed)
    for (const auto& input : p.tensors)
      if (!input.empty()) out.insert(formats::batchTensorName(step, input));
  return out;
}

std::optional<std::vector<std::vector<int64_t>>> packedRowPositions(const std::vector<int64_t>& batchSizes,
                                                                    const std::vector<int64_t>& sortedIndices) {
  const int64_t batch = batchSizes.empty() ? 0 : batchSizes.front();
  for (size_t t = 0; t < batchSizes.size(); ++t)
    if (batchSizes[t] <= 0 || (t > 0 && batchSizes[t] > batchSizes[t - 1])) return std::nullopt;
  std::vector<int64_t> place(static_cast<size_t>(batch));
  if (sortedIndices.empty()) {
    for (int64_t r = 0; r < batch; ++r) place[static_cast<size_t>(r)] = r;
  } else {
    if (static_cast<int64_t>(sortedIndices.size()) != batch) return std::nullopt;
    std::vector<bool> seen(place.size());
    for (int64_t i = 0; i < batch; ++i) {
      const int64_t r = sortedIndices[static_cast<size_t>(i)];
      if (r < 0 || r >= batch || seen[static_cast<size_t>(r)]) return std::nullopt;
      seen[static_cast<size_t>(r)] = true;
      place[static_cast<size_t>(r)] = i;
    }
  }
  std::vector<std::vector<int64_t>> out(place.size());
  int64_t offset = 0;
  for (int64_t n : batchSizes) {
    for (size_t r = 0; r < place.size(); ++r)
      if (place[r] < n) out[r].push_back(offset + place[r]);
    offset += n;
  }
  return out;
}

}  // namespace crashcap::replayer
