// crashcap-bench-retention: a long recorded run under a small retainBytes, to show that what the
// flight recorder keeps stays bounded however long the training runs. The sample classifier
// trains on Adam for --steps steps (default 5,000) under the default policy except retainBytes
// (--retain-mb), and its batch at the last step carries a NaN, so the run ends in a crash bundle.
// Every --sample-every steps the bench reads its own resident memory (/proc/self/statm) and the
// bytes of the recording's files on disk. Reported:
//   disk      the most the recording held (sampled here, and the writer's own peak,
//             stats().recordingPeakBytes) against retainBytes
//   rss       the resident set after warm-up (the first tenth of the steps): first, lowest,
//             highest and last, and its least-squares slope in MB per 1,000 steps
//   window    the sealed bundle's steps: where they start, whether that is a keyframe, the steps
//             lost inside it, and the replay verdict of the crash step
//   curve     [step, rss_mb, disk_mb] at every sample
// JSON: {"steps", "retain_bytes", "disk": {...}, "rss_mb": {...}, "window": {...}, "curve": [...]}.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/directory.hpp"
#include "crashcap/inspect/story.hpp"
#include "crashcap/recorder/recording_dir.hpp"
#include "crashcap/replayer/replay.hpp"
#include "train.hpp"

namespace {

namespace fs = std::filesystem;
using crashcap::samples::Task;

double residentMb() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<double>(::sysconf(_SC_PAGESIZE)) / 1e6;
}

/// The recording's files, newest segment first, so that a segment deleted between two stat calls
/// is never counted beside a newer one's growth: the sum is at most what the directory held at one
/// instant.
uint64_t recordingBytes(const std::string& recording) {
  auto files = crashcap::recorder::segmentFiles(recording);
  std::reverse(files.begin(), files.end());
  files.push_back((fs::path(recording) / "run.ccap").string());
  uint64_t total = 0;
  for (const auto& f : files) {
    std::error_code ec;
    const uint64_t s = fs::file_size(f, ec);
    if (!ec) total += s;
  }
  return total;
}

int usage(std::FILE* to) {
  std::fprintf(to,
               "usage: crashcap-bench-retention [--json] [--steps N] [--retain-mb M] [--sample-every K] [--task cls|seg]\n"
               "A recorded run of N steps (default 5000) with retainBytes = M MiB (default 16): the recording's\n"
               "disk use against the bound, the process's resident memory over the run, and whether the sealed\n"
               "window starts at a keyframe and replays.\n");
  return to == stdout ? 0 : 2;
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  int64_t steps = 5000, every = 25;
  uint64_t retainMb = 16;
  Task task = Task::Cls;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") return usage(stdout);
    if (a == "--json") json = true;
    else if (a == "--steps" && i + 1 < argc) steps = std::atoll(argv[++i]);
    else if (a == "--retain-mb" && i + 1 < argc) retainMb = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--sample-every" && i + 1 < argc) every = std::atoll(argv[++i]);
    else if (a == "--task" && i + 1 < argc) {
      std::string t = argv[++i];
      if (t != "cls" && t != "seg") return usage(stderr);
      task = t == "cls" ? Task::Cls : Task::Seg;
    } else return usage(stderr);
  }
  if (steps < 100 || every < 1 || retainMb < 1) return usage(stderr);

  auto scratch = fs::temp_directory_path() / ("crashcap-bench-retention-" + std::to_string(::getpid()));
  crashcap::samples::TrainOptions o;
  o.task = task;
  o.steps = steps;
  o.optimizer = "adam";
  o.printEvery = 0;
  o.recordDir = scratch.string();
  o.policy.retainBytes = retainMb << 20;
  o.policy.quiet = true;
  o.fault.fault = crashcap::samples::Fault::NanSample;
  o.fault.step = steps - 1;
  struct Sample {
    int64_t step;
    double rssMb, diskMb;
  };
  std::vector<Sample> curve;
  uint64_t diskPeak = 0;
  const auto t0 = std::chrono::steady_clock::now();
  o.afterStep = [&](int64_t step, const crashcap::recorder::Recorder* rec) {
    const uint64_t disk = rec ? recordingBytes(rec->recordingDir()) : 0;
    diskPeak = std::max(diskPeak, disk);
    if (step % every == 0) {
      curve.push_back({step, residentMb(), disk / 1e6});
      if (!json && step % (every * 40) == 0)
        std::fprintf(stderr, "step %lld: rss %.1f MB, recording %.1f MB\n", static_cast<long long>(step),
                     curve.back().rssMb, curve.back().diskMb);
    }
  };
  auto result = crashcap::samples::train(o);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!result.failed || result.bundle.empty()) {
    std::fprintf(stderr, "bench: the run was to end in a crash bundle at step %lld: %s\n",
                 static_cast<long long>(steps - 1), result.failed ? result.error.c_str() : "it trained through");
    return 1;
  }
  const auto& stats = result.recorderStats;

  // Resident memory after warm-up.
  const int64_t warm = steps / 10;
  std::vector<Sample> after;
  for (const auto& s : curve)
    if (s.step >= warm) after.push_back(s);
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& s : after) {
    sx += s.step, sy += s.rssMb, sxx += double(s.step) * s.step, sxy += s.step * s.rssMb;
  }
  const double n = after.size();
  const double slope = n > 1 ? (n * sxy - sx * sy) / (n * sxx - sx * sx) : 0;
  auto [lo, hi] = std::minmax_element(after.begin(), after.end(),
                                      [](const Sample& a, const Sample& b) { return a.rssMb < b.rssMb; });

  // The sealed window, and the crash step replayed.
  auto story = crashcap::inspect::storyJson(*crashcap::formats::BundleReader::open(result.bundle));
  auto keyframes = story["keyframes"].get<std::vector<int64_t>>();
  const int64_t first = story["steps"]["first"].get<int64_t>();
  const bool startsAtKeyframe = std::find(keyframes.begin(), keyframes.end(), first) != keyframes.end();
  auto replay = crashcap::replayer::replay(result.bundle);
  const uint64_t bundleBytes = fs::file_size(result.bundle);

  nlohmann::json j;
  j["task"] = task == Task::Cls ? "cls" : "seg";
  j["steps"] = steps;
  j["seconds"] = seconds;
  j["retain_bytes"] = o.policy.retainBytes;
  j["keyframe_interval"] = stats.keyframeInterval;
  j["keyframes"] = stats.keyframes;
  j["segments_deleted"] = stats.segmentsDeleted;
  j["dropped_records"] = stats.droppedRecords;
  j["disk"] = {{"peak_sampled_bytes", diskPeak},
               {"peak_writer_bytes", stats.recordingPeakBytes},
               {"within_retain_bytes", std::max(diskPeak, stats.recordingPeakBytes) <= o.policy.retainBytes},
               {"sealed_bundle_bytes", bundleBytes}};
  j["rss_mb"] = {{"warmup_steps", warm},
                 {"after_warmup", after.empty() ? 0 : after.front().rssMb},
                 {"min", after.empty() ? 0 : lo->rssMb},
                 {"max", after.empty() ? 0 : hi->rssMb},
                 {"end", after.empty() ? 0 : after.back().rssMb},
                 {"slope_mb_per_1000_steps", 1000 * slope}};
  j["window"] = {{"first_step", first},
                 {"last_step", story["steps"]["last"]},
                 {"keyframes", keyframes},
                 {"starts_at_keyframe", startsAtKeyframe},
                 {"lost_steps", story["steps"]["lost"]},
                 {"replay_step", replay.step},
                 {"replay_keyframe", replay.keyframe},
                 {"replay_verdict", crashcap::replayer::verdictName(replay.verdict)}};
  nlohmann::json c = nlohmann::json::array();
  for (const auto& s : curve) c.push_back({s.step, s.rssMb, s.diskMb});
  j["curve"] = c;
  crashcap::formats::removeTree(scratch);

  if (json) {
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("%lld steps in %.0f s, a keyframe every %lld steps, %llu segments deleted\n"
                "disk: at most %.2f MiB (the writer's peak %.2f MiB) against retainBytes %.2f MiB\n"
                "rss after warm-up: %.1f MB, then %.1f..%.1f MB, %.1f MB at the end (%+.2f MB per 1000 steps)\n"
                "window: steps %lld..%lld, keyframes %s, %s; replay of step %lld from keyframe %lld: %s\n",
                static_cast<long long>(steps), seconds, static_cast<long long>(stats.keyframeInterval),
                static_cast<unsigned long long>(stats.segmentsDeleted), diskPeak / 1048576.0, stats.recordingPeakBytes / 1048576.0,
                o.policy.retainBytes / 1048576.0, j["rss_mb"]["after_warmup"].get<double>(), j["rss_mb"]["min"].get<double>(),
                j["rss_mb"]["max"].get<double>(), j["rss_mb"]["end"].get<double>(), 1000 * slope,
                static_cast<long long>(first), static_cast<long long>(story["steps"]["last"].get<int64_t>()),
                nlohmann::json(keyframes).dump().c_str(), startsAtKeyframe ? "starts at a keyframe" : "NOT at a keyframe",
                static_cast<long long>(replay.step), static_cast<long long>(replay.keyframe),
                crashcap::replayer::verdictName(replay.verdict));
  }
  return 0;
}
