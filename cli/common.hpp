#pragma once
// What the crashcap subcommands share: exit codes, JSON output, small text helpers.

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/inspect/stats.hpp"

namespace crashcap::cli {

using nlohmann::json;

constexpr int kExitOk = 0;
constexpr int kExitCheckFailed = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitInternal = 3;

/// Prints JSON; bytes from a bundle that are not valid UTF-8 (a note, a hostname) become U+FFFD
/// instead of aborting the output.
inline void printJson(const json& j) { std::cout << j.dump(2, ' ', false, json::error_handler_t::replace) << "\n"; }

inline inspect::HostTensor loadTensor(const formats::BundleReader& reader, const std::string& name) {
  const auto& t = reader.get(name);
  inspect::HostTensor h;
  h.dtype = t.dtype;
  h.shape = t.shape;
  h.bytes = reader.readTensor(t);
  return h;
}

/// The last non-empty line (TorchScript errors put the original message last).
inline std::string lastLineOf(const std::string& text) {
  auto end = text.find_last_not_of("\n ");
  if (end == std::string::npos) return text;
  auto start = text.rfind('\n', end);
  size_t from = start == std::string::npos ? 0 : start + 1;
  return text.substr(from, end - from + 1);
}

inline std::string joinRows(const std::vector<int64_t>& rows) {
  std::string s;
  for (auto r : rows) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

/// "0,3,5" -> {0, 3, 5}; anything else is a usage error naming the bad part.
inline std::vector<int64_t> parseRows(const std::string& text) {
  std::vector<int64_t> rows;
  size_t at = 0;
  while (at < text.size()) {
    size_t comma = text.find(',', at);
    std::string part = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    try {
      size_t used = 0;
      rows.push_back(std::stoll(part, &used));
      if (used != part.size()) throw std::invalid_argument(part);
    } catch (const std::exception&) {
      throw Error(ErrorCode::InvalidArgument, fmt::format("--rows: '{}' is not a row number", part),
                  "give comma-separated batch rows, e.g. --rows 0,3,5");
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return rows;
}

}  // namespace crashcap::cli
