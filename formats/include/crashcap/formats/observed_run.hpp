#pragma once
// `crashcap run --record` tells the child to record itself through one environment variable
// (its value: the Recorder's keywords, JSON); the supervision record keeps the child's
// environment, so a bundle says whether its run was recorded from the inside.

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace crashcap::formats {

inline constexpr std::string_view kObserveVariable = "CRASHCAP_OBSERVE";

/// Whether `environment` (NAME=VALUE, the supervision record's) asked the child to record itself.
inline bool askedToRecord(const std::vector<std::string>& environment) {
  return std::any_of(environment.begin(), environment.end(), [](const std::string& e) {
    return e.size() > kObserveVariable.size() && e.compare(0, kObserveVariable.size(), kObserveVariable) == 0 &&
           e[kObserveVariable.size()] == '=';
  });
}

}  // namespace crashcap::formats
