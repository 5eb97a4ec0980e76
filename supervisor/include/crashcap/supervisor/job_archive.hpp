#pragma once
// A job archive: every file of one multi-process job (each rank's bundles and the job's lines of
// the run log) in one bundle, to attach to a bug report or move to another machine whole
// (`crashcap merge DIR -o JOB.ccap`). Each file is kept byte for byte as a uint8 tensor named
// "job/<file name>", so the archive is an ordinary sealed bundle that `verify` checks and `info`
// lists; its notes name the job and keep its story as it was told where the job ran.
//
// The commands that take a rank's bundle (inspect, replay, triage, bisect, report) take an
// archive too, and one of its members as "JOB.ccap:crash-....ccap": they extract it into a
// directory of their own (ExtractedJob), work there as on the directory the job ran in, name what
// they print after the archive's members, and remove the directory when done. No LibTorch here.

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "crashcap/supervisor/job.hpp"

namespace crashcap::formats {
class BundleReader;
}

namespace crashcap::supervisor {

/// The producer an archive's RecordingInfo names, and the notes it carries.
inline constexpr const char* kJobArchiveProducer = "crashcap merge";
inline constexpr const char* kJobArchiveIdNote = "job.id";
inline constexpr const char* kJobArchiveStoryNote = "job.story";
inline constexpr const char* kJobArchiveMemberPrefix = "job/";

struct MergeOptions {
  std::string dir;        ///< where the job's bundles are (crashcap run --dir)
  std::string out;        ///< the archive to write
  std::string jobId;      ///< which job, when DIR holds several ("" : the only one)
  bool overwrite = false;
};

struct MergeResult {
  std::string out;
  std::string jobId;
  int worldSize = 0;
  int firstFailed = -1;
  std::vector<std::string> members;  ///< file names, in the archive's order
  uint64_t memberBytes = 0;          ///< their sizes, summed
  uint64_t archiveBytes = 0;         ///< the archive's size
  std::vector<int> missing;          ///< ranks of the world the directory had nothing of
  std::string headline;              ///< the job's story in one line
};

/// Writes the archive of one job of `o.dir`: every bundle of every rank (the story's, older ones
/// included) and the run log's lines of that job. Throws Error{NotFound} when DIR holds no job or
/// o.jobId names none of its jobs, Error{InvalidArgument} when it holds several and o.jobId is ""
/// (the messages list them) or when o.out exists (without o.overwrite) or is one of the job's
/// bundles, Error{Io} on a write failure (the partial archive is removed).
MergeResult mergeJob(const MergeOptions& o);

/// Keys: out, job_id, world_size, first_failed (rank or null), headline, members, member_bytes,
/// archive_bytes, missing.
nlohmann::json toJson(const MergeResult& r);

/// Whether `path` is a job archive (a file whose RecordingInfo names kJobArchiveProducer). False
/// for directories, other bundles and files that are no bundle at all.
bool isJobArchive(const std::string& path);
/// Whether the bundle `reader` opened is a job archive.
bool isJobArchive(const formats::BundleReader& reader);

/// "JOB.ccap:crash-....ccap", the name the commands give a member of an archive, as (archive,
/// member); nullopt when `arg` is a file itself or no archive's name ends before a ':' in it.
std::optional<std::pair<std::string, std::string>> archiveMember(const std::string& arg);

/// An archive's files in a directory of their own, removed with this object.
class ExtractedJob {
 public:
  /// Extracts every member of the archive at `path` into a new directory under TMPDIR, each
  /// checked against its checksums (removing, first, extractions whose process is gone). Throws
  /// Error{Corrupt} when the archive is damaged (naming the member), Error{InvalidArgument} when
  /// `path` is no job archive, Error{Io} when TMPDIR has no room.
  static std::unique_ptr<ExtractedJob> extract(const std::string& path);
  ~ExtractedJob();
  ExtractedJob(const ExtractedJob&) = delete;
  ExtractedJob& operator=(const ExtractedJob&) = delete;

  const std::string& archive() const { return archive_; }
  const std::string& dir() const { return dir_; }
  const std::string& jobId() const { return jobId_; }
  /// The story of the extracted job, its paths given as the archive's ("JOB.ccap: crash-....ccap").
  JobStories stories() const;
  /// The bundle a command on the whole job starts from: the rank that failed first, else the
  /// lowest rank with a bundle. Throws Error{NotFound} when the archive holds no rank's bundle.
  std::string startingBundle() const;
  /// The extracted file of member `name`. Throws Error{NotFound} listing the members.
  std::string member(const std::string& name) const;
  /// `text` with the extraction directory's paths written as the archive's members.
  std::string relabel(const std::string& text) const;

 private:
  ExtractedJob() = default;
  std::string archive_, dir_, jobId_;
};

}  // namespace crashcap::supervisor
