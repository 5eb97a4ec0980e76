#pragma once
// Reading `crashcap triage --json`: a hypothesis by id, and whether its evidence says something.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <string>

namespace crashcap::test {

inline const nlohmann::json& hypothesis(const nlohmann::json& triage, const std::string& id) {
  for (const auto& h : triage["hypotheses"])
    if (h["id"] == id) return h;
  FAIL("no hypothesis " << id);
  static nlohmann::json none;
  return none;
}

inline bool evidenceHas(const nlohmann::json& h, const std::string& text) {
  for (const auto& e : h["evidence"])
    if (e.get<std::string>().find(text) != std::string::npos) return true;
  return false;
}

}  // namespace crashcap::test
