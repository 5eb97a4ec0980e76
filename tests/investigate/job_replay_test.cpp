// The refusals of a job's replay, before any program starts: ranks that hold no keyframe of one
// step, and a rank with no bundle. The job replayed for real is in tests/python/test_distributed.py.
#include <catch2/catch.hpp>

#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/investigate/replays.hpp"
#include "test_support.hpp"

using namespace crashcap;
using namespace crashcap::formats;

namespace {

void writeRank(const std::string& path, int rank, int world, std::vector<int64_t> keyframes) {
  auto w = BundleWriter::create(path);
  writeMetaRecord(*w, DistributedData{"job-k", "crashcap run", rank, world, rank, "gloo", "", "test"});
  for (int64_t k : keyframes) writeMetaRecord(*w, KeyframeData{k, {}, {}, {}, {}, {}});
  for (int64_t s = 0; s <= 12; ++s) {
    StepBeginData b;
    b.step = s;
    b.keyframe = -1;
    b.previousStep = s == 0 ? -1 : s - 1;
    for (int64_t k : keyframes)
      if (k <= s) b.keyframe = k;
    writeMetaRecord(*w, b);
  }
  CrashData c;
  c.kind = "exception";
  c.step = 12;
  c.error = "RuntimeError: x";
  writeMetaRecord(*w, c);
  w->seal();
}

std::string refusal(const std::string& bundle) {
  try {
    investigate::replayJob(bundle, {});
  } catch (const Error& e) {
    return e.message();
  }
  return "";
}

}  // namespace

TEST_CASE("a job whose ranks hold no keyframe of one step is refused, naming each rank's", "[job-replay]") {
  test::TempDir dir;
  writeRank(dir.file("crash-0.ccap"), 0, 2, {0, 10});
  writeRank(dir.file("crash-1.ccap"), 1, 2, {5});
  CHECK(investigate::isJobRank(dir.file("crash-0.ccap")));
  auto why = refusal(dir.file("crash-1.ccap"));
  INFO(why);
  CHECK(why.find("hold no keyframe of one step at or before step 12") != std::string::npos);
  CHECK(why.find("rank 0: 0, 10; rank 1: 5") != std::string::npos);
}

TEST_CASE("a job with a rank's bundle missing is refused, naming the rank", "[job-replay]") {
  test::TempDir dir;
  writeRank(dir.file("crash-0.ccap"), 0, 3, {0});
  writeRank(dir.file("crash-2.ccap"), 2, 3, {0});
  auto why = refusal(dir.file("crash-0.ccap"));
  INFO(why);
  CHECK(why.find("the 3 ranks of job job-k replay together") != std::string::npos);
  CHECK(why.find("rank 1 (no bundle)") != std::string::npos);
}

TEST_CASE("a single process is no job", "[job-replay]") {
  test::TempDir dir;
  {
    auto w = BundleWriter::create(dir.file("crash.ccap"));
    writeMetaRecord(*w, DistributedData{"job-1", "crashcap run", 0, 1, 0, "gloo", "", "test"});
    w->seal();
  }
  CHECK_FALSE(investigate::isJobRank(dir.file("crash.ccap")));
  CHECK_THROWS_AS(investigate::replayJob(dir.file("crash.ccap"), {}), Error);
}
