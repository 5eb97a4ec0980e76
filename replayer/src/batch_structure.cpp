#include "crashcap/replayer/batch_structure.hpp"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "crashcap/formats/error.hpp"

namespace crashcap::replayer {

namespace {

bool holdsTensor(const nlohmann::json& node) {
  if (node.is_object() && node.contains("tensor")) return true;
  if (node.is_object() || node.is_array())
    for (const auto& sub : node)
      if (holdsTensor(sub)) return true;
  return false;
}

nlohmann::json pick(const nlohmann::json& items, const std::vector<int64_t>& rows) {
  nlohmann::json kept = nlohmann::json::array();
  for (int64_t row : rows) kept.push_back(items[static_cast<size_t>(row)]);
  return kept;
}

/// Cuts `node`'s per-row parts; true when it cut one. A list of `count` plain values, or a list
/// node of `count` items without a tensor (a collate's per-sample lists of boxes or words), is
/// the rows' (and is not looked into: its items are whole samples). A tuple is the batch's fields.
bool cutValues(nlohmann::json& node, int64_t count, const std::vector<int64_t>& rows) {
  if (!node.is_object()) return false;
  if (auto v = node.find("value"); v != node.end()) {
    if (!v->is_array() || static_cast<int64_t>(v->size()) != count) return false;
    *v = pick(*v, rows);
    return true;
  }
  if (auto items = node.find("list");
      items != node.end() && items->is_array() && static_cast<int64_t>(items->size()) == count && !holdsTensor(*items)) {
    *items = pick(*items, rows);
    return true;
  }
  bool cut = false;
  for (const char* key : {"tuple", "list"})
    if (auto items = node.find(key); items != node.end() && items->is_array())
      for (auto& sub : *items) cut = cutValues(sub, count, rows) || cut;
  for (const char* key : {"dict", "object"})
    if (auto items = node.find(key); items != node.end() && items->is_array())
      for (auto& pair : *items)
        if (pair.is_array() && pair.size() == 2) cut = cutValues(pair[1], count, rows) || cut;
  return cut;
}

/// The lists of `count` integers under `node`, `path` its place ("3", "inputs/lengths").
void findPerRowLists(const nlohmann::json& node, const std::string& path, int64_t step, int64_t count,
                     std::vector<std::pair<std::string, std::vector<int64_t>>>& out) {
  if (!node.is_object()) return;
  auto place = [&](const std::string& part) { return path.empty() ? part : path + "/" + part; };
  if (auto v = node.find("value"); v != node.end()) {
    if (!v->is_array() || static_cast<int64_t>(v->size()) != count) return;
    std::vector<int64_t> values;
    for (const auto& x : *v) {
      if (!x.is_number_integer()) return;
      values.push_back(x.get<int64_t>());
    }
    out.emplace_back(fmt::format("list '{}' of step {}'s batch", path, step),
                     std::move(values));
    return;
  }
  for (const char* key : {"tuple", "list"})
    if (auto items = node.find(key); items != node.end() && items->is_array())
      for (size_t i = 0; i < items->size(); ++i) findPerRowLists((*items)[i], place(std::to_string(i)), step, count, out);
  for (const char* key : {"dict", "object"})
    if (auto items = node.find(key); items != node.end() && items->is_array())
      for (const auto& pair : *items)
        if (pair.is_array() && pair.size() == 2)
          findPerRowLists(pair[1], place(pair[0].is_string() ? pair[0].get<std::string>() : pair[0].dump()), step, count,
                          out);
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> perRowLists(const std::string& structure, int64_t step,
                                                                      int64_t count) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  if (structure.empty() || count <= 0) return out;
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(structure);
  } catch (const nlohmann::json::exception&) {
    return out;
  }
  findPerRowLists(root, "", step, count, out);
  return out;
}

std::string cutStructure(const std::string& structure, int64_t count, const std::vector<int64_t>& rows) {
  if (structure.empty() || count <= 0) return structure;
  for (int64_t row : rows)
    if (row < 0 || row >= count)
      throw Error(ErrorCode::Internal, fmt::format("cutStructure(): row {} of a batch of {}", row, count));
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(structure);
  } catch (const nlohmann::json::exception&) {
    return structure;  // not one the Python recorder wrote: the replay reports it as it rebuilds
  }
  if (!cutValues(root, count, rows)) return structure;  // as written, byte for byte
  return root.dump();
}

}  // namespace crashcap::replayer
