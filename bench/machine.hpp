// What a benchmark ran on, for its JSON: results are compared on one machine and written down
// with the machine they came from (docs/PERFORMANCE.md), because the same code gives different
// ratios on different processors.
#pragma once

#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

namespace crashcap::bench {

/// The processor's model name from /proc/cpuinfo ("unknown" where it has none).
inline std::string cpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

/// {"cpu": model name, "cores": cores this process may use}.
inline nlohmann::json machine() { return {{"cpu", cpuModel()}, {"cores", std::thread::hardware_concurrency()}}; }

}  // namespace crashcap::bench
