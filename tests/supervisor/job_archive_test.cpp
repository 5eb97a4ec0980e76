// `crashcap merge` on hand-built ranks: one job of a directory into one archive, extracted byte
// for byte with the same story, and an archive that is damaged or names a file outside its
// directory refused. The archive of a real job, replayed, is in tests/python/test_distributed.py.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/supervisor/job.hpp"
#include "crashcap/supervisor/job_archive.hpp"
#include "test_support.hpp"

using namespace crashcap;
using namespace crashcap::formats;
namespace fs = std::filesystem;

namespace {

/// A rank's bundle: its place in job `job`, and its own error when `error` is not empty.
void writeRank(const std::string& path, const std::string& job, int rank, const std::string& error, int64_t timeNs) {
  auto w = BundleWriter::create(path);
  writeMetaRecord(*w, DistributedData{job, "crashcap run", rank, 2, rank, "gloo", "", "test"});
  if (!error.empty()) {
    CrashData c;
    c.kind = "exception";
    c.step = 3;
    c.phase = "forward";
    c.error = error;
    c.timeNs = timeNs;
    c.pid = 100 + rank;
    writeMetaRecord(*w, c);
  }
  w->seal();
}

/// runs/ with job-a (rank 1 failed on its own, rank 0 from its peer), job-b, and their log lines.
void writeTwoJobs(const test::TempDir& dir) {
  fs::create_directory(dir.file("runs"));
  writeRank(dir.file("runs/crash-a0.ccap"), "job-a", 0, "RuntimeError: Connection closed by peer [127.0.0.1]:4242",
            2'000'000'000);
  writeRank(dir.file("runs/crash-a1.ccap"), "job-a", 1, "IndexError: index 12 is out of bounds", 1'000'000'000);
  writeRank(dir.file("runs/crash-b0.ccap"), "job-b", 0, "RuntimeError: b", 5'000'000'000);
  test::writeText(dir.file("runs/runs.jsonl"),
                  R"({"job_id": "job-b", "ranks": [], "first_failed_rank": 0})"
                  "\n"
                  R"({"job_id": "job-a", "ranks": [], "first_failed_rank": 1})"
                  "\n");
}

/// runs/ of writeTwoJobs, and job-a of it merged into job.ccap; returns the archive's path.
std::string mergeJobA(const test::TempDir& dir) {
  writeTwoJobs(dir);
  supervisor::MergeOptions o;
  o.dir = dir.file("runs");
  o.out = dir.file("job.ccap");
  o.jobId = "job-a";
  supervisor::mergeJob(o);
  return o.out;
}

std::string textOf(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("one job of a directory merges into an archive that extracts byte for byte and tells the same story",
          "[job][archive]") {
  test::TempDir dir;
  writeTwoJobs(dir);
  supervisor::MergeOptions o;
  o.dir = dir.file("runs");
  o.out = dir.file("job.ccap");

  // Two jobs: which one is asked, and nothing is written until it is said.
  try {
    supervisor::mergeJob(o);
    FAIL("a directory of two jobs merged without --job");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    const std::string what = e.what();
    CHECK(what.find("holds 2 jobs") != std::string::npos);
    CHECK(what.find("job-a") != std::string::npos);
    CHECK(what.find("job-b") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(o.out));
  o.jobId = "job-c";
  CHECK_THROWS_AS(supervisor::mergeJob(o), Error);

  o.jobId = "job-a";
  auto r = supervisor::mergeJob(o);
  // The rank that failed first comes first; the log holds this job's line only.
  CHECK(r.members == std::vector<std::string>{"crash-a1.ccap", "crash-a0.ccap", "runs.jsonl"});
  CHECK(r.firstFailed == 1);
  CHECK(r.worldSize == 2);
  CHECK(r.archiveBytes == fs::file_size(o.out));
  CHECK_FALSE(fs::exists(o.out + ".partial"));
  CHECK(supervisor::isJobArchive(o.out));
  CHECK_FALSE(supervisor::isJobArchive(dir.file("runs/crash-a0.ccap")));
  CHECK_FALSE(supervisor::isJobArchive(dir.file("runs")));
  CHECK_FALSE(supervisor::isJobArchive(dir.file("runs/runs.jsonl")));
  CHECK_THROWS_AS(supervisor::mergeJob(o), Error);  // the archive exists
  o.overwrite = true;
  CHECK_NOTHROW(supervisor::mergeJob(o));
  {
    // Not over one of the job's own bundles, even with --force.
    auto bundle = test::readFile(dir.file("runs/crash-a0.ccap"));
    supervisor::MergeOptions over = o;
    over.out = dir.file("runs/crash-a0.ccap");
    CHECK_THROWS_AS(supervisor::mergeJob(over), Error);
    CHECK(test::readFile(dir.file("runs/crash-a0.ccap")) == bundle);
  }

  auto original = supervisor::readJobs(dir.file("runs"));
  std::string extractedDir;
  {
    auto job = supervisor::ExtractedJob::extract(o.out);
    extractedDir = job->dir();
    CHECK(job->jobId() == "job-a");
    for (const auto* name : {"crash-a0.ccap", "crash-a1.ccap"})
      CHECK(test::readFile(job->member(name)) == test::readFile(dir.file(std::string("runs/") + name)));
    CHECK(textOf(job->member("runs.jsonl")).find("job-b") == std::string::npos);
    CHECK(textOf(job->member("runs.jsonl")).find("job-a") != std::string::npos);
    CHECK_THROWS_AS(job->member("crash-b0.ccap"), Error);
    CHECK_THROWS_AS(job->member("../job.ccap"), Error);
    CHECK(fs::path(job->startingBundle()).filename() == "crash-a1.ccap");

    auto stories = job->stories();
    REQUIRE(stories.jobs.size() == 1);
    CHECK(stories.archive == o.out);
    CHECK(stories.jobs[0].firstFailed == 1);
    const supervisor::Job* a = nullptr;
    for (const auto& j : original.jobs)
      if (j.jobId == "job-a") a = &j;
    REQUIRE(a);
    CHECK(supervisor::jobHeadline(stories.jobs[0]) == supervisor::jobHeadline(*a));
    for (const auto& rank : stories.jobs[0].ranks)
      CHECK(rank.bundle == o.out + ":crash-a" + std::to_string(rank.rank) + ".ccap");
    auto text = supervisor::jobsText(stories);
    INFO(text);
    CHECK(text.find(extractedDir) == std::string::npos);
    CHECK(text.find("crashcap replay " + o.out) != std::string::npos);
    CHECK(job->relabel("rerun: crashcap replay " + extractedDir + "/crash-a1.ccap --rows 5") ==
          "rerun: crashcap replay " + o.out + ":crash-a1.ccap --rows 5");
  }
  CHECK_FALSE(fs::exists(extractedDir));  // removed with the object

  // A member by name, as the commands print it; a file or directory that exists is itself.
  auto member = supervisor::archiveMember(o.out + ":crash-a0.ccap");
  REQUIRE(member);
  CHECK(member->first == o.out);
  CHECK(member->second == "crash-a0.ccap");
  CHECK_FALSE(supervisor::archiveMember(dir.file("runs/crash-a0.ccap")));
  CHECK_FALSE(supervisor::archiveMember(dir.file("runs/crash-a0.ccap:x")));

  // An archive inside a directory is listed as one, not taken for a bundle of no job.
  fs::copy_file(o.out, dir.file("runs/job.ccap"));
  auto listed = supervisor::readJobs(dir.file("runs"));
  CHECK(listed.archives.size() == 1);
  CHECK(listed.notInJob.empty());
  CHECK(listed.jobs.size() == 2);
}

TEST_CASE("a damaged archive, and one that names a file outside its directory, are refused", "[job][archive]") {
  test::TempDir dir;
  const std::string archive = mergeJobA(dir);

  SECTION("a member's bytes changed") {
    uint64_t lastBodyByte = 0;
    {
      auto reader = BundleReader::open(archive);
      for (const auto& rec : reader->records())
        if (rec.type == static_cast<uint16_t>(RecordType::TensorChunk)) {
          lastBodyByte = rec.offset + rec.length - 1;
          break;
        }
    }
    REQUIRE(lastBodyByte > 0);
    auto bytes = test::readFile(archive);
    bytes[lastBodyByte] ^= 0x5a;
    test::writeFile(archive, bytes);
    try {
      supervisor::ExtractedJob::extract(archive);
      FAIL("a damaged archive extracted");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::Corrupt);
      CHECK(std::string(e.what()).find("crash-a1.ccap") != std::string::npos);  // the member it lost
    }
  }
  SECTION("a member named to leave the directory") {
    WriterOptions wo;
    wo.producer = supervisor::kJobArchiveProducer;
    auto w = BundleWriter::create(dir.file("evil.ccap"), wo);
    w->writeNote(supervisor::kJobArchiveIdNote, "job-a");
    const std::string bytes = "not yours";
    w->writeTensor("job/../escaped", DType::UInt8, {static_cast<int64_t>(bytes.size())}, bytes.data(), bytes.size());
    w->seal();
    CHECK(supervisor::isJobArchive(dir.file("evil.ccap")));
    CHECK_THROWS_AS(supervisor::ExtractedJob::extract(dir.file("evil.ccap")), Error);
    CHECK_FALSE(fs::exists(fs::temp_directory_path() / "escaped"));
  }
  SECTION("no member at all") {
    WriterOptions wo;
    wo.producer = supervisor::kJobArchiveProducer;
    BundleWriter::create(dir.file("empty.ccap"), wo)->seal();
    CHECK_THROWS_AS(supervisor::ExtractedJob::extract(dir.file("empty.ccap")), Error);
  }
  SECTION("a bundle that is no archive") {
    CHECK_THROWS_AS(supervisor::ExtractedJob::extract(dir.file("runs/crash-a0.ccap")), Error);
  }
}

TEST_CASE("an extraction whose process is gone is removed by the next one; a live one's stays", "[job][archive]") {
  test::TempDir dir;
  const std::string archive = mergeJobA(dir);
  fs::create_directory(dir.file("tmp"));
  const char* before = std::getenv("TMPDIR");
  const std::string saved = before ? before : "";
  ::setenv("TMPDIR", dir.file("tmp").c_str(), 1);
  // A process that has ended (and was waited for): its pid names no process.
  pid_t gone = ::fork();
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);
  auto abandoned = [&](const std::string& name, long pid) {
    fs::create_directory(dir.file("tmp/" + name));
    test::writeText(dir.file("tmp/" + name + "/crash-a0.ccap"), "left behind");
    if (pid) test::writeText(dir.file("tmp/" + name + "/.owner"), std::to_string(pid) + "\n");
  };
  abandoned("crashcap-job-gone00", gone);
  abandoned("crashcap-job-alive0", ::getpid());
  abandoned("crashcap-job-nopid0", 0);
  {
    auto job = supervisor::ExtractedJob::extract(archive);
    CHECK(fs::path(job->dir()).parent_path() == fs::path(dir.file("tmp")));
    CHECK(fs::path(job->dir()).is_absolute());
  }
  if (before) ::setenv("TMPDIR", saved.c_str(), 1);
  else ::unsetenv("TMPDIR");
  CHECK_FALSE(fs::exists(dir.file("tmp/crashcap-job-gone00")));
  CHECK(fs::exists(dir.file("tmp/crashcap-job-alive0")));
  CHECK(fs::exists(dir.file("tmp/crashcap-job-nopid0")));
  CHECK(std::distance(fs::directory_iterator(dir.file("tmp")), fs::directory_iterator()) == 2);  // its own removed too
}
