// Bundle I/O benchmark (`./dev bench io [--json]`): the crashcap writer against `zstd -1 -T1`
// and torch::save on the same tensors, and random access to one tensor in a big bundle.
//
// Method: every contender runs once per round, in the same order, for --rounds rounds in one
// process; we report the median of each and the median (and min/max) of the per-round
// ratios, so machine noise hits both sides of a ratio alike. Writes go to the page cache
// (no fsync on any side). Random-access reads are timed with the bundle in the page cache
// (the format's own cost) and, separately, after evicting it (posix_fadvise DONTNEED).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/directory.hpp"
#include "machine.hpp"

extern char** environ;

namespace {

using namespace crashcap::formats;
using Clock = std::chrono::steady_clock;

struct Named {
  std::string name;
  torch::Tensor t;
};

/// The training-like mix: fp32 weights (init-scale noise), uint8 images (smooth with noise),
/// int64 labels, bf16 activations (ReLU output: half zeros).
std::vector<Named> makeMix(int64_t targetBytes, uint64_t seed) {
  torch::manual_seed(int64_t(seed));
  std::vector<Named> out;
  int64_t bytes = 0;
  for (int i = 0; bytes < targetBytes; ++i) {
    auto w = torch::randn({256, 256, 3, 3}) * 0.02;  // 2.25 MiB fp32
    auto ramp = torch::linspace(0, 255, 224).view({1, 1, 1, 224}).expand({16, 3, 224, 224});
    auto img = (ramp + torch::randint(0, 24, {16, 3, 224, 224})).clamp(0, 255).to(torch::kUInt8);  // 2.3 MiB
    auto labels = torch::randint(0, 1000, {4096}, torch::kInt64);
    auto act = torch::relu(torch::randn({64, 128, 56, 8})).to(torch::kBFloat16);  // 7 MiB
    for (auto& n : {Named{"w" + std::to_string(i), w}, Named{"img" + std::to_string(i), img},
                    Named{"lab" + std::to_string(i), labels}, Named{"act" + std::to_string(i), act}}) {
      bytes += int64_t(n.t.nbytes());
      out.push_back(n);
    }
  }
  return out;
}

DType dtypeOf(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return DType::Float32;
    case torch::kUInt8: return DType::UInt8;
    case torch::kInt64: return DType::Int64;
    case torch::kBFloat16: return DType::BFloat16;
    default: throw std::runtime_error("unexpected dtype in the mix");
  }
}

void writeBundle(const std::string& path, const std::vector<Named>& mix, int level) {
  WriterOptions o;
  o.zstdLevel = level;
  o.compressionThreads = 0;  // one thread: compression on the calling thread
  o.durability.syncOnSeal = false;
  o.overwrite = true;
  auto w = BundleWriter::create(path, o);
  for (const auto& n : mix)
    w->writeTensor(n.name, dtypeOf(n.t), n.t.sizes().vec(), n.t.data_ptr(), n.t.nbytes());
  w->seal();
}

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

int runCommand(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  if (posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), environ) != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

void evict(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd >= 0) {
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
}

/// Bytes this process asked the kernel to read so far (rchar in /proc/self/io).
uint64_t bytesRequested() {
  std::ifstream in("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (in >> key >> value)
    if (key == "rchar:") return value;
  return 0;
}

struct ReadSample {
  double ms = 0;
  uint64_t bytes = 0;  ///< bytes read(2)/pread(2) by open + readTensor
};

/// Opens the bundle and reads one tensor; `cold` evicts the file's pages first.
ReadSample readOne(const std::string& path, const std::string& name, bool cold) {
  if (cold) evict(path);
  uint64_t before = bytesRequested();
  auto a = Clock::now();
  auto r = BundleReader::open(path);
  auto bytes = r->readTensor(r->get(name));
  auto b = Clock::now();
  if (bytes.size() != 4u << 20) throw std::runtime_error("wrong tensor size read");
  return {seconds(a, b) * 1000, bytesRequested() - before};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

nlohmann::json spread(const std::vector<double>& v) {
  return {{"median", median(v)}, {"min", *std::min_element(v.begin(), v.end())},
          {"max", *std::max_element(v.begin(), v.end())}};
}

}  // namespace

int main(int argc, char** argv) {
  bool json = false;
  int rounds = 7;
  int64_t mixMiB = 256;
  std::string dir = std::filesystem::temp_directory_path().string();
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--json") json = true;
    else if (a == "--rounds" && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
    else if (a == "--mix-mib" && i + 1 < argc) mixMiB = std::max<int64_t>(16, std::atoll(argv[++i]));
    else if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    else {
      std::cerr << "usage: crashcap-bench-io [--json] [--rounds N] [--mix-mib N] [--dir D]\n";
      return 2;
    }
  }
  torch::set_num_threads(1);
  auto work = std::filesystem::path(dir) / ("crashcap-bench-io-" + std::to_string(getpid()));
  std::filesystem::create_directories(work);
  auto path = [&](const char* n) { return (work / n).string(); };

  auto mix = makeMix(mixMiB << 20, 1);
  uint64_t rawBytes = 0;
  for (const auto& n : mix) rawBytes += n.t.nbytes();
  {  // the same raw bytes, one file, for the zstd CLI
    std::ofstream raw(path("raw.bin"), std::ios::binary);
    for (const auto& n : mix) raw.write(static_cast<const char*>(n.t.data_ptr()), std::streamsize(n.t.nbytes()));
  }
  const double mb = double(rawBytes) / 1e6;
  std::vector<double> writeMbs, zstdMbs, rawMbs, torchMbs, ratioZstd, ratioTorch;
  uint64_t bundleBytes = 0, zstdBytes = 0;
  // Each timed write starts from a clean page cache state (sync, previous output removed),
  // so one contender's writeback does not throttle the next.
  auto timed = [&](const std::function<void()>& fn) {
    sync();
    auto a = Clock::now();
    fn();
    return seconds(a, Clock::now());
  };
  for (int r = 0; r < rounds; ++r) {
    if (!json) std::cerr << "round " << r + 1 << "/" << rounds << "\n";
    double tL1 = timed([&] { writeBundle(path("l1.ccap"), mix, 1); });
    bundleBytes = std::filesystem::file_size(path("l1.ccap"));
    std::filesystem::remove(path("l1.ccap"));
    double tZstd = timed([&] {
      if (runCommand({"zstd", "-1", "-T1", "-q", "-f", path("raw.bin"), "-o", path("raw.bin.zst")}) != 0)
        throw std::runtime_error("`zstd` failed or is not installed (apt-get install zstd)");
    });
    zstdBytes = std::filesystem::file_size(path("raw.bin.zst"));
    std::filesystem::remove(path("raw.bin.zst"));
    double tRaw = timed([&] { writeBundle(path("raw.ccap"), mix, 0); });
    std::filesystem::remove(path("raw.ccap"));
    double tTorch = timed([&] {
      std::vector<torch::Tensor> ts;
      for (const auto& n : mix) ts.push_back(n.t);
      torch::save(ts, path("mix.pt"));
    });
    std::filesystem::remove(path("mix.pt"));
    writeMbs.push_back(mb / tL1);
    zstdMbs.push_back(mb / tZstd);
    rawMbs.push_back(mb / tRaw);
    torchMbs.push_back(mb / tTorch);
    ratioZstd.push_back(writeMbs.back() / zstdMbs.back());
    ratioTorch.push_back(rawMbs.back() / torchMbs.back());
  }
  std::filesystem::remove(path("raw.bin"));

  // Random access: one 4 MiB tensor in the middle of a >= 1 GiB bundle vs alone.
  auto target = torch::randn({1 << 20});  // 4 MiB fp32
  {
    WriterOptions o;
    o.durability.syncOnSeal = false;
    o.overwrite = true;
    auto w = BundleWriter::create(path("big.ccap"), o);
    int copy = 0;
    while (w->stats().fileBytes < (1ull << 30) + (64ull << 20)) {
      for (const auto& n : mix) {
        w->writeTensor("c" + std::to_string(copy) + "/" + n.name, dtypeOf(n.t), n.t.sizes().vec(), n.t.data_ptr(),
                       n.t.nbytes());
        if (copy == 1 && n.name == mix[mix.size() / 2].name)
          w->writeTensor("target", DType::Float32, {1 << 20}, target.data_ptr(), 4u << 20);
      }
      ++copy;
    }
    w->seal();
    auto s = BundleWriter::create(path("small.ccap"), o);
    s->writeTensor("target", DType::Float32, {1 << 20}, target.data_ptr(), 4u << 20);
    s->seal();
  }
  uint64_t bigBytes = std::filesystem::file_size(path("big.ccap"));
  // Warm: both files in the page cache, so the time is the format's work (open + index +
  // chunk reads + decode). Cold: pages evicted first; on a VM this mostly measures the
  // virtual disk's readahead at different file offsets, so it is reported but not the target.
  std::vector<double> bigMs, smallMs, ratioRead, bigCold, smallCold, ratioCold;
  ReadSample bigSample, smallSample;
  readOne(path("big.ccap"), "target", false);
  readOne(path("small.ccap"), "target", false);
  for (int r = 0; r < std::max(rounds, 7); ++r) {
    bigSample = readOne(path("big.ccap"), "target", false);
    smallSample = readOne(path("small.ccap"), "target", false);
    bigMs.push_back(bigSample.ms);
    smallMs.push_back(smallSample.ms);
    ratioRead.push_back(bigMs.back() / smallMs.back());
    bigCold.push_back(readOne(path("big.ccap"), "target", true).ms);
    smallCold.push_back(readOne(path("small.ccap"), "target", true).ms);
    ratioCold.push_back(bigCold.back() / smallCold.back());
  }
  crashcap::formats::removeTree(work);

  nlohmann::json j = {
      {"write_mb_s", median(writeMbs)},
      {"zstd_cli_mb_s", median(zstdMbs)},
      {"raw_write_mb_s", median(rawMbs)},
      {"torch_save_mb_s", median(torchMbs)},
      {"one_tensor_big_ms", median(bigMs)},
      {"one_tensor_small_ms", median(smallMs)},
      {"one_tensor_big_read_bytes", bigSample.bytes},
      {"one_tensor_small_read_bytes", smallSample.bytes},
      {"one_tensor_big_cold_ms", median(bigCold)},
      {"one_tensor_small_cold_ms", median(smallCold)},
      {"ratios",
       {{"write_vs_zstd_cli", spread(ratioZstd)},
        {"raw_write_vs_torch_save", spread(ratioTorch)},
        {"one_tensor_big_vs_small", spread(ratioRead)},
        {"one_tensor_big_vs_small_cold", spread(ratioCold)}}},
      {"targets",
       {{"write_vs_zstd_cli_min", 0.9}, {"raw_write_vs_torch_save_min", 1.0}, {"one_tensor_big_vs_small_max", 1.5}}},
      {"data",
       {{"raw_bytes", rawBytes},
        {"bundle_bytes_level1", bundleBytes},
        {"zstd_cli_bytes", zstdBytes},
        {"big_bundle_bytes", bigBytes},
        {"tensors", mix.size()},
        {"mix", "fp32 weights N(0,0.02) [256,256,3,3]; uint8 images [16,3,224,224] ramp+noise; int64 labels "
                "[4096]; bf16 ReLU activations [64,128,56,8]"}}},
      {"method", {{"rounds", rounds}, {"compression_threads", 1}, {"zstd_level", 1}, {"fsync", false},
                  {"read_cache", "one_tensor_*_ms: warm page cache; *_cold_ms: evicted with posix_fadvise(DONTNEED)"}}},
      {"machine", crashcap::bench::machine()},
  };
  if (json) {
    std::cout << j.dump() << "\n";
  } else {
    std::cout << j.dump(2) << "\n";
  }
  return 0;
}
