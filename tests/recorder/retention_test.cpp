// Retention by bytes: the recording's files on disk (run.ccap and its segments, the one being
// written included) stay within Policy::retainBytes at every instant, the oldest segment going
// as soon as the next write would cross the bound, while the window still starts at a keyframe
// and no step is lost.
// LibTorch first: glog's CHECK must not replace Catch's.
#include <torch/torch.h>
#undef CHECK
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/inspect/story.hpp"
#include "crashcap/recorder/recorder.hpp"
#include "crashcap/recorder/recording_dir.hpp"
#include "test_support.hpp"

using namespace crashcap;
namespace fs = std::filesystem;

namespace {

/// The bytes of every file in the recordings under `dir`, newest file first: a file is stat'ed
/// only after every newer one, so that a segment deleted meanwhile is not counted beside the
/// growth of a newer one (the sum never exceeds what the directory held at one instant).
uint64_t recordingBytes(const std::string& dir) {
  uint64_t total = 0;
  for (const auto& recording : recorder::findRecordings(dir)) {
    auto files = recorder::segmentFiles(recording);
    std::reverse(files.begin(), files.end());
    files.push_back((fs::path(recording) / "run.ccap").string());
    for (const auto& f : files) {
      std::error_code ec;
      uint64_t s = fs::file_size(f, ec);
      if (!ec) total += s;
    }
  }
  return total;
}

}  // namespace

TEST_CASE("the recording on disk stays within retainBytes, the growing segment counted", "[recorder][retention]") {
  test::TempDir dir;
  auto model = std::make_shared<torch::nn::Module>();
  model->register_parameter("w", torch::randn({256 << 10}));  // 1 MiB: a keyframe of 3 MiB with Adam
  torch::optim::Adam adam(model->parameters(), torch::optim::AdamOptions(1e-4));

  recorder::Policy policy;
  policy.quiet = true;
  policy.crashGuard = false;
  policy.kernelTrace = false;
  policy.keyframeEvery = 10;      // a segment: a 3 MiB keyframe and 10 steps of 256 KiB batches
  policy.retainSegments = 0;      // bounded by bytes alone
  policy.retainBytes = 16 << 20;  // room for about three segments: the growing one must count
  std::atomic<bool> done{false};
  std::atomic<uint64_t> seen{0};
  std::thread watcher([&] {
    while (!done.load()) {
      seen = std::max<uint64_t>(seen.load(), recordingBytes(dir.path()));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });

  std::string bundle;
  recorder::RecorderStats stats;
  {
    recorder::Recorder rec(dir.path(), policy);
    rec.setModel(*model);
    rec.setOptimizer(adam);
    const int64_t steps = 150;
    for (int64_t step = 0; step < steps; ++step) {
      auto x = torch::randn({64, 1024});  // random: stored raw, 256 KiB a step
      auto guard = rec.beginStep(step, {{"x", x}});
      adam.zero_grad();
      auto loss = (model->parameters()[0].sum() * x.mean());
      loss.backward();
      guard.end(loss);
      adam.step();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    stats = rec.stats();
    bundle = rec.fail(std::runtime_error("the end of the test"));
    rec.close();
  }
  done = true;
  watcher.join();

  INFO("peak " << stats.recordingPeakBytes << " B, watched " << seen.load() << " B, deleted "
               << stats.segmentsDeleted << " segments");
  CHECK(stats.lostStepCount == 0);
  CHECK(stats.droppedRecords == 0);
  CHECK(stats.segmentsDeleted >= 8);  // 15 segments written, a few kept
  CHECK(stats.recordingPeakBytes <= policy.retainBytes);
  CHECK(stats.recordingPeakBytes > policy.retainBytes / 2);
  CHECK(seen.load() <= policy.retainBytes);

  // The sealed window starts at a keyframe, holds two, and every step from it to the end.
  REQUIRE(!bundle.empty());
  auto story = inspect::storyJson(*formats::BundleReader::open(bundle));
  INFO(story["steps"].dump() << " keyframes " << story["keyframes"].dump());
  auto keyframes = story["keyframes"].get<std::vector<int64_t>>();
  REQUIRE(keyframes.size() >= 2);
  const int64_t first = *std::min_element(keyframes.begin(), keyframes.end());
  CHECK(first > 0);  // the start was retained away
  CHECK(story["steps"]["first"] == first);
  CHECK(story["steps"]["last"] == 149);
  CHECK(story["steps"]["count"] == 150 - first);
  CHECK(story["steps"]["lost"].empty());
}
