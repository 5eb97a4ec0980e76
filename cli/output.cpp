#include "output.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/inspect/summary.hpp"
#include "crashcap/supervisor/job_archive.hpp"

namespace crashcap::cli {

std::string jsonText(const json& j) { return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n"; }

void printJson(const json& j) { std::cout << jsonText(j); }

formats::Progress progressPrinter(const char* what) {
  if (!isatty(2)) return {};
  return [what](uint64_t done, uint64_t total) {
    std::fprintf(stderr, "\r%s: %3d%% (%s of %s)\033[K", what, total ? int(100 * done / total) : 100,
                 inspect::formatBytes(done).c_str(), inspect::formatBytes(total).c_str());
    if (done >= total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  };
}

void endProgress() {
  if (isatty(2)) std::fprintf(stderr, "\r\033[K");
}

formats::ReaderLimits ReadOptions::limits() const {
  formats::ReaderLimits l;
  l.maxTensorBytes = maxTensorBytes;
  return l;
}

void addReadOptions(CLI::App* cmd, ReadOptions& o) {
  cmd->add_flag("--json", o.json, "Print one JSON object instead of text");
  cmd->add_option("--max-tensor-bytes", o.maxTensorBytes,
                  "Refuse to load a tensor larger than this into memory (untrusted bundles)")
      ->capture_default_str();
}

std::vector<int64_t> parseRows(const std::string& text) {
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

uint64_t parseByteSize(const std::string& text, const std::string& option) {
  static const std::pair<const char*, uint64_t> units[] = {
      {"", 1},          {"B", 1},           {"K", 1000},         {"KB", 1000},         {"KiB", 1024},
      {"M", 1000000},   {"MB", 1000000},    {"MiB", 1u << 20},   {"G", 1000000000},    {"GB", 1000000000},
      {"GiB", 1u << 30}};
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(static_cast<unsigned char>(text[digits])) || text[digits] == '.')) ++digits;
  const std::string unit = text.substr(digits);
  for (const auto& [name, scale] : units) {
    if (unit != name || digits == 0) continue;
    try {
      size_t used = 0;
      double value = std::stod(text.substr(0, digits), &used);
      if (used == digits && value > 0 && value * static_cast<double>(scale) < 1.8e19)
        return static_cast<uint64_t>(value * static_cast<double>(scale));
    } catch (const std::exception&) {
    }
  }
  throw Error(ErrorCode::InvalidArgument, fmt::format("{}: '{}' is not a size", option, text),
              fmt::format("give a positive number with K, M or G (powers of 1000) or KiB, MiB, GiB, e.g. {} 25M", option));
}

std::string joinRows(const std::vector<int64_t>& rows) {
  std::string s;
  for (auto r : rows) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

void writeFileAtomically(const std::string& path, const std::string& text) {
  formats::PartialOutput output(path);
  {
    std::ofstream f(output.path(), std::ios::binary | std::ios::trunc);
    if (!f) throw Error(ErrorCode::Io, fmt::format("cannot create {}: {}", output.path(), std::strerror(errno)));
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    f.close();
    if (!f)
      throw Error(ErrorCode::Io,
                  fmt::format("cannot write {} bytes to {}: {}", text.size(), output.path(), std::strerror(errno)));
  }
  output.commit();
}

namespace {
const supervisor::ExtractedJob* gExtracted = nullptr;  // the archive a command works in, if any
}  // namespace

std::string namedAsTheArchive(const std::string& text) { return gExtracted ? gExtracted->relabel(text) : text; }

int onBundleOrJobArchive(std::string& bundle, const std::function<int()>& body, bool membersOnly) {
  std::unique_ptr<supervisor::ExtractedJob> job;
  if (auto member = supervisor::archiveMember(bundle)) {
    job = supervisor::ExtractedJob::extract(member->first);
    bundle = job->member(member->second);
  } else if (!membersOnly && supervisor::isJobArchive(bundle)) {
    job = supervisor::ExtractedJob::extract(bundle);
    bundle = job->startingBundle();
  } else {
    return body();
  }
  // What the command prints goes through here, so that no path names the directory that is
  // removed when it ends. Progress lines go to stderr as they come.
  std::ostringstream captured;
  std::streambuf* original = std::cout.rdbuf(captured.rdbuf());
  gExtracted = job.get();
  struct Restore {
    std::streambuf* original;
    ~Restore() {
      std::cout.rdbuf(original);
      gExtracted = nullptr;
    }
  } restore{original};
  auto flush = [&] {
    std::cout.rdbuf(original);
    std::cout << job->relabel(captured.str()) << std::flush;
  };
  int code = kExitOk;
  try {
    code = body();
  } catch (const Error& e) {
    flush();
    Error relabelled(e.code(), job->relabel(e.message()), job->relabel(e.hint()));
    for (const auto& frame : e.context()) relabelled.with(job->relabel(frame));  // innermost first, as they came
    throw relabelled;
  } catch (...) {
    flush();
    throw;
  }
  flush();
  return code;
}

}  // namespace crashcap::cli
