#pragma once
// `crashcap report`: a Markdown bug report from a crash bundle, in the shape issue trackers ask
// for (summary, environment, steps to reproduce, expected and actual behaviour, logs and stack,
// root cause analysis), with YAML front matter, ready to paste.

#include <cstdint>
#include <optional>
#include <string>

#include "crashcap/investigate/triage.hpp"

namespace crashcap::formats {
struct BundleRecords;
}

namespace crashcap::investigate {

/// The report of `bundle`; with `triage`, its hypothesis table and culprit too. Without triage,
/// `replay` (when given) is the replay it states. `shownAs`: the bundle's name in the report ("":
/// `bundle`), for a report that travels with its bundle under another name. Throws
/// crashcap::Error when the bundle cannot be read.
/// `htmlLink`: the HTML report written beside it, which the Markdown links ("" none).
std::string markdownReport(const std::string& bundle, const std::optional<Triage>& triage,
                           const replayer::ReplayResult* replay = nullptr, const std::string& shownAs = "",
                           const std::string& htmlLink = "");

/// The same facts as one self-contained HTML page with plots (`crashcap report --html`): the loss,
/// gradient norm, weight norm and learning rate of the recorded steps with the crash marked, the
/// first non-finite op's inputs and outputs, the culprit rows beside a normal row of the batch
/// (pictures of image-like rows), the triage table, the environment and the kernel trace. The
/// plots are drawn by Chart.js, embedded in the page: it loads nothing. Throws Error{Unsupported}
/// when this build has no Chart.js (htmlReportAvailable says why).
std::string htmlReport(const std::string& bundle, const std::optional<Triage>& triage,
                       const replayer::ReplayResult* replay = nullptr, const std::string& shownAs = "");
/// Whether this build can write HTML reports; `why` says why not.
bool htmlReportAvailable(std::string* why = nullptr);

/// Both reports' words for a replay of a crash while loading the batch after step `step` that
/// loaded that batch again (replay.batchLoad): whether it failed again, and its samples that fail.
std::string loadingReplayText(const replayer::ReplayResult& replay, const std::string& step);

/// The step both reports name for the failure: the crash record's, else the step the run status
/// says a killed process was in (formats::killedInStep); nullopt when neither says. Whether the
/// failure lies in that step or after it (a crash while loading the next batch) is
/// formats::failedInStep's.
std::optional<int64_t> reportedStep(const formats::BundleRecords& records);

}  // namespace crashcap::investigate
