#include "command.hpp"

#include <algorithm>
#include <cstring>

namespace crashcap::cli {
namespace {

std::vector<std::pair<int, CommandFactory>>& registry() {
  static std::vector<std::pair<int, CommandFactory>> commands;  // built before main(), read after
  return commands;
}

}  // namespace

bool registerCommand(int order, CommandFactory factory) {
  registry().emplace_back(order, factory);
  return true;
}

std::vector<CommandFactory> registeredCommands() {
  auto sorted = registry();
  std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<CommandFactory> out;
  for (const auto& [order, factory] : sorted) out.push_back(factory);
  return out;
}

const char* torchCommandSummary(const std::string& name) {
  for (const auto& c : kTorchCommands)
    if (name == c.name) return c.summary;
  return "";
}

}  // namespace crashcap::cli
