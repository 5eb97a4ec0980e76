#pragma once
// The recorder's background writer: one thread owns the recording's files. The training
// thread hands it jobs (tensor copies it already owns, encoded records) through a bounded
// queue and never waits for the disk; the writer turns a full queue, a full disk or an
// unwritable directory into counted drops and one warning, never into a training failure.
// It also performs the crash path: drain within a deadline, write the crash, seal the bundle.
// No LibTorch here.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/records.hpp"
#include "crashcap/recorder/recording_dir.hpp"

namespace crashcap::recorder::detail {

/// Bytes of one tensor, owned by `owner` until written. `wait`, when set, blocks until the
/// bytes are valid (an asynchronous device-to-host copy) and returns false when they never
/// will be (the device failed).
struct TensorJob {
  std::string name;
  formats::DType dtype = formats::DType::Float32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t size = 0;
  std::shared_ptr<void> owner;
  std::function<bool()> wait;
};

/// Where a job waits in the writer's queue. The queue is one FIFO (the writer keeps the order),
/// but steps and keyframes are admitted against separate budgets, so a keyframe larger than the
/// budget, or one still being written, never crowds a step out: what does not fit in the
/// keyframe lane is skipped, never a step.
enum class Lane {
  Step,      ///< batches, generator states, fingerprints, the run's small records: queueBytes
  Keyframe,  ///< keyframes: queueBytes (an empty lane takes one of any size)
  Program,   ///< the step program's archive, once per run: always admitted, so the first
             ///< keyframe never waits behind it and the steps before it are kept
};

struct Job {
  enum class Kind { Tensor, Record, StartSegment, RunRecord, RunTensor };
  Kind kind = Kind::Record;
  TensorJob tensor;
  uint16_t type = 0;               ///< Record, RunRecord
  std::vector<uint8_t> meta, body; ///< Record, RunRecord
  int64_t step = -1;               ///< StartSegment: its keyframe step; Record: the step it commits
  bool commitsStep = false;        ///< a step_begin: once written, the step reached the OS
  bool endsKeyframe = false;       ///< the last job of a keyframe (its record): the write is timed to it
  unsigned compressionThreads = 0; ///< StartSegment: zstd threads for the segment (0: the writer thread)
  uint64_t skippedBefore = 0;      ///< StartSegment: keyframes skipped before it was queued (set by push)
  Lane lane{};                     ///< the lane it was admitted in (set by push)
  uint64_t bytes() const { return tensor.size + meta.size() + body.size(); }
};

struct LiveWriterOptions {
  std::string outputDir;            ///< the directory that holds recordings and crash bundles
  int zstdLevel = 1;
  unsigned compressionThreads = 0;  ///< for run.ccap, crash bundles and a segment started after a crash
  uint64_t queueBytes = 512ull << 20;
  size_t retainSegments = 4;        ///< 0 = no limit
  uint64_t retainBytes = 0;         ///< 0 = no limit
  uint64_t syncEveryBytes = 64ull << 20;
  double crashDrainSeconds = 10;
  /// When the writer falls behind while writing a keyframe (the steps waiting behind it fill half
  /// of queueBytes, or a keyframe was skipped meanwhile) and its measured rates say the disk takes
  /// raw bytes faster than zstd saves them, the rest of that keyframe is stored raw.
  bool rawWhenBehind = true;
  bool quiet = false;               ///< no warning on stderr (tests)
  /// Run records run.ccap holds from its creation, written and synced by the constructor on the
  /// constructing thread (a rank's identity from its launcher's variables): a process killed
  /// before the writer thread's first write still says which job and rank it was.
  std::vector<Job> runRecords;
};

struct LiveWriterStats {
  uint64_t droppedRecords = 0;
  uint64_t droppedBytes = 0;
  uint64_t segmentsDeleted = 0;
  uint64_t recordingPeakBytes = 0;  ///< the most the recording's files held on disk at once
  uint64_t segments = 0;
  std::vector<int64_t> lostSteps;   ///< steps whose step_begin could not be queued (first kMaxListedLostSteps)
  uint64_t lostStepCount = 0;
  uint64_t keyframesSkipped = 0;
  uint64_t keyframesWrittenRaw = 0; ///< keyframes whose rest was stored raw (rawWhenBehind)
  bool degraded = false;
  std::vector<std::string> warnings;
};

class LiveWriter {
 public:
  /// Creates <outputDir>/recording-<time>-<pid>/run.ccap. Throws Error{Io} when it cannot (the
  /// Recorder then runs without recording and says so).
  explicit LiveWriter(LiveWriterOptions options);
  ~LiveWriter();  ///< stops the thread after draining (no status record: call close first)

  /// Queues jobs all-or-nothing in `lane`: when they do not fit that lane's budget (queueBytes;
  /// a lane that is empty takes anything) they are dropped and counted, a step they begin is
  /// remembered as lost, and false is returned. Never blocks on I/O. With `wake` false the
  /// writer thread is not woken for them: they go with the next push that wakes it, or within
  /// the writer's idle poll of 250 ms (a small record whose wake-up, a system call and an
  /// interrupt on the writer's core, would cost the training more than the record is worth
  /// waiting for).
  bool push(std::vector<Job> jobs, Lane lane = Lane::Step, bool wake = true);
  /// The newest step whose step_begin record (and so its batch) reached the OS; -1 none.
  int64_t writtenThrough() const { return writtenThrough_.load(std::memory_order_acquire); }
  /// Counts records the producer decided not to write.
  void countDrop(uint64_t records, uint64_t bytes);
  /// Whether push() of `bytes` into `lane` would be accepted now (the lane is empty, or they
  /// fit), so a producer can skip making copies that would be dropped.
  bool wouldAccept(uint64_t bytes, Lane lane) const;
  /// Counts a keyframe not taken at `step` (its `bytes` did not fit the keyframe lane); the first
  /// one warns.
  void skipKeyframe(int64_t step, uint64_t bytes);
  /// How long the writer took for the newest keyframe it finished, from opening its segment to
  /// writing its record (steps queued meanwhile included: it is the writer's pace); 0 before the
  /// first. Read by the recorder's keyframe cadence.
  double lastKeyframeWriteSeconds() const { return keyframeWriteNs_.load(std::memory_order_relaxed) / 1e9; }
  /// A warning of the recorder's own (not the writer's), kept in the run status with the writer's.
  void addWarning(std::string warning);
  /// The writer's counts in a run_status record (state, stepsBegun and lastStep are the caller's).
  void fillStatus(formats::RunStatusData& status) const;

  /// Where the training is (read by the crash path). They live in the recording's progress
  /// file, mapped shared, so that they outlive a SIGKILL (ProgressPage).
 private:
  ProgressPage* page_;  // declared before the references below, which bind to it
 public:
  std::atomic<int64_t>& currentStep = page_->step;
  std::atomic<int>& phase = page_->phase;
  std::atomic<uint64_t>& stepsBegun = page_->stepsBegun;
  /// The whole page, for the op ring's newest op and collective (op_ring.hpp). Its address stays:
  /// a page moved over it lands at the same address.
  ProgressPage* progressPage() { return page_; }
  /// The recorder's own numbers for the run status (stored at every step).
  std::atomic<int64_t> keyframeInterval{0};
  std::atomic<uint64_t> bufferPoolPeakBytes{0};
  /// Called by the training thread before it stores into the page (beginStep): moves a page the
  /// writer thread prepared (a new recording's progress file; memory after a write error) over
  /// the page. Only the thread that stores may move it: a store between the copy of the values
  /// and the move would be lost.
  void settleProgress() {
    if (pendingPage_.load(std::memory_order_acquire)) settlePending();
  }

  /// Produces the op ring at crash time (called on the writer thread).
  void setOpsSnapshot(std::function<std::optional<formats::OpTraceData>()> fn);
  /// Produces the kernel trace at crash time (called on the writer thread, after the ops).
  void setKernelTraceSnapshot(std::function<std::optional<formats::KernelTraceData>()> fn);

  /// Normal context (exception, std::terminate, non-finite): drain, write `crash`, seal the
  /// bundle. Waits at most crashDrainSeconds (+ sealing). Returns the bundle path, or ""
  /// when the writer could not finish in time (the recording stays for `crashcap seal`).
  std::string crash(formats::CrashData crash);
  /// Async-signal-safe variant for fatal signals: records the signal and the raw frames,
  /// wakes the writer thread and waits (bounded). Returns true when the bundle was sealed.
  /// `senderPid` != 0: a process sent the signal (kill, raise, or a fault handler raising a fault
  /// again: si_code <= 0), so there is no faulting address to report, only who sent it (-1: a
  /// process outside this one's pid namespace).
  bool crashFromSignal(int signal, void* address, void* const* frames, int frameCount, int senderPid = 0);

  /// Clean end of the run: drains, writes `status`, closes the files (the recording stays
  /// on disk for `crashcap seal`). Idempotent. `durable` false skips the syncs of the last
  /// segment and run.ccap: for a recording that is removed when its run ends clean, where they
  /// would only hold up the program's exit (the status is read from the page cache).
  void close(formats::RunStatusData status, bool durable = true);

  LiveWriterStats stats() const;
  const std::string& recordingDir() const { return recording_; }
  std::string lastBundle() const;

 private:
  void loop();
  void process(Job& job);
  void startRecording();
  void writeRun(const Job& job);
  void startSegment(unsigned compressionThreads);
  /// Writes a tensor job into the segment, at the keyframe's level, and measures the writer's pace.
  void writeTensor(const Job& job);
  /// Whether the writer is behind now: steps waiting behind the keyframe fill half of queueBytes,
  /// or a keyframe was skipped since this one was queued.
  bool behind() const;
  /// Whether raw bytes reach the disk faster than zstd makes them smaller, by the rates measured
  /// so far: raw is faster when diskRate > compressRate * (1 - stored/raw).
  bool rawIsFaster() const;
  // The writer's pace, measured over the recording (writer thread only).
  uint64_t compressedInBytes_ = 0, compressedOutBytes_ = 0, compressNs_ = 0;
  uint64_t diskBytes_ = 0, diskNs_ = 0;
  bool keyframeRaw_ = false;         ///< the keyframe being written is stored raw from here on
  int64_t segmentStep_ = -1;         ///< the keyframe step of the segment being written
  uint64_t skippedAtSegmentStart_ = 0;  ///< keyframes skipped before the segment's keyframe was queued
  void mapProgress(const std::string& dir);
  /// After a write error: the page goes back to memory, so that a full disk can never make a
  /// store into it fault (SIGBUS) in the training.
  void unmapProgress();
  /// Moves `fresh` (a mapping holding nothing yet) over the page with the page's values; 0, or
  /// the errno of a failure (then the page stays as it was).
  int movePage(void* fresh);
  /// Hands `fresh` to the training thread's next settleProgress (replacing one not yet taken).
  void offerPage(void* fresh);
  void settlePending();
  std::atomic<void*> pendingPage_{nullptr};
  /// Deletes the oldest segments while the recording's files (run.ccap and every segment, the
  /// growing one included) are over retainBytes or more than retainSegments, always keeping the
  /// two newest segments. `coming`: bytes about to be written, counted as if they were.
  void applyRetention(uint64_t coming = 0);
  /// Before a write of `bytes` into the growing segment: deletes the oldest segments when the
  /// write would take the recording over retainBytes.
  void makeRoom(uint64_t bytes);
  /// After a write: the recording's peak size.
  void afterWrite();
  void notePeak(uint64_t total);
  uint64_t settledBytes_ = 0;        ///< writer thread: run.ccap and the finished segments, as of the last retention
  size_t deletableSegments_ = 0;     ///< writer thread: finished segments retention may still delete
  uint64_t peakBytes_ = 0;           ///< writer thread: the largest the recording's files have been
  void degrade(const std::string& why);
  void handleCrash();
  bool segmentUsable() const { return segment_ && !segmentBroken_; }

  LiveWriterOptions options_;
  std::string recording_;
  std::unique_ptr<formats::BundleWriter> run_;
  std::unique_ptr<formats::BundleWriter> segment_;
  /// What run.ccap's and the segments' writers encode with, one after the other on the writer
  /// thread: kept for the whole recording, and out of the children the training forks (a
  /// DataLoader's workers, each epoch), whose next write to it would otherwise copy each page.
  std::shared_ptr<formats::EncodeMemory> encodeMemory_ = formats::EncodeMemory::create(true);
  bool segmentBroken_ = false;
  /// run.ccap holds records not yet synced: the writer syncs before the next job that is not
  /// a run record (the first step hands over several: environment, program, identity).
  bool runUnsynced_ = false;  ///< writer thread only
  uint64_t segmentIndex_ = 0;
  std::vector<Job> runRecords_;      ///< written to run.ccap; replayed into a new one when a recording restarts after a crash

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_;
  std::deque<Job> queue_;
  uint64_t queuedBytes_[3] = {0, 0, 0};  ///< per Lane
  uint64_t& queued(Lane lane) { return queuedBytes_[static_cast<int>(lane)]; }
  uint64_t queued(Lane lane) const { return queuedBytes_[static_cast<int>(lane)]; }
  void dequeued(const Job& job) { queued(job.lane) -= job.bytes(); }
  bool fits(uint64_t bytes, Lane lane) const {
    return lane == Lane::Program || queued(lane) == 0 || queued(lane) + bytes <= options_.queueBytes;
  }
  bool busy_ = false;
  bool stop_ = false;
  bool closed_ = false;
  std::atomic<int64_t> writtenThrough_{-1};
  std::atomic<int64_t> keyframeWriteNs_{0};
  std::chrono::steady_clock::time_point keyframeStarted_{};  ///< writer thread only

  // Crash hand-off. `crashPending_` is set by the failing thread (possibly in a signal
  // handler); the writer thread does the work and bumps `crashDone_`.
  std::atomic<bool> crashPending_{false};
  std::atomic<uint64_t> crashDone_{0};
  std::optional<formats::CrashData> pendingCrash_;   // under mu_; empty for a signal crash
  std::string lastBundle_;                           // under mu_
  bool needNewRecording_ = false;
  std::function<std::optional<formats::OpTraceData>()> opsSnapshot_;
  std::function<std::optional<formats::KernelTraceData>()> kernelTraceSnapshot_;

  mutable std::mutex statsMu_;
  LiveWriterStats stats_;

  std::thread thread_;
};

/// The crash guard's handle on the active writer (one recorder per process).
LiveWriter* activeWriter();
void setActiveWriter(LiveWriter* writer);

/// Formats raw return addresses as "binary: function+0x12 [0x...]" lines, demangled.
std::vector<std::string> symbolize(void* const* frames, int count);

}  // namespace crashcap::recorder::detail
