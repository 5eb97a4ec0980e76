#include "live_writer.hpp"

#include <cxxabi.h>
#include <execinfo.h>
#include <fmt/format.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "crashcap/formats/clock.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/python_frames.hpp"
#include "crashcap/formats/signal_name.hpp"
#include "crashcap/recorder/recording_dir.hpp"
#include "crashcap/recorder/signal_context.hpp"

namespace crashcap::recorder::detail {

/// What zstd must save of a tensor for the recorder to keep it compressed (WriterOptions::minSavings).
constexpr double kRecorderMinSavings = 0.15;
/// How long the idle writer sleeps before it looks for a crash a signal handler requested (the
/// handler cannot wake it) and for records pushed without waking it. Each wake-up of an idle
/// thread costs 40 us of processor time or more on a virtual machine, taken from a training that
/// uses every core: at 20 ms the polls cost the writer about a sixth of its time in a training
/// (docs/PERFORMANCE.md, "A fifteenth look"). A fatal signal's bundle is sealed up to this much
/// later (the dying thread waits for it).
constexpr auto kIdlePoll = std::chrono::milliseconds(250);
namespace fs = std::filesystem;
using crashcap::Error;
using crashcap::ErrorCode;

namespace {

std::atomic<LiveWriter*> gActive{nullptr};

/// Filled in by the signal handler (no allocation there), read by the writer thread.
struct SignalCrash {
  int signal = 0;
  void* address = nullptr;
  int senderPid = 0;  ///< > 0: sent by that process; -1: sent by one not visible here; 0: a fault
  void* frames[64] = {};
  int frameCount = 0;
  uint64_t thread = 0;
  int64_t timeNs = 0;
};
SignalCrash gSignal;

/// The interpreter's stack dump (setSignalContextDump) and the memory file it writes into: made
/// before any signal, since a handler cannot open files safely.
std::atomic<crashcap::recorder::SignalContextDump> gContextDump{nullptr};
std::atomic<int> gContextFd{-1};
std::atomic<bool> gContextWritten{false};
/// The thread inside the dump (0: none), and where a fault in it jumps back to: a native crash
/// may have left the interpreter's frames damaged, and a fault while reading them must not cost
/// the crash its bundle (escapeSignalContextDump).
std::atomic<uint64_t> gDumpingThread{0};
sigjmp_buf gDumpJump;

/// Frames `File "X", line N, in F` from a CPython stack dump (`  File "X", line N in F`, most
/// recent call first), in that order.
std::vector<std::string> interpreterFrames(const std::string& text) {
  std::vector<std::string> frames;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    at = end + 1;
    const auto start = line.find("File \"");
    const auto in = line.rfind(" in ");
    if (start == std::string::npos || in == std::string::npos || in < start) continue;
    frames.push_back(line.substr(start, in - start) + ", in " + line.substr(in + 4));
  }
  return frames;
}

/// "; in Python at <the program's innermost frame> (calling <the innermost>)", for the error.
std::string interpreterLineText(const std::vector<std::string>& frames) {
  const auto own = formats::programFrame(frames);
  if (!own || *own == frames.front()) return "; in Python at " + frames.front();
  return fmt::format("; in Python at {} (calling {})", *own, frames.front());
}

/// What the dump wrote for this signal, as frames (empty: none).
std::vector<std::string> readInterpreterFrames() {
  const int fd = gContextFd.load();
  if (!gContextWritten.load() || fd < 0) return {};
  std::string text(64 * 1024, '\0');
  const ssize_t n = ::pread(fd, text.data(), text.size(), 0);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return interpreterFrames(text);
}


uint64_t threadId() { return static_cast<uint64_t>(::syscall(SYS_gettid)); }

}  // namespace

LiveWriter* activeWriter() { return gActive.load(std::memory_order_acquire); }
void setActiveWriter(LiveWriter* writer) { gActive.store(writer, std::memory_order_release); }

std::vector<std::string> symbolize(void* const* frames, int count) {
  std::vector<std::string> out;
  char** symbols = backtrace_symbols(frames, count);
  for (int i = 0; i < count; ++i) {
    std::string line = symbols ? symbols[i] : fmt::format("[{}]", frames[i]);
    // "binary(mangled+0x1a) [0x...]": demangle the part between '(' and '+'.
    auto open = line.find('('), plus = line.find('+', open == std::string::npos ? 0 : open);
    if (open != std::string::npos && plus != std::string::npos && plus > open + 1) {
      std::string mangled = line.substr(open + 1, plus - open - 1);
      int status = 0;
      char* demangled = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
      if (status == 0 && demangled) {
        line = line.substr(0, open) + ": " + demangled + " " + line.substr(plus, line.find(')', plus) - plus) +
               line.substr(line.find(')', plus) + 1);
      }
      std::free(demangled);
    }
    if (line.size() > 4000) line.resize(4000);
    out.push_back(std::move(line));
  }
  std::free(symbols);
  return out;
}

namespace {

constexpr size_t kProgressBytes = 4096;

/// Until the first recording maps its progress file: plain shared memory with the same layout.
ProgressPage* anonymousProgressPage() {
  void* p = ::mmap(nullptr, kProgressBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw Error(ErrorCode::Io, fmt::format("cannot map the progress page: {}", std::strerror(errno)));
  auto* page = static_cast<ProgressPage*>(p);
  std::memcpy(page->magic, ProgressPage::kMagic, sizeof page->magic);
  page->step.store(-1);
  page->phase.store(static_cast<int>(Phase::Setup));
  page->stepsBegun.store(0);
  return page;
}

}  // namespace

LiveWriter::LiveWriter(LiveWriterOptions options) : page_(anonymousProgressPage()), options_(std::move(options)) {
  std::error_code ec;
  fs::create_directories(options_.outputDir, ec);
  if (ec)
    throw Error(ErrorCode::Io, fmt::format("cannot create the output directory {}: {}", options_.outputDir, ec.message()),
                "check the path and its permissions, or pass another directory");
  runRecords_ = std::move(options_.runRecords);  // startRecording writes them and syncs
  startRecording();
  settleProgress();  // no step has begun: this thread is the page's only user yet
  // A full file-size limit must surface as EFBIG from write(2), which the writer turns into
  // a counted drop, not as SIGXFSZ killing the training.
  struct sigaction old {};
  if (sigaction(SIGXFSZ, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) std::signal(SIGXFSZ, SIG_IGN);
  thread_ = std::thread([this] { loop(); });
}

LiveWriter::~LiveWriter() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (activeWriter() == this) setActiveWriter(nullptr);
  if (void* pending = pendingPage_.exchange(nullptr)) ::munmap(pending, kProgressBytes);
  ::munmap(page_, kProgressBytes);
}

void LiveWriter::mapProgress(const std::string& dir) {
  // The file is written whole (its blocks allocated now, so a store into the mapping never
  // faults for want of disk) and mapped; the training thread gives it the page's values and
  // moves it over the page in one step (mremap) at its next step: its stores never meet an
  // unmapped page, and none is lost between the copy and the move. A file system that cannot
  // do this leaves the page in memory: the recording works, and `seal` knows the step only from
  // the records that reached the disk.
  const std::string path = (fs::path(dir) / kProgressFileName).string();
  auto fail = [&](const char* what, int error) {
    addWarning(fmt::format("no progress file in {} ({}: {}); after a SIGKILL the step comes from the records alone",
                           dir, what, error ? std::strerror(error) : "short write"));
    std::error_code ec;
    fs::remove(path, ec);
  };
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fail("open", errno);
  static const unsigned char zeros[kProgressBytes] = {};
  errno = 0;
  bool written = ::pwrite(fd, zeros, sizeof zeros, 0) == static_cast<ssize_t>(sizeof zeros);
  void* file = written ? ::mmap(nullptr, kProgressBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  const int error = errno;
  ::close(fd);
  if (file == MAP_FAILED) return fail(written ? "mmap" : "write", error);
  offerPage(file);
}

void LiveWriter::unmapProgress() {
  void* memory = ::mmap(nullptr, kProgressBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory != MAP_FAILED) offerPage(memory);
}

void LiveWriter::offerPage(void* fresh) {
  if (void* stale = pendingPage_.exchange(fresh, std::memory_order_acq_rel)) ::munmap(stale, kProgressBytes);
}

void LiveWriter::settlePending() {
  void* fresh = pendingPage_.exchange(nullptr, std::memory_order_acq_rel);
  if (!fresh) return;
  if (int error = movePage(fresh))
    addWarning(fmt::format("the progress page could not be moved ({}): after a SIGKILL the step comes from the "
                           "records alone",
                           std::strerror(error)));
}

int LiveWriter::movePage(void* fresh) {
  std::memcpy(fresh, page_, sizeof(ProgressPage));
  if (::mremap(fresh, kProgressBytes, kProgressBytes, MREMAP_MAYMOVE | MREMAP_FIXED, page_) != MAP_FAILED) return 0;
  const int error = errno;
  ::munmap(fresh, kProgressBytes);
  return error;
}

void LiveWriter::startRecording() {
  int64_t t = formats::unixTimeNs();
  std::string dir = (fs::path(options_.outputDir) / recordingDirName(t, static_cast<uint32_t>(::getpid()))).string();
  std::error_code ec;
  for (int i = 2; fs::exists(dir, ec); ++i)
    dir = (fs::path(options_.outputDir) / fmt::format("{}-{}", recordingDirName(t, ::getpid()), i)).string();
  fs::create_directories(dir, ec);
  if (ec) throw Error(ErrorCode::Io, fmt::format("cannot create {}: {}", dir, ec.message()));
  formats::WriterOptions wo;
  wo.zstdLevel = options_.zstdLevel;
  wo.producer = "crashcap recorder";
  wo.encodeMemory = encodeMemory_;
  run_ = formats::BundleWriter::create((fs::path(dir) / kRunFileName).string(), wo);
  for (auto& r : runRecords_) writeRun(r);
  run_->sync();
  runUnsynced_ = false;
  mapProgress(dir);
  recording_ = dir;
  segmentIndex_ = 0;
  segment_.reset();
  segmentBroken_ = false;
}

void LiveWriter::writeRun(const Job& job) {
  if (job.kind == Job::Kind::RunTensor)
    run_->writeTensor(job.tensor.name, job.tensor.dtype, job.tensor.shape, job.tensor.data, job.tensor.size);
  else
    run_->writeRecord(job.type, job.meta, job.body.data(), job.body.size(), !job.body.empty());
}

bool LiveWriter::push(std::vector<Job> jobs, Lane lane, bool wake) {
  uint64_t bytes = 0;
  for (auto& j : jobs) {
    bytes += j.bytes();
    j.lane = lane;
    if (j.kind == Job::Kind::StartSegment) {
      std::lock_guard<std::mutex> lk(statsMu_);
      j.skippedBefore = stats_.keyframesSkipped;
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    // A batch larger than the whole budget (a big model's keyframe) still goes through when
    // nothing else is queued in its lane; otherwise it could never be recorded.
    if (!closed_ && fits(bytes, lane)) {
      queued(lane) += bytes;
      for (auto& j : jobs) queue_.push_back(std::move(j));
      bytes = 0;
    }
  }
  if (bytes) {
    countDrop(jobs.size(), bytes);
    std::lock_guard<std::mutex> lk(statsMu_);
    for (const auto& j : jobs)
      if (j.commitsStep) {
        if (stats_.lostSteps.size() < formats::kMaxListedLostSteps) stats_.lostSteps.push_back(j.step);
        ++stats_.lostStepCount;
      }
    if (stats_.warnings.empty() || stats_.warnings.back().rfind("queue full", 0) != 0) {
      auto w = fmt::format("queue full: the writer is {} MiB behind; records are dropped until it catches up",
                           options_.queueBytes >> 20);
      stats_.warnings.push_back(w);
      if (!options_.quiet) std::fprintf(stderr, "crashcap: warning: %s\n", w.c_str());
    }
    return false;
  }
  if (wake) cv_.notify_one();
  return true;
}

bool LiveWriter::wouldAccept(uint64_t bytes, Lane lane) const {
  std::lock_guard<std::mutex> lk(mu_);
  return !closed_ && fits(bytes, lane);
}

void LiveWriter::skipKeyframe(int64_t step, uint64_t bytes) {
  std::lock_guard<std::mutex> lk(statsMu_);
  if (stats_.keyframesSkipped++ == 0) {
    auto w = fmt::format("keyframe of step {} skipped ({} MiB): the writer has not finished the last keyframe yet; "
                         "every step is kept, and the next step tries again (keyframes skipped are counted in "
                         "the run status)",
                         step, bytes >> 20);
    stats_.warnings.push_back(w);
    if (!options_.quiet) std::fprintf(stderr, "crashcap: warning: %s\n", w.c_str());
  }
}

void LiveWriter::addWarning(std::string warning) {
  std::lock_guard<std::mutex> lk(statsMu_);
  if (stats_.warnings.size() < 64) stats_.warnings.push_back(std::move(warning));
}

void LiveWriter::fillStatus(formats::RunStatusData& status) const {
  status.lastPhase = phaseName(static_cast<Phase>(phase.load()));
  auto s = stats();
  status.droppedRecords = s.droppedRecords;
  status.droppedBytes = s.droppedBytes;
  status.warnings = s.warnings;
  status.segmentsDeleted = s.segmentsDeleted;
  status.lostSteps = s.lostSteps;
  status.lostStepCount = s.lostStepCount;
  status.keyframesSkipped = s.keyframesSkipped;
  status.keyframesWrittenRaw = s.keyframesWrittenRaw;
  status.keyframeInterval = keyframeInterval.load(std::memory_order_relaxed);
  status.bufferPoolPeakBytes = bufferPoolPeakBytes.load(std::memory_order_relaxed);
}

void LiveWriter::countDrop(uint64_t records, uint64_t bytes) {
  std::lock_guard<std::mutex> lk(statsMu_);
  stats_.droppedRecords += records;
  stats_.droppedBytes += bytes;
}

void LiveWriter::setOpsSnapshot(std::function<std::optional<formats::OpTraceData>()> fn) {
  std::lock_guard<std::mutex> lk(mu_);
  opsSnapshot_ = std::move(fn);
}

void LiveWriter::setKernelTraceSnapshot(std::function<std::optional<formats::KernelTraceData>()> fn) {
  std::lock_guard<std::mutex> lk(mu_);
  kernelTraceSnapshot_ = std::move(fn);
}

LiveWriterStats LiveWriter::stats() const {
  std::lock_guard<std::mutex> lk(statsMu_);
  return stats_;
}

std::string LiveWriter::lastBundle() const {
  std::lock_guard<std::mutex> lk(mu_);
  return lastBundle_;
}

void LiveWriter::degrade(const std::string& why) {
  segmentBroken_ = true;
  unmapProgress();
  std::lock_guard<std::mutex> lk(statsMu_);
  if (!stats_.degraded && !options_.quiet)
    std::fprintf(stderr,
                 "crashcap: warning: recording degraded: %s\n"
                 "crashcap: training continues; records are dropped and counted until a new segment can be "
                 "written (see `crashcap inspect`)\n",
                 why.c_str());
  if (!stats_.degraded || stats_.warnings.size() < 16) stats_.warnings.push_back("recording degraded: " + why);
  stats_.degraded = true;
}

void LiveWriter::loop() {
  // A termination request (SIGTERM, which the crash guard records) goes to a thread that does not
  // block it, and the one that records it must not be this one, which writes the crash down.
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, nullptr);
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (queue_.empty() && !crashPending_.load(std::memory_order_acquire)) {
        // Idle: said at once (close() waits for it), then asleep until a push wakes it. The
        // timeout bounds how long a crash requested from a signal handler (which cannot notify
        // a condition variable) and a push that does not wake (push's `wake`) wait.
        busy_ = false;
        idle_.notify_all();
        if (stop_) return;
        cv_.wait_for(lk, kIdlePoll,
                     [&] { return !queue_.empty() || stop_ || crashPending_.load(std::memory_order_acquire); });
      }
      if (crashPending_.load(std::memory_order_acquire)) {
        lk.unlock();
        try {
          handleCrash();
        } catch (...) {
          // Never let the writer thread take the training down; the crash waiter times out
          // and the recording stays for `crashcap seal`.
          std::lock_guard<std::mutex> done(mu_);
          crashPending_.store(false, std::memory_order_release);
        }
        continue;
      }
      if (queue_.empty()) continue;  // woken to stop, or the poll's timeout: idle again above
      job = std::move(queue_.front());
      queue_.pop_front();
      dequeued(job);
      busy_ = true;
    }
    try {
      // run.ccap's records are on disk before any step record that needs them (without them a
      // replay has nothing to execute): one sync for the several the first step hands over,
      // which arrive a few ms apart, not one each. close() and a crash seal run.ccap durably.
      if (runUnsynced_ && run_ && job.kind != Job::Kind::RunRecord && job.kind != Job::Kind::RunTensor) {
        runUnsynced_ = false;
        run_->sync();
      }
      process(job);
    } catch (const std::exception& e) {
      degrade(e.what());
      countDrop(1, job.bytes());
    } catch (...) {
      degrade("unknown error in the writer thread");
      countDrop(1, job.bytes());
    }
  }
}

void LiveWriter::writeTensor(const Job& job) {
  const bool keyframe = job.lane == Lane::Keyframe;
  // rawIsFaster (the writer thread's own numbers) before behind (two locks).
  if (keyframe && !keyframeRaw_ && options_.rawWhenBehind && options_.zstdLevel > 0 && rawIsFaster() && behind()) {
    keyframeRaw_ = true;
    std::lock_guard<std::mutex> lk(statsMu_);
    if (stats_.keyframesWrittenRaw++ == 0) {
      const double compressMBs = compressedInBytes_ * 1e3 / compressNs_;
      const double savings = 1.0 - double(compressedOutBytes_) / compressedInBytes_;
      auto w = fmt::format(
          "the writer fell behind while writing the keyframe of step {}: the rest of it is stored uncompressed "
          "(measured: the disk takes {:.0f} MB/s, zstd {:.0f} MB/s saving {:.0f}%), so that steps are not dropped "
          "and the next keyframe comes sooner; such keyframes are counted in the run status",
          segmentStep_, diskBytes_ * 1e3 / diskNs_, compressMBs, 100 * savings);
      stats_.warnings.push_back(w);
      if (!options_.quiet) std::fprintf(stderr, "crashcap: warning: %s\n", w.c_str());
    }
  }
  const int level = keyframe && keyframeRaw_ ? 0 : options_.zstdLevel;
  if (segment_->zstdLevel() != level) segment_->setZstdLevel(level);
  const formats::WriterStats before = segment_->stats();
  const auto started = std::chrono::steady_clock::now();
  segment_->writeTensor(job.tensor.name, job.tensor.dtype, job.tensor.shape, job.tensor.data, job.tensor.size);
  const uint64_t wallNs = uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started).count());
  const formats::WriterStats& after = segment_->stats();
  const uint64_t writeNs = after.writeNs - before.writeNs;
  diskBytes_ += after.fileBytes - before.fileBytes;
  diskNs_ += writeNs;
  if (level > 0) {
    compressedInBytes_ += job.tensor.size;
    compressedOutBytes_ += after.storedBodyBytes - before.storedBodyBytes;
    compressNs_ += wallNs > writeNs ? wallNs - writeNs : 0;
  }
}

bool LiveWriter::behind() const {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (queued(Lane::Step) > options_.queueBytes / 2) return true;
  }
  std::lock_guard<std::mutex> lk(statsMu_);
  return stats_.keyframesSkipped > skippedAtSegmentStart_;
}

bool LiveWriter::rawIsFaster() const {
  // Nothing compressed yet, or nothing timed: no measurement to go by, so compression goes on
  // (and measures).
  if (compressedInBytes_ == 0 || compressNs_ == 0 || diskNs_ == 0) return false;
  const double diskRate = double(diskBytes_) / diskNs_;
  const double compressRate = double(compressedInBytes_) / compressNs_;
  const double saved = 1.0 - double(compressedOutBytes_) / compressedInBytes_;
  return diskRate > compressRate * saved;
}

void LiveWriter::startSegment(unsigned compressionThreads) {
  if (segment_) {
    try {
      if (!segmentBroken_) segment_->sync();
    } catch (const Error&) {
    }
    segment_.reset();
  }
  segmentBroken_ = false;
  auto path = (fs::path(recording_) / segmentFileName(++segmentIndex_)).string();
  formats::WriterOptions wo;
  wo.zstdLevel = options_.zstdLevel;
  // The writer shares the machine with the training (and its DataLoader workers): a tensor zstd
  // shrinks by less than 15% (a noisy image batch: 10%) is stored raw, and with rawRetryEvery
  // not compressed again for a while. docs/PERFORMANCE.md has the measurement.
  wo.minSavings = kRecorderMinSavings;
  wo.rawRetryEvery = 16;
  wo.compressionThreads = compressionThreads;
  wo.durability.syncEveryBytes = options_.syncEveryBytes;
  wo.producer = "crashcap recorder";
  wo.firstTensorId = (segmentIndex_ << 32) + 1;  // unique across the segments sealing merges
  wo.encodeMemory = encodeMemory_;
  try {
    segment_ = formats::BundleWriter::create(path, wo);
    std::lock_guard<std::mutex> lk(statsMu_);
    stats_.segments++;
  } catch (const Error& e) {
    segment_.reset();
    degrade(e.what());
    return;
  }
  applyRetention();
}

void LiveWriter::applyRetention(uint64_t coming) {
  auto files = segmentFiles(recording_);
  std::vector<uint64_t> sizes;
  std::error_code ec;
  uint64_t total = fs::file_size(fs::path(recording_) / kRunFileName, ec);
  if (ec) total = 0;
  for (const auto& f : files) {
    uint64_t s = fs::file_size(f, ec);
    sizes.push_back(ec ? 0 : s);
    total += sizes.back();
  }
  size_t first = 0;
  // Counted: run.ccap and every segment, the growing one included, so that the files on disk
  // stay within retainBytes and not just the finished segments. The newest segment (being
  // written) always stays; so does the one before it, which holds the steps up to its keyframe.
  while (files.size() - first > 2 &&
         ((options_.retainSegments && files.size() - first > options_.retainSegments) ||
          (options_.retainBytes && total + coming > options_.retainBytes))) {
    fs::remove(files[first], ec);
    total -= sizes[first];
    ++first;
    std::lock_guard<std::mutex> lk(statsMu_);
    stats_.segmentsDeleted++;
  }
  const uint64_t growing = files.empty() ? 0 : sizes.back();
  settledBytes_ = total - growing;
  deletableSegments_ = files.size() - first > 2 ? files.size() - first - 2 : 0;
  notePeak(total);
}

void LiveWriter::makeRoom(uint64_t bytes) {
  // A record's headers and meta beyond its job's bytes: far less than this.
  constexpr uint64_t kRecordSlack = 4096;
  if (!options_.retainBytes || deletableSegments_ == 0) return;
  const uint64_t coming = bytes + kRecordSlack;
  // The write would take the recording over retainBytes: the oldest segment goes first, not at
  // the next keyframe.
  if (settledBytes_ + segment_->stats().fileBytes + coming > options_.retainBytes) applyRetention(coming);
}

void LiveWriter::afterWrite() { notePeak(settledBytes_ + segment_->stats().fileBytes); }

void LiveWriter::notePeak(uint64_t total) {
  if (total <= peakBytes_) return;
  peakBytes_ = total;
  std::lock_guard<std::mutex> lk(statsMu_);
  stats_.recordingPeakBytes = total;
}

void LiveWriter::process(Job& job) {
  try {
    switch (job.kind) {
      case Job::Kind::RunRecord:
      case Job::Kind::RunTensor:
        if (!needNewRecording_ && run_) {
          writeRun(job);
          runUnsynced_ = true;  // synced by loop() before the next job that is not a run record
        }
        runRecords_.push_back(std::move(job));  // kept (written or not) for a later recording
        return;
      case Job::Kind::StartSegment:
        // After a crash sealed the recording, a program that goes on records into a fresh
        // one, started at its next keyframe (never per job: a failing directory must not
        // multiply).
        keyframeStarted_ = std::chrono::steady_clock::now();
        keyframeRaw_ = false;
        segmentStep_ = job.step;
        skippedAtSegmentStart_ = job.skippedBefore;
        if (needNewRecording_) {
          startRecording();
          needNewRecording_ = false;
        }
        startSegment(job.compressionThreads);
        return;
      case Job::Kind::Tensor:
        if (needNewRecording_ || !segmentUsable()) break;
        if (job.tensor.wait && !job.tensor.wait()) {
          countDrop(1, job.bytes());
          return;
        }
        makeRoom(job.tensor.size);
        writeTensor(job);
        afterWrite();
        return;
      case Job::Kind::Record:
        if (needNewRecording_ || !segmentUsable()) break;
        makeRoom(job.meta.size() + job.body.size());
        segment_->writeRecord(job.type, job.meta, job.body.data(), job.body.size(), !job.body.empty());
        afterWrite();
        if (job.commitsStep) writtenThrough_.store(job.step, std::memory_order_release);
        if (job.endsKeyframe)
          keyframeWriteNs_.store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now() - keyframeStarted_).count(),
                                 std::memory_order_relaxed);
        return;
    }
  } catch (const Error& e) {
    degrade(e.what());
  } catch (const std::exception& e) {
    degrade(e.what());
  }
  countDrop(1, job.bytes());
}

std::string LiveWriter::crash(formats::CrashData crash) {
  if (std::this_thread::get_id() == thread_.get_id()) return "";
  uint64_t before = crashDone_.load(std::memory_order_acquire);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return "";
    pendingCrash_ = std::move(crash);
    crashPending_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  // Draining is bounded by crashDrainSeconds; sealing copies what was written, so allow it
  // as long again before giving up.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(2 * options_.crashDrainSeconds + 5);
  std::unique_lock<std::mutex> lk(mu_);
  idle_.wait_until(lk, deadline, [&] { return crashDone_.load(std::memory_order_acquire) != before; });
  return crashDone_.load() != before ? lastBundle_ : "";
}

bool LiveWriter::crashFromSignal(int signal, void* address, void* const* frames, int frameCount, int senderPid) {
  // Async-signal-safe: plain stores, atomics, nanosleep.
  if (std::this_thread::get_id() == thread_.get_id()) return false;
  gSignal.signal = signal;
  gSignal.address = address;
  gSignal.senderPid = senderPid;
  gSignal.frameCount = frameCount < 64 ? frameCount : 64;
  for (int i = 0; i < gSignal.frameCount; ++i) gSignal.frames[i] = frames[i];
  gSignal.thread = threadId();
  struct timespec ts {};
  clock_gettime(CLOCK_REALTIME, &ts);
  gSignal.timeNs = static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  // The interpreter's stack of this thread, into the memory file (lseek, ftruncate and write are
  // plain system calls). A fault inside the dump comes back here through escapeSignalContextDump:
  // the faults are unblocked for it (this handler blocks its own signal), and sigsetjmp keeps the
  // mask to restore.
  const int contextFd = gContextFd.load();
  if (auto dump = gContextDump.load(); dump && contextFd >= 0 && ::lseek(contextFd, 0, SEEK_SET) == 0 &&
                                       ::ftruncate(contextFd, 0) == 0) {
    sigset_t faults, held;
    sigemptyset(&faults);
    for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) sigaddset(&faults, s);
    if (sigsetjmp(gDumpJump, 1) == 0) {
      gDumpingThread.store(gSignal.thread);
      pthread_sigmask(SIG_UNBLOCK, &faults, &held);
      dump(contextFd);
      pthread_sigmask(SIG_SETMASK, &held, nullptr);
      gContextWritten.store(true);
    }
    gDumpingThread.store(0);
  }
  uint64_t before = crashDone_.load(std::memory_order_acquire);
  crashPending_.store(true, std::memory_order_release);
  double waited = 0, limit = 2 * options_.crashDrainSeconds + 5;
  while (crashDone_.load(std::memory_order_acquire) == before && waited < limit) {
    struct timespec step {0, 2000000};
    nanosleep(&step, nullptr);
    waited += 0.002;
  }
  return crashDone_.load(std::memory_order_acquire) != before;
}

void LiveWriter::handleCrash() {
  formats::CrashData crash;
  bool fromSignal = false;
  std::function<std::optional<formats::OpTraceData>()> ops;
  std::function<std::optional<formats::KernelTraceData>()> kernels;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (pendingCrash_) {
      crash = std::move(*pendingCrash_);
      pendingCrash_.reset();
    } else {
      fromSignal = true;
    }
    ops = opsSnapshot_;
    kernels = kernelTraceSnapshot_;
  }
  // The op ring first: other threads keep adding ops while the queue drains.
  std::optional<formats::OpTraceData> trace;
  if (ops) trace = ops();
  std::optional<formats::KernelTraceData> kernelTrace;
  if (kernels) kernelTrace = kernels();
  if (needNewRecording_) {
    // This failure follows one already sealed with nothing recorded since (fail(e) and then
    // the same exception reaching std::terminate): the bundle exists; do not seal again.
    std::lock_guard<std::mutex> lk(mu_);
    crashPending_.store(false, std::memory_order_release);
    crashDone_.fetch_add(1, std::memory_order_acq_rel);
    idle_.notify_all();
    return;
  }
  if (fromSignal) {
    crash.kind = "signal";
    crash.signal = gSignal.signal;
    const char* name = formats::signalName(gSignal.signal);
    crash.signalName = name ? name : "signal";
    crash.step = currentStep.load();
    crash.phase = phaseName(static_cast<Phase>(phase.load()));
    const char* desc = strsignal(gSignal.signal);
    crash.error = fmt::format("fatal signal {} ({})", crash.signalName, desc ? desc : "?");
    // A signal raised in the process may be a fault that a handler before crashcap's (Python's
    // faulthandler) passed on by raising it again: its address is lost, not absent.
    if (gSignal.senderPid == ::getpid())
      crash.error += ", raised in the process (raise or kill, or a fault handler passing a fault on)";
    else if (gSignal.senderPid > 0)
      crash.error += fmt::format(", sent by process {} (kill), not a fault", gSignal.senderPid);
    else if (gSignal.senderPid < 0)
      crash.error += ", sent by a process outside this one's pid namespace (kill), not a fault";
    else if (gSignal.signal == SIGSEGV || gSignal.signal == SIGBUS || gSignal.signal == SIGFPE ||
             gSignal.signal == SIGILL)
      crash.error += fmt::format(" at address {}", gSignal.address);
    crash.stack = symbolize(gSignal.frames, gSignal.frameCount);
    // The interpreter's frames are outside the native ones (the interpreter called the code that
    // faulted); the innermost is the program's line that was running.
    const auto frames = readInterpreterFrames();
    if (!frames.empty()) crash.error += interpreterLineText(frames);
    crash.stack.insert(crash.stack.end(), frames.begin(), frames.end());
    crash.timeNs = gSignal.timeNs;
    crash.pid = static_cast<uint32_t>(::getpid());
    crash.thread = gSignal.thread;
  }
  // Drain what the training handed over before it failed, within the deadline.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.crashDrainSeconds);
  for (;;) {
    Job job;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (queue_.empty()) break;
      job = std::move(queue_.front());
      queue_.pop_front();
      dequeued(job);
    }
    if (std::chrono::steady_clock::now() > deadline) {
      countDrop(1, job.bytes());
      continue;
    }
    process(job);
  }
  formats::RunStatusData status;
  status.state = "crashed";
  status.stepsBegun = stepsBegun.load();
  status.lastStep = currentStep.load();
  fillStatus(status);
  // The crash goes into the live segment first: if sealing cannot finish, `crashcap seal`
  // still finds it.
  bool inSegment = false;
  if (segmentUsable()) {
    try {
      formats::writeMetaRecord(*segment_, crash);
      if (trace) formats::writeMetaRecord(*segment_, *trace);
      if (kernelTrace) formats::writeMetaRecord(*segment_, *kernelTrace);
      segment_->sync();
      inSegment = true;
    } catch (const std::exception& e) {
      degrade(e.what());
    }
  }
  segment_.reset();
  run_.reset();
  std::string bundle;
  try {
    SealOptions so;
    so.status = status;
    if (!inSegment) {
      // No usable segment (failure before the first step, disk full): the bundle still
      // gets the crash and the ops, straight from memory.
      so.crash = crash;
      so.ops = trace;
      if (kernelTrace) so.kernelTraces.push_back(*kernelTrace);
    }
    so.decodeChunks = false;  // the scan checked every checksum; a crash has no time to spare
    auto report = sealRecording(recording_, so);
    bundle = report.out;
    if (!options_.quiet) std::fprintf(stderr, "crashcap: crash recorded: %s\n", bundle.c_str());
  } catch (const std::exception& e) {
    if (!options_.quiet)
      std::fprintf(stderr, "crashcap: could not seal the crash bundle: %s\ncrashcap: run `crashcap seal %s`\n",
                   e.what(), options_.outputDir.c_str());
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    lastBundle_ = bundle;
    needNewRecording_ = true;  // if the program goes on, it records into a fresh recording
    crashPending_.store(false, std::memory_order_release);
    crashDone_.fetch_add(1, std::memory_order_acq_rel);
  }
  idle_.notify_all();
}

void LiveWriter::close(formats::RunStatusData status, bool durable) {
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (closed_) return;
    closed_ = true;
    cv_.notify_all();  // records pushed without waking it (the last step's end) are written now
    idle_.wait(lk, [&] { return queue_.empty() && !busy_ && !crashPending_.load(); });
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (needNewRecording_) return;  // a crash sealed everything and nothing came after
  fillStatus(status);
  // With the live segment broken (disk full, file-size limit) the status goes into a new,
  // small segment, so the drops are on record once space returns.
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (!segmentUsable()) startSegment(options_.compressionThreads);
    if (!segmentUsable()) continue;
    try {
      formats::writeMetaRecord(*segment_, status);
      if (durable) segment_->sync();
      break;
    } catch (const Error& e) {
      degrade(e.what());
    }
  }
  segment_.reset();
  try {
    if (run_) run_->seal(durable);
  } catch (const Error&) {
  }
  run_.reset();
}

}  // namespace crashcap::recorder::detail

namespace crashcap::recorder {

void escapeSignalContextDump() {
  if (detail::gDumpingThread.load() != 0 && detail::gDumpingThread.load() == detail::threadId())
    siglongjmp(detail::gDumpJump, 1);
}

void setSignalContextDump(SignalContextDump dump) {
  if (dump && detail::gContextFd.load() < 0)
    detail::gContextFd.store(::memfd_create("crashcap-signal-context", MFD_CLOEXEC));
  detail::gContextDump.store(dump);
}

}  // namespace crashcap::recorder
