#pragma once
// `crashcap report`: a Markdown bug report from a crash bundle, in the shape issue trackers ask
// for (summary, environment, steps to reproduce, expected and actual behaviour, logs and stack,
// root cause analysis), with YAML front matter, ready to paste.

#include <optional>
#include <string>

#include "crashcap/investigate/triage.hpp"

namespace crashcap::investigate {

/// The report of `bundle`; with `triage`, its hypothesis table and culprit too. Without triage,
/// `replay` (when given) is the replay it states. `shownAs`: the bundle's name in the report ("":
/// `bundle`), for a report that travels with its bundle under another name. Throws
/// crashcap::Error when the bundle cannot be read.
std::string markdownReport(const std::string& bundle, const std::optional<Triage>& triage,
                           const replayer::ReplayResult* replay = nullptr, const std::string& shownAs = "");

}  // namespace crashcap::investigate
