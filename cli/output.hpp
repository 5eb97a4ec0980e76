#pragma once
// What the crashcap subcommands share when they print: exit codes, JSON output, progress lines,
// the options of the commands that open a bundle, and small parsers for option values.

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "crashcap/formats/limits.hpp"

namespace crashcap::cli {

using nlohmann::json;

// The exit codes (README.md, "Exit codes"); only main() turns errors into them.
constexpr int kExitOk = 0;
constexpr int kExitCheckFailed = 1;
constexpr int kExitBadInput = 2;
constexpr int kExitInternal = 3;

/// Prints JSON; bytes from a bundle that are not valid UTF-8 (a note, a hostname) become U+FFFD
/// instead of aborting the output.
void printJson(const json& j);
/// The text printJson prints, for a file (--json-out).
std::string jsonText(const json& j);

/// Progress on stderr for long scans ("what: 42% (...)"), only when stderr is a terminal.
formats::Progress progressPrinter(const char* what);
/// Clears a progress line (if one was drawn) before the result is printed.
void endProgress();

/// Options of the commands that open a bundle.
struct ReadOptions {
  bool json = false;
  uint64_t maxTensorBytes = formats::ReaderLimits{}.maxTensorBytes;
  formats::ReaderLimits limits() const;
};
void addReadOptions(CLI::App* cmd, ReadOptions& o);

/// "0,3,5" -> {0, 3, 5}; anything else is Error{InvalidArgument} naming the bad part.
std::vector<int64_t> parseRows(const std::string& text);
/// {0, 3, 5} -> "0,3,5".
std::string joinRows(const std::vector<int64_t>& rows);

/// "25M" -> 25000000: a number with an optional unit, K, M, G (powers of 1000) or KiB, MiB, GiB
/// (powers of 1024), B allowed after K/M/G; anything else is Error{InvalidArgument} naming `option`.
uint64_t parseByteSize(const std::string& text, const std::string& option);

/// Writes `text` to `path` through `path.partial` and a rename, so a reader never sees half a file.
void writeFileAtomically(const std::string& path, const std::string& text);

/// Runs a command on its bundle argument. When `bundle` names a job archive (crashcap merge), the
/// archive is extracted into a directory of its own for the command's duration and `bundle` names
/// the bundle the job's commands start from (the rank that failed first), or the member that
/// "JOB.ccap:crash-....ccap" names (with `membersOnly`, only that: a command that reads any bundle,
/// the archive itself included, such as info, verify, show and export); what the command prints,
/// and an error's message, then name the archive's members ("JOB.ccap:crash-....ccap") instead of
/// that directory. Anything else runs `body` as it is.
int onBundleOrJobArchive(std::string& bundle, const std::function<int()>& body, bool membersOnly = false);
/// Within onBundleOrJobArchive's body: `text` naming the archive's members instead of the directory
/// they were extracted into, for what a command writes to files (a report); elsewhere, `text`.
std::string namedAsTheArchive(const std::string& text);

}  // namespace crashcap::cli
