// The recorder's background writer (recorder/src/live_writer.hpp): what it does when it cannot
// keep pace with a keyframe. Real files, a real writer thread, real zstd.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/recorder/recording_dir.hpp"
#include "live_writer.hpp"
#include "test_support.hpp"

namespace fmt_ = crashcap::formats;
using crashcap::recorder::detail::Job;
using crashcap::recorder::detail::Lane;
using crashcap::recorder::detail::LiveWriter;
using crashcap::recorder::detail::LiveWriterOptions;

namespace {

/// Floats that zstd shrinks by about half, slowly at a high level: a few distinct values in a
/// random order.
std::shared_ptr<std::vector<float>> compressibleFloats(size_t n, uint32_t seed) {
  auto v = std::make_shared<std::vector<float>>(n);
  std::mt19937 rng(seed);
  for (auto& x : *v) x = float(rng() % 16) * 0.25f;
  return v;
}

Job tensorJob(const std::string& name, std::shared_ptr<std::vector<float>> data) {
  Job job;
  job.kind = Job::Kind::Tensor;
  job.tensor.name = name;
  job.tensor.dtype = fmt_::DType::Float32;
  job.tensor.shape = {int64_t(data->size())};
  job.tensor.data = data->data();
  job.tensor.size = data->size() * sizeof(float);
  job.tensor.owner = data;
  return job;
}

struct Written {
  crashcap::recorder::detail::LiveWriterStats stats;
  std::unique_ptr<fmt_::BundleReader> segment;
  bool stored(const std::string& name) const {  // stored raw?
    const auto& t = segment->get(name);
    return t.storedBytes >= t.totalBytes;
  }
};

/// One keyframe of four 2 MiB tensors at zstd level 15, then (when `backlog`) 5 MiB of step
/// tensors pushed at once behind it: more than half of the 8 MiB queue. `skip` reports a keyframe
/// skipped after this one was queued instead.
Written writeKeyframe(const crashcap::test::TempDir& dir, bool rawWhenBehind, bool backlog, bool skip = false) {
  LiveWriterOptions o;
  o.outputDir = dir.path();
  o.zstdLevel = 15;
  o.queueBytes = 8ull << 20;
  o.rawWhenBehind = rawWhenBehind;
  o.quiet = true;
  LiveWriter writer(o);

  std::vector<Job> keyframe;
  Job start;
  start.kind = Job::Kind::StartSegment;
  start.step = 0;
  keyframe.push_back(std::move(start));
  for (int i = 0; i < 4; ++i)
    keyframe.push_back(tensorJob("keyframes/0/model/w" + std::to_string(i), compressibleFloats(1 << 19, i)));
  REQUIRE(writer.push(std::move(keyframe), Lane::Keyframe));
  if (backlog)
    for (int s = 1; s <= 10; ++s)
      REQUIRE(writer.push({tensorJob("steps/" + std::to_string(s) + "/batch/x", compressibleFloats(1 << 17, 100 + s))},
                          Lane::Step));
  if (skip) writer.skipKeyframe(5, 8ull << 20);
  writer.close(fmt_::RunStatusData{});

  Written w;
  w.stats = writer.stats();
  auto segments = crashcap::recorder::segmentFiles(writer.recordingDir());
  REQUIRE(segments.size() == 1);
  w.segment = fmt_::BundleReader::scan(segments[0]);
  return w;
}

}  // namespace

TEST_CASE("a writer that falls behind on a keyframe stores the rest of it raw, and keeps every step") {
  crashcap::test::TempDir dir;
  auto w = writeKeyframe(dir, /*rawWhenBehind=*/true, /*backlog=*/true);
  CHECK(w.stats.keyframesWrittenRaw == 1);
  CHECK(w.stats.droppedRecords == 0);
  CHECK(w.stats.lostStepCount == 0);
  // The first tensor is compressed (that is how the writer measures zstd's pace); by the time it
  // is done the steps wait behind the keyframe, and the disk takes raw bytes faster than zstd at
  // level 15 saves them, so the others are stored raw.
  CHECK_FALSE(w.stored("keyframes/0/model/w0"));
  for (int i = 1; i < 4; ++i) CHECK(w.stored("keyframes/0/model/w" + std::to_string(i)));
  // Only the keyframe: the steps after it are compressed at the writer's level again.
  for (int s = 1; s <= 10; ++s) CHECK_FALSE(w.stored("steps/" + std::to_string(s) + "/batch/x"));
  REQUIRE(w.stats.warnings.size() == 1);
  CHECK_THAT(w.stats.warnings[0], Catch::Contains("fell behind while writing the keyframe of step 0"));
  // Every tensor reads back as written, raw or not.
  auto expected = compressibleFloats(1 << 19, 2);
  auto bytes = w.segment->readTensor(w.segment->get("keyframes/0/model/w2"));
  REQUIRE(bytes.size() == expected->size() * sizeof(float));
  CHECK(std::memcmp(bytes.data(), expected->data(), bytes.size()) == 0);
}

TEST_CASE("a keyframe skipped while the last one is written also counts as falling behind") {
  crashcap::test::TempDir dir;
  auto w = writeKeyframe(dir, true, /*backlog=*/false, /*skip=*/true);
  CHECK(w.stats.keyframesSkipped == 1);
  CHECK(w.stats.keyframesWrittenRaw == 1);
  CHECK_FALSE(w.stored("keyframes/0/model/w0"));
  CHECK(w.stored("keyframes/0/model/w3"));
}

TEST_CASE("a writer that keeps pace, or is told not to, compresses the whole keyframe") {
  crashcap::test::TempDir dir;
  SECTION("no steps waiting") {
    auto w = writeKeyframe(dir, true, /*backlog=*/false);
    CHECK(w.stats.keyframesWrittenRaw == 0);
    for (int i = 0; i < 4; ++i) CHECK_FALSE(w.stored("keyframes/0/model/w" + std::to_string(i)));
  }
  SECTION("rawWhenBehind off") {
    auto w = writeKeyframe(dir, /*rawWhenBehind=*/false, /*backlog=*/true);
    CHECK(w.stats.keyframesWrittenRaw == 0);
    CHECK(w.stats.droppedRecords == 0);
    for (int i = 0; i < 4; ++i) CHECK_FALSE(w.stored("keyframes/0/model/w" + std::to_string(i)));
    CHECK(w.stats.warnings.empty());
  }
}
