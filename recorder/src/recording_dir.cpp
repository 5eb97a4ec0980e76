#include "crashcap/recorder/recording_dir.hpp"

#include <fmt/format.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/clock.hpp"
#include "crashcap/formats/directory.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/step_numbers.hpp"

namespace crashcap::recorder {

const char* phaseName(Phase p) {
  switch (p) {
    case Phase::Setup: return "setup";
    case Phase::Forward: return "forward";
    case Phase::Backward: return "backward";
    case Phase::Optimizer: return "optimizer";
    case Phase::BetweenSteps: return "between-steps";
  }
  return "unknown";
}
namespace fs = std::filesystem;
using crashcap::Error;
using crashcap::ErrorCode;

std::string compactUtcTime(int64_t timeNs) {
  std::time_t t = static_cast<std::time_t>(timeNs / 1000000000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

std::string bundlePath(const std::string& dir, const std::string& kind, int64_t timeNs, uint32_t pid) {
  auto base = (fs::path(dir) / fmt::format("{}-{}-{}", kind, compactUtcTime(timeNs), pid)).string();
  std::error_code ec;
  if (!fs::exists(base + ".ccap", ec)) return base + ".ccap";
  for (int i = 2;; ++i) {
    auto p = fmt::format("{}-{}.ccap", base, i);
    if (!fs::exists(p, ec)) return p;
  }
}

std::string recordingDirName(int64_t timeNs, uint32_t pid) {
  return fmt::format("{}{}-{}", kRecordingPrefix, compactUtcTime(timeNs), pid);
}

std::string segmentFileName(uint64_t index) { return fmt::format("segment-{:06d}.ccap", index); }

bool isRecording(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / kRunFileName, ec);
}

std::vector<std::string> findRecordings(const std::string& path) {
  if (isRecording(path)) return {path};
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(path, ec)) {
    auto name = e.path().filename().string();
    if (name.rfind(kRecordingPrefix, 0) == 0 && isRecording(e.path().string())) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());  // names start with the UTC time: oldest first
  return out;
}

std::vector<std::string> segmentFiles(const std::string& recording) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(recording, ec)) {
    auto name = e.path().filename().string();
    if (name.rfind("segment-", 0) == 0 && name.size() > 5 && name.substr(name.size() - 5) == ".ccap")
      out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());  // zero-padded numbers: lexical order is write order
  return out;
}

namespace {

/// What one file of the recording says about how the run ended.
struct FileFindings {
  std::optional<formats::CrashData> crash;
  std::optional<formats::RunStatusData> status;
  uint64_t steps = 0;
  int64_t firstStep = -1, lastStep = -1;
};

FileFindings findings(const formats::BundleReader& reader) {
  FileFindings f;
  auto view = formats::readRecords(reader);
  f.crash = view.crash;
  f.status = view.status;
  f.steps = view.stepBegins.size();
  if (!view.stepBegins.empty()) {
    f.firstStep = view.stepBegins.front().step;
    f.lastStep = view.stepBegins.back().step;
  }
  return f;
}

}  // namespace

std::string recordingState(const std::string& recording) {
  auto segments = segmentFiles(recording);
  if (segments.empty()) return "interrupted";
  try {
    // The writer puts the run status (and a crash) into the segment it writes last.
    auto f = findings(*formats::BundleReader::open(segments.back()));
    if (f.crash) return "crashed";
    if (f.status) return f.status->state;
  } catch (const Error&) {
    // A segment cut short: the process did not get to close it.
  }
  return "interrupted";
}

std::optional<Progress> readProgress(const std::string& recording) {
  std::ifstream in(fs::path(recording) / kProgressFileName, std::ios::binary);
  // Plain bytes: the reader is another process, and the writer may be gone.
  struct {
    char magic[8];
    int64_t step;
    int32_t phase;
    uint32_t reserved;
    uint64_t stepsBegun;
    uint64_t collectivesIssued;
    int64_t lastCollectiveStep;
    char lastCollective[64];
    char lastOp[64];
  } raw{};
  static_assert(sizeof raw == sizeof(ProgressPage), "the progress file's layout");
  static_assert(offsetof(decltype(raw), stepsBegun) == offsetof(ProgressPage, stepsBegun) &&
                    offsetof(decltype(raw), collectivesIssued) == offsetof(ProgressPage, collectivesIssued) &&
                    offsetof(decltype(raw), lastCollectiveStep) == offsetof(ProgressPage, lastCollectiveStep) &&
                    offsetof(decltype(raw), lastCollective) == offsetof(ProgressPage, lastCollective) &&
                    offsetof(decltype(raw), lastOp) == offsetof(ProgressPage, lastOp),
                "the progress file's layout");
  if (!in.read(reinterpret_cast<char*>(&raw), sizeof raw)) return std::nullopt;
  if (std::memcmp(raw.magic, ProgressPage::kMagic, sizeof raw.magic) != 0 || raw.step < -1) return std::nullopt;
  Progress p;
  p.step = raw.step;
  p.phase = phaseName(static_cast<Phase>(raw.phase));
  p.stepsBegun = raw.stepsBegun;
  // Names are the process's last stores: cut at the first NUL, and at the array's end when a
  // SIGKILL came in the middle of one.
  p.collectivesIssued = raw.collectivesIssued;
  p.lastCollectiveStep = p.collectivesIssued ? raw.lastCollectiveStep : -1;
  p.lastCollective.assign(raw.lastCollective, ::strnlen(raw.lastCollective, sizeof raw.lastCollective));
  p.lastOp.assign(raw.lastOp, ::strnlen(raw.lastOp, sizeof raw.lastOp));
  return p;
}

SealReport sealRecording(const std::string& recording, const SealOptions& options) {
  if (!isRecording(recording))
    throw Error(ErrorCode::NotFound, fmt::format("{} is not a recording: it holds no {}", recording, kRunFileName),
                "give the recording directory (recording-<time>-<pid>) or the directory that holds it");
  const auto runPath = (fs::path(recording) / kRunFileName).string();
  std::unique_ptr<formats::BundleReader> run;
  try {
    run = formats::BundleReader::open(runPath, options.limits, options.progress);
  } catch (Error& e) {
    throw e.with(fmt::format("while reading {}", runPath));
  }
  SealReport report;
  auto lostLine = [&](const formats::BundleReader& r) {
    const auto& rep = r.report();
    if (rep.truncatedAt || !rep.damage.empty() || !rep.lostTensors.empty() || rep.missingSequenceCount)
      report.lost.push_back(fmt::format("{}: {}", fs::path(r.path()).filename().string(), rep.summary()));
  };
  lostLine(*run);

  std::vector<std::unique_ptr<formats::BundleReader>> segments;
  for (const auto& path : segmentFiles(recording)) {
    try {
      segments.push_back(formats::BundleReader::open(path, options.limits, options.progress));
      lostLine(*segments.back());
    } catch (const Error& e) {
      // A segment the writer created but died before its header reached the disk, or one
      // damaged beyond use: the bundle goes on without it and says so.
      report.lost.push_back(fmt::format("{}: skipped: {}", fs::path(path).filename().string(), e.what()));
    }
  }

  std::optional<formats::CrashData> crash = options.crash;
  std::optional<formats::RunStatusData> status = options.status;
  std::optional<formats::RunStatusData> fileStatus;
  bool crashInFiles = false;
  for (const auto& s : segments) {
    auto f = findings(*s);
    report.steps += f.steps;
    if (f.firstStep >= 0 && report.firstStep < 0) report.firstStep = f.firstStep;
    if (f.lastStep >= 0) report.lastStep = f.lastStep;
    if (f.crash) crashInFiles = true;
    if (f.status) fileStatus = f.status;
  }
  if (crash || crashInFiles)
    report.state = "crashed";
  else if (status)
    report.state = status->state;
  else if (fileStatus)
    report.state = fileStatus->state;
  else
    report.state = "interrupted";

  // The progress file knows the step a killed process was in, records or not.
  std::optional<Progress> progress;
  if (report.state == "interrupted" && (progress = readProgress(recording)) && progress->step >= 0)
    report.begunStep = std::max(progress->step, report.lastStep);

  uint32_t pid = 0;
  if (auto info = run->recordingInfo()) pid = info->pid;
  std::string out = options.out;
  if (out.empty()) {
    const char* kind = report.state == "finished" ? "recording" : "crash";
    int64_t t = crash ? crash->timeNs : formats::unixTimeNs();
    out = bundlePath(fs::path(recording).parent_path().string(), kind, t, pid);
  } else if (fs::exists(out)) {
    throw Error(ErrorCode::InvalidArgument, fmt::format("{} already exists", out),
                "seal never overwrites; choose another output path");
  }
  report.out = out;

  formats::PartialOutput output(out);
  formats::WriterOptions wo;
  wo.overwrite = true;
  wo.producer = "crashcap seal";
  auto writer = formats::BundleWriter::createCopy(output.path(), run->fileHeader(), wo);

  auto add = [&](const formats::CopyReport& c, const std::string& file) {
    report.records += c.recordsCopied;
    report.tensors += c.tensorsCopied;
    for (const auto& l : c.lines) report.lost.push_back(fmt::format("{}: {}", file, l));
  };
  add(formats::copyRecords(*run, *writer, {}, options.decodeChunks), kRunFileName);
  for (const auto& s : segments) {
    auto c = formats::copyRecords(
        *s, *writer,
        [](const formats::RecordEntry& r) {
          // One recording_info per bundle: run.ccap's.
          return r.type != static_cast<uint16_t>(formats::RecordType::RecordingInfo);
        },
        options.decodeChunks);
    add(c, fs::path(s->path()).filename().string());
  }
  if (crash) formats::writeMetaRecord(*writer, *crash);
  if (options.ops) formats::writeMetaRecord(*writer, *options.ops);
  for (const auto& t : options.kernelTraces) formats::writeMetaRecord(*writer, t);
  if (options.supervision) formats::writeMetaRecord(*writer, *options.supervision);
  if (status) {
    formats::writeMetaRecord(*writer, *status);
  } else if (!fileStatus) {
    formats::RunStatusData s;
    if (progress || (progress = readProgress(recording))) {
      // Collectives are observed from the start, a setup broadcast or barrier before step 0 too.
      s.collectivesIssued = progress->collectivesIssued;
      s.lastCollective = progress->lastCollective;
      s.lastCollectiveStep = progress->lastCollectiveStep;
    }
    s.state = report.state;
    s.stepsBegun = report.steps;
    s.lastStep = report.lastStep;
    s.warnings.push_back("the recording was never closed (process killed, power lost?); sealed by `crashcap seal`");
    if (progress && progress->step >= 0) {
      s.stepsBegun = std::max(s.stepsBegun, progress->stepsBegun);
      s.lastStep = report.begunStep;
      if (progress->step == report.begunStep) s.lastPhase = progress->phase;
      if (progress->step == report.begunStep) s.lastOp = progress->lastOp;
      if (report.begunStep > report.lastStep) {
        // Which steps never reached the disk: every one after the last held when the count begun
        // proves 0..S all began, else S only (step_numbers.hpp). formats::lostSteps, which also
        // sees the recorded steps, names them in full by the same rule.
        std::string missing;
        if (report.begunStep == report.lastStep + 1)
          missing = fmt::format("the records of step {}", report.begunStep);
        else if (formats::begunStepsAreAllUpTo(progress->stepsBegun, report.begunStep))
          missing = fmt::format("the records of steps {}..{}", report.lastStep + 1, report.begunStep);
        else
          missing = fmt::format("the records of step {}, and of any step begun after step {},", report.begunStep,
                                report.lastStep);
        s.warnings.push_back(
            report.lastStep >= 0
                ? fmt::format("the process was in step {} ({}); {} never reached the disk", report.begunStep,
                              progress->phase, missing)
                : fmt::format("the process was in step {} ({}); no step's records reached the disk", report.begunStep,
                              progress->phase));
      }
    }
    formats::writeMetaRecord(*writer, s);
  }
  std::string text = fmt::format("sealed from {}: {} segment files, {} steps", recording, segments.size(), report.steps);
  if (report.steps) text += fmt::format(" ({}..{})", report.firstStep, report.lastStep);
  if (report.begunStep > report.lastStep) text += fmt::format("; the process was in step {}", report.begunStep);
  for (const auto& l : report.lost) text += "\n" + l;
  if (text.size() > formats::kMaxNoteTextBytes) text.resize(formats::kMaxNoteTextBytes - 16);
  writer->writeNote("crashcap.seal", text);
  writer->seal();
  report.bytes = writer->stats().fileBytes;
  output.commit();  // durable before the recording it replaces is deleted
  if (options.removeRecording) report.notRemoved = formats::removeTree(recording);
  return report;
}

}  // namespace crashcap::recorder
