#include "crashcap/supervisor/job_archive.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/directory.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/supervisor/summary.hpp"

namespace crashcap::supervisor {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// A file mapped for reading (a member to archive) or for writing (one being extracted).
class Mapping {
 public:
  static Mapping forReading(const std::string& path) {
    Mapping m;
    m.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (m.fd_ < 0) throw Error(ErrorCode::Io, fmt::format("cannot open {}: {}", path, std::strerror(errno)));
    struct stat st {};
    if (::fstat(m.fd_, &st) != 0) throw Error(ErrorCode::Io, fmt::format("cannot stat {}: {}", path, std::strerror(errno)));
    m.map(path, static_cast<size_t>(st.st_size), PROT_READ);
    return m;
  }
  static Mapping forWriting(const std::string& path, size_t size) {
    Mapping m;
    m.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (m.fd_ < 0) throw Error(ErrorCode::Io, fmt::format("cannot create {}: {}", path, std::strerror(errno)));
    // Reserved on disk first: a store into a mapping of space the disk does not have is a SIGBUS,
    // not an error.
    if (size > 0) {
      if (int e = ::posix_fallocate(m.fd_, 0, static_cast<off_t>(size)); e != 0)
        throw Error(ErrorCode::Io, fmt::format("cannot reserve {} bytes for {}: {}", size, path, std::strerror(e)),
                    "free space there, or point TMPDIR at a disk with room for the job");
    }
    m.map(path, size, PROT_READ | PROT_WRITE);
    return m;
  }
  Mapping(Mapping&& o) noexcept : fd_(o.fd_), data_(o.data_), size_(o.size_) {
    o.fd_ = -1;
    o.data_ = nullptr;
  }
  ~Mapping() {
    if (data_) ::munmap(data_, size_);
    if (fd_ >= 0) ::close(fd_);
  }
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  Mapping() = default;
  void map(const std::string& path, size_t size, int protection) {
    size_ = size;
    if (size == 0) return;
    void* p = ::mmap(nullptr, size, protection, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) throw Error(ErrorCode::Io, fmt::format("cannot map {}: {}", path, std::strerror(errno)));
    data_ = p;
  }
  int fd_ = -1;
  void* data_ = nullptr;
  size_t size_ = 0;
};

/// The job of `stories` that `wanted` names, or the only one.
const Job& chooseJob(const JobStories& stories, const std::string& dir, const std::string& wanted) {
  std::vector<std::string> ids;
  for (const auto& job : stories.jobs) ids.push_back(job.jobId.empty() ? "(id not known)" : job.jobId);
  if (stories.jobs.empty())
    throw Error(ErrorCode::NotFound, fmt::format("no multi-process job in {}: no bundle there has a distributed record", dir),
                "merge takes the directory a job's ranks were recorded into (crashcap run --nproc N --dir DIR)");
  if (!wanted.empty()) {
    for (const auto& job : stories.jobs)
      if (job.jobId == wanted) return job;
    throw Error(ErrorCode::NotFound, fmt::format("no job {} in {}; it holds {}", wanted, dir, fmt::join(ids, ", ")),
                "crashcap inspect DIR tells each job's story with its id");
  }
  if (stories.jobs.size() > 1)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{} holds {} jobs ({}); an archive keeps one", dir, stories.jobs.size(), fmt::join(ids, ", ")),
                "name it: crashcap merge DIR --job ID -o JOB.ccap");
  return stories.jobs.front();
}

/// A member's name in the archive: the file's own name, unless another member has it already.
std::string memberName(const std::string& path, int rank, std::set<std::string>& taken) {
  std::string name = fs::path(path).filename().string();
  if (taken.count(name)) name = fmt::format("rank{}-{}", rank, name);
  for (int k = 2; taken.count(name); ++k) name = fmt::format("rank{}-{}-{}", rank, k, fs::path(path).filename().string());
  taken.insert(name);
  return name;
}

/// The archive's note `key`, or "".
std::string noteOf(const formats::BundleReader& reader, const std::string& key) {
  for (const auto& n : reader.notes())
    if (n.key == key) return n.text;
  return "";
}

/// `text` with every `from` replaced by `to`.
std::string replaceEvery(const std::string& text, const std::string& from, const std::string& to) {
  std::string out;
  size_t at = 0;
  for (size_t hit; (hit = text.find(from, at)) != std::string::npos; at = hit + from.size())
    out += text.substr(at, hit - at) + to;
  return out + text.substr(at);
}

}  // namespace

MergeResult mergeJob(const MergeOptions& o) {
  auto stories = readJobs(o.dir);
  const Job& job = chooseJob(stories, o.dir, o.jobId);
  std::error_code ec;
  if (fs::is_directory(o.out, ec))
    throw Error(ErrorCode::InvalidArgument, fmt::format("{} is a directory; -o names the archive file to write", o.out));
  if (fs::exists(o.out, ec) && !o.overwrite)
    throw Error(ErrorCode::InvalidArgument, fmt::format("{} exists", o.out), "give another -o, or --force to replace it");

  // Every bundle of every rank, the rank that failed first first; then the job's log lines.
  std::vector<std::pair<std::string, std::string>> files;  // (name in the archive, path)
  std::set<std::string> taken;
  std::vector<const JobRank*> order;
  for (const auto& r : job.ranks)
    if (r.rank == job.firstFailed) order.insert(order.begin(), &r);
    else order.push_back(&r);
  for (const JobRank* r : order) {
    if (!r->bundle.empty()) files.emplace_back(memberName(r->bundle, r->rank, taken), r->bundle);
    for (const auto& b : r->otherBundles) files.emplace_back(memberName(b, r->rank, taken), b);
  }
  for (const auto& [name, path] : files)
    if (fs::equivalent(path, o.out, ec))
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("{} is {}, one of the job's own bundles; write the archive elsewhere", o.out, name));
  if (files.empty())
    throw Error(ErrorCode::NotFound, fmt::format("job {} in {} has no bundle: every rank ended cleanly", job.jobId, o.dir),
                "there is nothing to replay; the run log alone tells how it ended");
  std::string log;
  std::vector<std::pair<std::string, std::string>> unreadable;
  for (const auto& path : listRunDir(o.dir).logs)
    for (auto line : readRunLog(path, fs::absolute(o.dir).string(), unreadable))
      if (line.value("job_id", json()) == json(job.jobId)) {
        line.erase("_line");
        log += line.dump() + "\n";
      }

  MergeResult out;
  out.out = o.out;
  out.jobId = job.jobId;
  out.worldSize = job.worldSize;
  out.firstFailed = job.firstFailed;
  out.missing = job.missing;
  out.headline = jobHeadline(job);
  JobStories one = stories;
  one.jobs = {job};
  one.notInJob.clear();
  one.unsealed.clear();
  one.archives.clear();
  one.unreadable.clear();

  const std::string partial = o.out + ".partial";
  fs::remove(partial, ec);
  try {
    formats::WriterOptions wo;
    wo.producer = kJobArchiveProducer;
    wo.overwrite = true;
    wo.shuffle = false;  // bytes of files, most of them compressed already: zstd keeps what it can
    auto w = formats::BundleWriter::create(partial, wo);
    w->writeNote(kJobArchiveIdNote, job.jobId);
    w->writeNote(kJobArchiveStoryNote, jobsText(one));
    for (const auto& [name, path] : files) {
      auto m = Mapping::forReading(path);
      w->writeTensor(kJobArchiveMemberPrefix + name, formats::DType::UInt8, {static_cast<int64_t>(m.size())}, m.data(),
                     m.size());
      out.members.push_back(name);
      out.memberBytes += m.size();
    }
    if (!log.empty()) {
      std::string name = memberName("runs.jsonl", -1, taken);
      w->writeTensor(kJobArchiveMemberPrefix + name, formats::DType::UInt8, {static_cast<int64_t>(log.size())},
                     log.data(), log.size());
      out.members.push_back(name);
      out.memberBytes += log.size();
    }
    w->seal();
    fs::rename(partial, o.out, ec);
    if (ec) throw Error(ErrorCode::Io, fmt::format("cannot rename {} to {}: {}", partial, o.out, ec.message()));
  } catch (...) {
    fs::remove(partial, ec);
    throw;
  }
  out.archiveBytes = fs::file_size(o.out, ec);
  return out;
}

json toJson(const MergeResult& r) {
  return {{"out", r.out},
          {"job_id", r.jobId},
          {"world_size", r.worldSize},
          {"first_failed", r.firstFailed >= 0 ? json(r.firstFailed) : json(nullptr)},
          {"headline", r.headline},
          {"members", r.members},
          {"member_bytes", r.memberBytes},
          {"archive_bytes", r.archiveBytes},
          {"missing", r.missing}};
}

bool isJobArchive(const formats::BundleReader& reader) {
  auto info = reader.recordingInfo();
  return info && info->producer == kJobArchiveProducer;
}

bool isJobArchive(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return false;
  // Cheaply first: the producer's name is in the file's first record (RecordingInfo), in its
  // first KiB. Only a file that holds it is opened: opening an unsealed recording scans all of it.
  {
    std::ifstream in(path, std::ios::binary);
    std::string head(4096, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<size_t>(in.gcount()));
    if (head.find(kJobArchiveProducer) == std::string::npos) return false;
  }
  try {
    return isJobArchive(*formats::BundleReader::open(path));
  } catch (const Error&) {
    return false;
  }
}

std::optional<std::pair<std::string, std::string>> archiveMember(const std::string& arg) {
  std::error_code ec;
  if (fs::exists(arg, ec)) return std::nullopt;
  for (size_t colon = arg.rfind(':'); colon != std::string::npos && colon > 0; colon = arg.rfind(':', colon - 1)) {
    std::string archive = arg.substr(0, colon);
    if (isJobArchive(archive)) return std::make_pair(archive, arg.substr(colon + 1));
  }
  return std::nullopt;
}

namespace {

constexpr const char* kExtractionPrefix = "crashcap-job-";
constexpr const char* kOwnerFile = ".owner";  // the extracting process's pid; no member starts with a dot

/// Extractions whose process is gone (killed before it could remove them: a Ctrl-C, a timeout).
void removeAbandonedExtractions(const fs::path& tmp) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(tmp, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(kExtractionPrefix, 0) != 0 || !e.is_directory(ec)) continue;
    std::ifstream owner(e.path() / kOwnerFile);
    long pid = 0;
    if (!(owner >> pid) || pid <= 0) continue;  // not one of ours, or still being made
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) formats::removeTree(e.path());
  }
}

}  // namespace

std::unique_ptr<ExtractedJob> ExtractedJob::extract(const std::string& path) {
  formats::ReaderLimits limits;
  limits.maxTensorBytes = UINT64_MAX;  // a member goes to a file of its own size, not into memory
  auto reader = formats::BundleReader::open(path, limits);
  if (!isJobArchive(*reader))
    throw Error(ErrorCode::InvalidArgument, fmt::format("{} is no job archive", path),
                "crashcap merge DIR -o JOB.ccap makes one from the directory a job was recorded into");
  if (!reader->report().complete())
    throw Error(ErrorCode::Corrupt, fmt::format("{} is damaged: {}", path, reader->report().summary()),
                "crashcap verify " + path + " lists the damage; merge the job's directory again if you have it");
  // Every name first: a plain file name, once; nothing that leaves the directory.
  const std::string prefix = kJobArchiveMemberPrefix;
  std::vector<std::pair<std::string, const formats::TensorInfo*>> members;
  std::set<std::string> names;
  for (const auto& t : reader->tensors()) {
    if (t.name.rfind(prefix, 0) != 0) continue;
    const std::string name = t.name.substr(prefix.size());
    if (name.empty() || name[0] == '.' || name.find('/') != std::string::npos || t.dtype != formats::DType::UInt8 ||
        !names.insert(name).second)
      throw Error(ErrorCode::Corrupt, fmt::format("{}: member '{}' is not a plain file name of bytes, once", path, t.name));
    members.emplace_back(name, &t);
  }
  if (members.empty()) throw Error(ErrorCode::Corrupt, fmt::format("{}: a job archive without a single file of the job", path));

  std::unique_ptr<ExtractedJob> job(new ExtractedJob);
  job->archive_ = path;
  job->jobId_ = noteOf(*reader, kJobArchiveIdNote);
  std::error_code ec;
  const fs::path tmp = fs::temp_directory_path(ec);
  if (ec)
    throw Error(ErrorCode::Io, fmt::format("no directory to extract {} into: {}", path, ec.message()),
                "set TMPDIR to a directory with room for the job");
  removeAbandonedExtractions(tmp);
  std::string templ = (fs::absolute(tmp) / (std::string(kExtractionPrefix) + "XXXXXX")).string();
  if (!::mkdtemp(templ.data()))
    throw Error(ErrorCode::Io, fmt::format("cannot create a directory to extract {} into: {}", path, std::strerror(errno)),
                "set TMPDIR to a directory with room for the job");
  job->dir_ = templ;  // from here on, the destructor removes it
  std::ofstream(fs::path(templ) / kOwnerFile) << ::getpid() << "\n";
  for (const auto& [name, t] : members) {
    auto m = Mapping::forWriting((fs::path(job->dir_) / name).string(), t->totalBytes);
    try {
      reader->readTensor(*t, m.data(), t->totalBytes);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::Corrupt && e.code() != ErrorCode::Truncated) throw;
      throw Error(ErrorCode::Corrupt, fmt::format("{}: its file {} is damaged: {}", path, name, e.what()),
                  "crashcap verify " + path + " lists the damage; merge the job's directory again if you have it");
    }
  }
  return job;
}

ExtractedJob::~ExtractedJob() {
  if (!dir_.empty()) formats::removeTree(dir_);
}

std::string ExtractedJob::member(const std::string& name) const {
  std::error_code ec;
  if (!name.empty() && name[0] != '.' && name.find('/') == std::string::npos && fs::is_regular_file(fs::path(dir_) / name, ec))
    return (fs::path(dir_) / name).string();
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_, ec))
    if (e.path().filename() != kOwnerFile) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  throw Error(ErrorCode::NotFound, fmt::format("{} has no file '{}'; it holds {}", archive_, name, fmt::join(names, ", ")),
              fmt::format("crashcap inspect {} lists its ranks' bundles", archive_));
}

std::string ExtractedJob::relabel(const std::string& text) const {
  // A member's path, then the directory alone (a message naming where the ranks are).
  return replaceEvery(replaceEvery(text, dir_ + "/", archive_ + ":"), dir_, archive_);
}

JobStories ExtractedJob::stories() const {
  auto s = readJobs(dir_);
  s.archive = archive_;
  s.dir = archive_;
  for (auto& job : s.jobs) {
    for (auto& r : job.ranks) {
      if (!r.bundle.empty()) r.bundle = relabel(r.bundle);
      for (auto& b : r.otherBundles) b = relabel(b);
    }
    for (auto& p : job.problems) p = relabel(p);
  }
  for (auto& p : s.notInJob) p = relabel(p);
  for (auto& [p, why] : s.unreadable) p = relabel(p);
  return s;
}

std::string ExtractedJob::startingBundle() const {
  auto s = readJobs(dir_);
  for (const auto& job : s.jobs) {
    if (!jobId_.empty() && job.jobId != jobId_) continue;
    for (const auto& r : job.ranks)
      if (r.rank == job.firstFailed && !r.bundle.empty()) return r.bundle;
    for (const auto& r : job.ranks)
      if (!r.bundle.empty()) return r.bundle;
  }
  throw Error(ErrorCode::NotFound,
              fmt::format("{} holds no bundle of a rank of {}", archive_, jobId_.empty() ? "its job" : "job " + jobId_),
              "crashcap verify " + archive_ + " lists what it holds");
}

}  // namespace crashcap::supervisor
