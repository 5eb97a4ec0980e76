// Standalone fuzz driver for every fuzz target (bundle, recover, npy), for machines and CI
// runs without libFuzzer.
// Structure-aware: besides blind bit flips and cuts it rewrites header fields, metas and
// bodies and then re-computes their checksums, so mutated lengths and Cap'n Proto messages
// get past the checksums and reach the limit checks and decoders. Any allocation above
// kAllocationCap aborts (the readers' limits must keep every allocation below it), and an
// input that runs longer than kInputSeconds aborts; both write the input to
// fuzz-failure-<target>.bin for reproduction. `--write-seeds DIR` writes the built-in seeds
// (bundles with tensors, notes, an environment and recorder records) for libFuzzer to start from.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/layout.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/inspect/npy.hpp"

int fuzzBundleReader(const uint8_t* data, size_t size);
int fuzzBundleRecover(const uint8_t* data, size_t size);
int fuzzNpyReader(const uint8_t* data, size_t size);

namespace {

constexpr size_t kAllocationCap = 256ull << 20;
constexpr unsigned kInputSeconds = 20;

const uint8_t* gInput = nullptr;
size_t gInputSize = 0;
const char* gFailurePath = "fuzz-failure.bin";

void dumpInput(const char* why) {
  int fd = ::open(gFailurePath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0 && gInput) {
    ssize_t ignored = ::write(fd, gInput, gInputSize);
    (void)ignored;
    ::close(fd);
  }
  ssize_t ignored = ::write(2, why, strlen(why));
  ignored = ::write(2, gFailurePath, strlen(gFailurePath));
  ignored = ::write(2, "\n", 1);
  (void)ignored;
}

void onFatal(int sig) {
  dumpInput(sig == SIGALRM ? "fuzz: input ran too long; saved to " : "fuzz: crash; input saved to ");
  signal(sig, SIG_DFL);
  raise(sig == SIGALRM ? SIGABRT : sig);
}

}  // namespace

void* operator new(size_t size) {
  if (size > kAllocationCap) {
    char msg[128];
    snprintf(msg, sizeof msg, "fuzz: allocation of %zu bytes exceeds the cap; input saved to ", size);
    dumpInput(msg);
    std::abort();
  }
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t size) { return operator new(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }

namespace {

using Bytes = std::vector<uint8_t>;
using crashcap::formats::kRecordHeaderSize;

Bytes readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

std::string tempPath(const char* name) {
  return (std::filesystem::temp_directory_path() / (std::string("crashcap-fuzz-") + std::to_string(getpid()) + name))
      .string();
}

std::vector<Bytes> bundleSeeds() {
  using namespace crashcap::formats;
  std::vector<Bytes> seeds;
  for (int variant = 0; variant < 3; ++variant) {
    std::string path = tempPath(".ccap");
    std::remove(path.c_str());
    WriterOptions o;
    o.chunkBytes = 4096;
    o.zstdLevel = variant == 2 ? 0 : 3;
    auto w = BundleWriter::create(path, o);
    std::vector<float> f(1100);
    for (size_t i = 0; i < f.size(); ++i) f[i] = float(i % 37) * 0.25f;
    w->writeTensor("weights/w", DType::Float32, {11, 100}, f.data(), f.size() * 4);
    int64_t labels[4] = {1, 0, 7, 3};
    w->writeTensor("batch/labels", DType::Int64, {4}, labels, sizeof labels);
    uint16_t half[6] = {0x3c00, 0x7c00, 0x7e00, 0, 0x8000, 0xfbff};
    w->writeTensor("h", DType::Float16, {2, 3}, half, sizeof half);
    double scalar = 3.5;
    w->writeTensor("s", DType::Float64, {}, &scalar, 8);
    w->writeTensor("empty", DType::Complex64, {0, 4}, nullptr, 0);
    w->writeNote("user.note", "seed");
    EnvironmentData env;
    env.facts = {{"cpu.model", "seed"}, {"os.wsl2", "no"}};
    env.variables = {{"CUDA_LAUNCH_BLOCKING", "1"}, {"WANDB_API_KEY", "<redacted>"}};
    env.commandLine = {"python", "train.py"};
    env.redacted = {"WANDB_API_KEY"};
    w->writeEnvironment(env);
    if (variant != 2) {  // the recorder's records, so mutations reach their decoders
      writeMetaRecord(*w, StepBeginData{4, {"batch/labels"}, {}, {0.1}, 1000, -1});
      writeMetaRecord(*w, StepEndData{4, 0.5, 1.25, true, false, 2000});
      writeMetaRecord(*w, OpTraceData{{{7, "aten::mul", "forward", 3, 4, 11, {{"float32", {11, 100}}}, 1, 2}}, 8, 16});
      writeMetaRecord(*w, CrashData{"signal", 4, "forward", "boom", "", 11, "SIGSEGV", {"#0 f"}, 3000, 42, 11});
      KernelTraceData trace;
      trace.status = "recorded";
      TraceActivityData kernel;
      kernel.name = "_Z6kernelPf";
      kernel.endNs = 5;
      trace.activities = {kernel};
      KernelLaunchData launch;
      launch.symbol = "_Z6kernelPf";
      launch.api = "cudaLaunchKernel";
      trace.launches = {launch};
      trace.firstError = ApiErrorData{"runtime", "cudaLaunchKernel", 700, "cudaErrorIllegalAddress", 1, 4, 11, "", 7};
      writeMetaRecord(*w, trace);
    }
    if (variant != 1) w->seal();
    else w->sync();
    w.reset();
    seeds.push_back(readAll(path));
    std::remove(path.c_str());
  }
  return seeds;
}

std::vector<Bytes> npySeeds() {
  using namespace crashcap;
  std::vector<Bytes> seeds;
  std::string path = tempPath(".npy");
  for (auto dtype : {formats::DType::Float32, formats::DType::Int64, formats::DType::Bool, formats::DType::Complex128,
                     formats::DType::Float16}) {
    inspect::HostTensor t;
    t.dtype = dtype;
    t.shape = {2, 3};
    t.bytes.assign(6 * formats::elementSize(dtype), 1);
    inspect::writeNpy(t, path);
    seeds.push_back(readAll(path));
  }
  std::remove(path.c_str());
  const char* hdr = "{'descr': '>f8', 'fortran_order': True, 'shape': (2, 2), }";
  Bytes b = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  std::string h = hdr;
  while ((10 + h.size() + 1) % 64) h += ' ';
  h += '\n';
  b.push_back(uint8_t(h.size()));
  b.push_back(uint8_t(h.size() >> 8));
  b.insert(b.end(), h.begin(), h.end());
  b.resize(b.size() + 32, 0x3f);
  seeds.push_back(b);
  return seeds;
}

const uint64_t kInteresting[] = {0, 1, 7, 8, 63, 64, 4095, 4096, 1u << 20, 1ull << 31, 1ull << 32, 1ull << 40,
                                 1ull << 62, UINT64_MAX, UINT64_MAX - 7};

/// Offsets of the intact record headers, found by walking lengths from the file header on.
std::vector<size_t> recordOffsets(const Bytes& b) {
  using namespace crashcap::formats;
  std::vector<size_t> out;
  size_t pos = kFileHeaderSize;
  while (pos + kRecordHeaderSize <= b.size()) {
    auto c = decodeRecordHeader(b.data() + pos);
    if (!c.header || c.header->totalLength() > b.size() - pos) break;
    out.push_back(pos);
    pos += c.header->totalLength();
  }
  return out;
}

void rehashRecord(Bytes& b, size_t at) {
  using namespace crashcap::formats;
  uint8_t* h = b.data() + at;
  uint64_t meta = getU32(h + 16), body = getU64(h + 24);
  if (at + kRecordHeaderSize + meta + body <= b.size()) {
    putU64(h + 40, hash64(h + kRecordHeaderSize, meta));
    putU64(h + 48, hash64(h + kRecordHeaderSize + meta, body));
  }
  putU64(h + 56, hash64(h, 56));
}

void mutateBundle(Bytes& b, std::mt19937_64& rng) {
  using namespace crashcap::formats;
  auto offsets = recordOffsets(b);
  if (offsets.empty()) return;
  size_t at = offsets[rng() % offsets.size()];
  uint8_t* h = b.data() + at;
  switch (rng() % 6) {
    case 0:  // a length field
      switch (rng() % 3) {
        case 0: putU32(h + 16, uint32_t(kInteresting[rng() % std::size(kInteresting)]) & ~7u); break;
        case 1: putU64(h + 24, kInteresting[rng() % std::size(kInteresting)]); break;
        default: putU64(h + 32, kInteresting[rng() % std::size(kInteresting)]); break;
      }
      putU64(h + 56, hash64(h, 56));
      break;
    case 1:  // type, flags or sequence
      putU16(h + 4, uint16_t(rng() % 20));
      if (rng() % 2) putU16(h + 6, uint16_t(rng()));
      if (rng() % 2) putU64(h + 8, kInteresting[rng() % std::size(kInteresting)]);
      putU64(h + 56, hash64(h, 56));
      break;
    case 2:
    case 3: {  // meta words: Cap'n Proto pointers and values, then valid checksums
      uint32_t meta = getU32(h + 16);
      if (meta >= 8 && at + kRecordHeaderSize + meta <= b.size()) {
        size_t word = at + kRecordHeaderSize + 8 * (rng() % (meta / 8));
        if (rng() % 2) putU64(b.data() + word, kInteresting[rng() % std::size(kInteresting)]);
        else b[word + rng() % 8] ^= uint8_t(1u << (rng() % 8));
      }
      rehashRecord(b, at);
      break;
    }
    case 4: {  // body bytes
      uint32_t meta = getU32(h + 16);
      uint64_t body = getU64(h + 24);
      if (body && at + kRecordHeaderSize + meta + body <= b.size())
        b[at + kRecordHeaderSize + meta + rng() % body] ^= uint8_t(1u << (rng() % 8));
      rehashRecord(b, at);
      break;
    }
    default: {  // footer fields
      if (b.size() >= kFooterSize) {
        uint8_t* f = b.data() + b.size() - kFooterSize;
        if (decodeFooter(f).footer) {
          putU64(f + (rng() % 2) * 8, kInteresting[rng() % std::size(kInteresting)]);
          putU64(f + 24, hash64(f, 24));
        }
      }
    }
  }
}

void mutateNpy(Bytes& b, std::mt19937_64& rng) {
  // Rewrite a digit run or a quoted descr inside the header text.
  size_t end = std::min<size_t>(b.size(), 256);
  for (int tries = 0; tries < 8 && end > 10; ++tries) {
    size_t i = 10 + rng() % (end - 10);
    if (isdigit(b[i])) {
      std::string big = std::to_string(kInteresting[rng() % std::size(kInteresting)]);
      b.erase(b.begin() + long(i));
      b.insert(b.begin() + long(i), big.begin(), big.end());
      return;
    }
    if (b[i] == '<' || b[i] == '>' || b[i] == '|') {
      const char* codes = "fiucbVOSUMm?";
      if (i + 1 < b.size()) b[i + 1] = uint8_t(codes[rng() % strlen(codes)]);
      return;
    }
  }
}

void mutate(Bytes& b, bool bundle, std::mt19937_64& rng) {
  int rounds = 1 + int(rng() % 3);
  for (int r = 0; r < rounds; ++r) {
    if (b.empty()) {
      b.push_back(uint8_t(rng()));
      continue;
    }
    switch (rng() % 8) {
      case 0: b[rng() % b.size()] ^= uint8_t(1u << (rng() % 8)); break;
      case 1: b[rng() % b.size()] = uint8_t(kInteresting[rng() % std::size(kInteresting)]); break;
      case 2: b.resize(rng() % b.size()); break;
      case 3: {
        size_t from = rng() % b.size(), len = std::min<size_t>(rng() % 256 + 1, b.size() - from);
        Bytes piece(b.begin() + long(from), b.begin() + long(from + len));
        b.insert(b.begin() + long(rng() % b.size()), piece.begin(), piece.end());
        break;
      }
      case 4: {
        size_t from = rng() % b.size(), len = std::min<size_t>(rng() % 256 + 1, b.size() - from);
        b.erase(b.begin() + long(from), b.begin() + long(from + len));
        break;
      }
      default:
        if (bundle) mutateBundle(b, rng);
        else mutateNpy(b, rng);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string target = "bundle";
  std::string seedDir;
  double seconds = 30;
  uint64_t seed = 1;
  std::vector<std::string> corpus;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--target" && i + 1 < argc) target = argv[++i];
    else if (a == "--write-seeds" && i + 1 < argc) seedDir = argv[++i];
    else if (a == "--seconds" && i + 1 < argc) seconds = std::atof(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--help") {
      std::printf("usage: fuzz_standalone [--target bundle|recover|npy] [--seconds N] [--seed N] [CORPUS_FILE...]\n"
                  "       fuzz_standalone [--target bundle|recover|npy] --write-seeds DIR\n"
                  "       a single file argument with --seconds 0 replays that input once\n");
      return 0;
    } else corpus.push_back(a);
  }
  bool bundle = target == "bundle" || target == "recover";
  if (!bundle && target != "npy") {
    std::fprintf(stderr, "unknown target '%s' (bundle, recover or npy)\n", target.c_str());
    return 2;
  }
  static std::string failure = "fuzz-failure-" + target + ".bin";
  gFailurePath = failure.c_str();
  auto run = target == "bundle" ? fuzzBundleReader : target == "recover" ? fuzzBundleRecover : fuzzNpyReader;
  for (int sig : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGALRM}) signal(sig, onFatal);

  std::vector<Bytes> seeds = bundle ? bundleSeeds() : npySeeds();
  if (!seedDir.empty()) {
    std::filesystem::create_directories(seedDir);
    for (size_t i = 0; i < seeds.size(); ++i) {
      std::string path = seedDir + "/seed-" + std::to_string(i) + (bundle ? ".ccap" : ".npy");
      std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(seeds[i].data()),
                                                  std::streamsize(seeds[i].size()));
    }
    std::printf("wrote %zu seeds to %s\n", seeds.size(), seedDir.c_str());
    return 0;
  }
  for (const auto& c : corpus) seeds.push_back(readAll(c));
  if (seconds <= 0) {
    for (const auto& s : seeds) {
      gInput = s.data();
      gInputSize = s.size();
      run(s.data(), s.size());
    }
    std::printf("replayed %zu inputs\n", seeds.size());
    return 0;
  }
  std::mt19937_64 rng(seed);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t executions = 0;
  for (const auto& s : seeds) {
    gInput = s.data();
    gInputSize = s.size();
    alarm(kInputSeconds);
    run(s.data(), s.size());
  }
  while (std::chrono::steady_clock::now() < deadline) {
    Bytes input = seeds[rng() % seeds.size()];
    mutate(input, bundle, rng);
    gInput = input.data();
    gInputSize = input.size();
    alarm(kInputSeconds);
    run(input.data(), input.size());
    alarm(0);
    ++executions;
    // Keep some mutants as new seeds so mutations stack.
    if (rng() % 16 == 0 && seeds.size() < 256) seeds.push_back(std::move(input));
  }
  std::printf("fuzz %s: %llu inputs in %.0f s, no crash, hang or allocation over %zu MiB\n", target.c_str(),
              (unsigned long long)executions, seconds, kAllocationCap >> 20);
  return 0;
}
