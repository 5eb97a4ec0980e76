#include "op_ring.hpp"

#include <ATen/record_function.h>
#include <c10/core/ScalarType.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "crashcap/cupti/tracer.hpp"
#include "crashcap/formats/torch/op_values.hpp"
#include "live_writer.hpp"

namespace crashcap::recorder::detail {
namespace {

constexpr int kMaxInputs = 4;
constexpr int kMaxDims = 6;
constexpr size_t kNameBytes = 96;

struct InputSlot {
  int8_t dtype;   ///< c10::ScalarType, or -1 scalar, -2 none, -3 other
  uint8_t rank;   ///< true rank; only the first kMaxDims dims are kept
  int64_t dims[kMaxDims];
};

struct Entry {
  std::atomic<uint64_t> committed{0};  ///< the ring's count of it + 1 once the entry is complete
  uint64_t opIndex;                    ///< its index among all the ops observed
  std::atomic<int64_t> endNs{0};       ///< set when the op returns (0 while it runs)
  int64_t startNs;
  char name[kNameBytes];
  uint8_t backward;
  uint8_t inputCount;
  int64_t sequenceNr;
  int64_t step;
  uint64_t thread;
  InputSlot inputs[kMaxInputs];
};

struct Ring {
  explicit Ring(size_t n) : entries(n) {}
  std::atomic<uint64_t> next{0};
  std::vector<Entry> entries;
};

std::mutex gMu;
std::unique_ptr<Ring> gRingOwner;
std::atomic<Ring*> gRing{nullptr};
/// The collectives, in a small ring of their own: the ops of a long step do not push the last
/// collective out, and a collective is kept whether or not a step is being observed.
constexpr size_t kCollectiveCapacity = 256;
std::unique_ptr<Ring> gCollectivesOwner;
std::atomic<Ring*> gCollectives{nullptr};
/// The process-wide callback that sees them (0: none).
at::CallbackHandle gCollectiveHandle = 0;
/// The ops that declare an index domain (formats::declaresIndexDomain: an embedding, a
/// classification loss), in a small ring of their own too: a long backward, and what runs after it,
/// push the step's embedding out of the main ring, and triage judges a batch's integers by them.
constexpr size_t kIndexOpCapacity = 32;
std::unique_ptr<Ring> gIndexOpsOwner;
std::atomic<Ring*> gIndexOps{nullptr};
std::atomic<int64_t>* gStep = nullptr;
std::atomic<int>* gPhase = nullptr;
/// The recording's progress page: the newest op and collective go there too, where they outlive
/// a SIGKILL that takes the rings with it.
std::atomic<ProgressPage*> gProgress{nullptr};
std::atomic<bool> gRunning{false};
/// Whether crashcap's callbacks were the only ones when the step began: then the ops nested
/// inside an observed op are not built at all (see quietInside).
std::atomic<bool> gOuterOnly{false};
/// Counts starts: callbacks a thread registered for an earlier observer are removed by that
/// thread the next time it asks (a thread can only remove its own).
std::atomic<uint64_t> gGeneration{0};

constexpr int kMaxOpDepth = 64;

/// The ops seen calling other ops, by name pointer (a dispatcher op's name lives in its schema,
/// for the life of the process): their inner ops go unobserved from their next call on. Open
/// addressing, insert-only, lock-free; a full table learns no more.
class Callers {
 public:
  bool contains(const char* name) const {
    for (size_t i = slot(name), n = 0; n < kSlots; i = (i + 1) % kSlots, ++n) {
      const char* s = slots_[i].load(std::memory_order_relaxed);
      if (s == name) return true;
      if (!s) return false;
    }
    return false;
  }
  void insert(const char* name) {
    for (size_t i = slot(name), n = 0; n < kSlots; i = (i + 1) % kSlots, ++n) {
      const char* s = slots_[i].load(std::memory_order_relaxed);
      if (s == name) return;
      if (!s && slots_[i].compare_exchange_strong(s, name, std::memory_order_relaxed)) return;
      if (s == name) return;  // another thread put it there
    }
  }

 private:
  static constexpr size_t kSlots = 4096;
  static size_t slot(const char* name) { return (reinterpret_cast<uintptr_t>(name) >> 4) * 0x9E3779B97F4A7C15ull >> 52; }
  std::atomic<const char*> slots_[kSlots] = {};
};
Callers gCallers;

/// What the callbacks keep per thread, in one thread_local: the recorder is a shared library
/// loaded at run time (the Python extension), where each thread_local costs a __tls_get_addr
/// call, and the callbacks run for every op.
struct ThreadState {
  int backwardDepth = 0;  ///< inside a BACKWARD_FUNCTION scope
  int engineDepth = 0;    ///< inside an "autograd::engine::" scope
  int opDepth = 0;
  /// The op depth at which this thread turned RecordFunction off for the ops nested inside an
  /// observed op (-1: not turned off).
  int quietFrom = -1;
  uint64_t thread = 0;    ///< the thread's id, once asked
  /// This thread's callbacks (0: none registered) and the observer generation they belong to.
  at::CallbackHandle opHandle = 0, backwardHandle = 0;
  uint64_t generation = 0;
  /// The ops this thread is inside of, innermost last: their end callbacks find their entries.
  uint64_t opStack[kMaxOpDepth];
  /// Their names, where the op is one whose inner ops may go unobserved (nullptr for the
  /// engine's scopes and autograd nodes).
  const char* opNames[kMaxOpDepth];
};
thread_local ThreadState tState;

int64_t monotonicNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

uint64_t thisThread(ThreadState& ts) {
  if (!ts.thread) ts.thread = static_cast<uint64_t>(::syscall(SYS_gettid));
  return ts.thread;
}

/// The step in progress (-1: none yet).
int64_t currentStep() { return gStep ? gStep->load(std::memory_order_relaxed) : -1; }

/// Fills `e` as the `index`-th entry of its ring, for the `opIndex`-th op observed.
void fill(Entry& e, uint64_t index, uint64_t opIndex, const at::RecordFunction& fn, const char* name, bool backward,
          int64_t step, ThreadState& ts) {
  // A seqlock: 0 while the entry is being written, index + 1 once complete.
  e.committed.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  e.opIndex = opIndex;
  e.startNs = monotonicNs();
  e.endNs.store(0, std::memory_order_relaxed);
  const size_t n = name ? ::strnlen(name, kNameBytes - 1) : 0;
  std::memcpy(e.name, name ? name : "", n);
  e.name[n] = '\0';
  e.backward = backward;
  e.sequenceNr = fn.seqNr();
  e.step = step;
  e.thread = thisThread(ts);
  e.inputCount = 0;
  // Inputs: check everything before touching it (a callback must never throw: LibTorch
  // would catch it and log a backtrace per op).
  auto inputs = formats::torch::opArguments(fn);
  for (size_t k = 0; k < inputs.size() && e.inputCount < kMaxInputs; ++k) {
    const c10::IValue& v = inputs[k];
    InputSlot& s = e.inputs[e.inputCount++];
    s.rank = 0;
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!t.defined()) {
        s.dtype = -2;
        continue;
      }
      s.dtype = static_cast<int8_t>(t.scalar_type());
      int64_t rank = t.dim();
      s.rank = static_cast<uint8_t>(rank);
      auto sizes = t.sizes();
      for (int64_t d = 0; d < rank && d < kMaxDims; ++d) s.dims[d] = sizes[d];
    } else if (v.isScalar()) {
      s.dtype = -1;
    } else if (v.isNone()) {
      s.dtype = -2;
    } else {
      s.dtype = -3;
    }
  }
  e.committed.store(index + 1, std::memory_order_release);
}

/// A name into a fixed array of the progress page. A SIGKILL in the middle of the copy leaves a
/// torn name (the reader cuts it at the array's end); the copy is a few tens of bytes.
void storeName(char* to, size_t capacity, const char* name) {
  const size_t n = name ? ::strnlen(name, capacity - 1) : 0;
  std::memcpy(to, name ? name : "", n);
  to[n] = '\0';
}

void record(const at::RecordFunction& fn, const char* name, bool backward, ThreadState& ts) {
  Ring* ring = gRing.load(std::memory_order_acquire);
  if (!ring) return;
  uint64_t index = ring->next.fetch_add(1, std::memory_order_relaxed);
  // An async op may end on another thread: it goes into the ring, not onto this thread's stack
  // (its end would pop a sibling's entry).
  if (!fn.isAsync()) {
    if (ts.opDepth < kMaxOpDepth) ts.opStack[ts.opDepth] = index;
    ++ts.opDepth;
    cupti::pushOp(index);  // kernels launched from here on link to this op (a no-op without a tracer)
  }
  fill(ring->entries[index % ring->entries.size()], index, index, fn, name, backward, currentStep(), ts);
  if (formats::declaresIndexDomain(name))
    if (Ring* indexOps = gIndexOps.load(std::memory_order_acquire)) {
      const uint64_t k = indexOps->next.fetch_add(1, std::memory_order_relaxed);
      fill(indexOps->entries[k % indexOps->entries.size()], k, index, fn, name, backward, currentStep(), ts);
    }
  if (ProgressPage* p = gProgress.load(std::memory_order_relaxed)) storeName(p->lastOp, sizeof p->lastOp, name);
}

/// An op returned: its end time, and the kernel link back to the enclosing op.
void finish(const at::RecordFunction& fn, ThreadState& ts) {
  if (ts.opDepth == 0 || fn.isAsync()) return;  // it began before the observer did, or is not on the stack
  --ts.opDepth;
  if (ts.quietFrom == ts.opDepth) {  // the op whose insides were not observed returned
    ts.quietFrom = -1;
    at::reenableCallback(ts.opHandle);
  }
  cupti::popOp();
  Ring* ring = gRing.load(std::memory_order_acquire);
  if (!ring || ts.opDepth >= kMaxOpDepth) return;
  uint64_t index = ts.opStack[ts.opDepth];
  Entry& e = ring->entries[index % ring->entries.size()];
  if (e.committed.load(std::memory_order_acquire) == index + 1) e.endNs.store(monotonicNs(), std::memory_order_relaxed);
}

/// After an op's start was recorded: when crashcap observes alone, RecordFunction is turned off on
/// this thread until the op returns, so the ops it calls are not built. Each built op costs a
/// RecordFunction, argument boxing and both callbacks whether or not the ring keeps it; the
/// outermost op is the one the program called and the one an error or a kernel is linked to.
void quietInside(const at::RecordFunction& fn, ThreadState& ts, bool always) {
  if (!gOuterOnly.load(std::memory_order_relaxed) || !ts.opHandle || fn.isAsync() || ts.quietFrom >= 0 ||
      ts.opDepth == 0 || ts.opDepth > kMaxOpDepth)
    return;
  const char* name = ts.opNames[ts.opDepth - 1];
  if (!always && !(name && gCallers.contains(name))) return;
  ts.quietFrom = ts.opDepth - 1;
  at::disableCallback(ts.opHandle);
}

/// "autograd::engine::evaluate_function: X": the scope the autograd engine wraps around each
/// node. It is wider than the node's own (BACKWARD_FUNCTION) scope: the engine also accumulates
/// and checks the node's gradients inside it (aten::add_, aten::to, aten::sum_to_size), and those
/// ops are backward ops too.
bool isEngineScope(const char* name) {
  // Nearly every op is "aten::...": the second letter settles it before any string compare.
  return name && name[0] == 'a' && name[1] == 'u' && std::strncmp(name, "autograd::engine::", 18) == 0;
}

/// Set in a child the process forks (a DataLoader worker): the observer's callbacks are inherited
/// with LibTorch, but the child's ops are not the training's, and cost it nothing here.
std::atomic<bool> gForkedChild{false};
void onForkChild() { gForkedChild.store(true, std::memory_order_relaxed); }

void onOpEnd(const at::RecordFunction& fn, at::ObserverContext*) {
  if (gForkedChild.load(std::memory_order_relaxed)) return;
  ThreadState& ts = tState;
  if (ts.engineDepth > 0 && isEngineScope(fn.name())) --ts.engineDepth;
  finish(fn, ts);
}

std::unique_ptr<at::ObserverContext> onOp(const at::RecordFunction& fn) {
  if (gForkedChild.load(std::memory_order_relaxed) || !gRunning.load(std::memory_order_relaxed)) return nullptr;
  ThreadState& ts = tState;
  const char* name = fn.name();
  if (isEngineScope(name)) {
    ++ts.engineDepth;
    if (gPhase) {
      // The first autograd node of a step moves the step from forward to backward.
      int expected = static_cast<int>(Phase::Forward);
      gPhase->compare_exchange_strong(expected, static_cast<int>(Phase::Backward), std::memory_order_relaxed);
    }
  }
  const bool engine = ts.engineDepth > 0 && isEngineScope(name);
  // The op this one runs inside of calls others: learnt for its next call.
  if (ts.opDepth > 0 && ts.opDepth <= kMaxOpDepth && ts.opNames[ts.opDepth - 1]) gCallers.insert(ts.opNames[ts.opDepth - 1]);
  record(fn, name, ts.backwardDepth > 0 || ts.engineDepth > 0, ts);
  // The engine's scope around a node stays open: the node and the gradients summed after it are
  // the backward's ops.
  if (!fn.isAsync() && ts.opDepth <= kMaxOpDepth) ts.opNames[ts.opDepth - 1] = engine ? nullptr : name;
  if (!engine) quietInside(fn, ts, false);
  return nullptr;
}

std::unique_ptr<at::ObserverContext> onBackwardStart(const at::RecordFunction& fn) {
  if (gForkedChild.load(std::memory_order_relaxed) || !gRunning.load(std::memory_order_relaxed)) return nullptr;
  ThreadState& ts = tState;
  ++ts.backwardDepth;
  if (gPhase) {
    // The first autograd node of a step moves the step from forward to backward.
    int expected = static_cast<int>(Phase::Forward);
    gPhase->compare_exchange_strong(expected, static_cast<int>(Phase::Backward), std::memory_order_relaxed);
  }
  record(fn, fn.name(), true, ts);
  if (!fn.isAsync() && ts.opDepth <= kMaxOpDepth) ts.opNames[ts.opDepth - 1] = nullptr;
  quietInside(fn, ts, /*always=*/true);  // an autograd node runs ops (all but the rare AccumulateGrad that only moves)
  return nullptr;
}

void onBackwardEnd(const at::RecordFunction& fn, at::ObserverContext*) {
  if (gForkedChild.load(std::memory_order_relaxed)) return;
  ThreadState& ts = tState;
  if (ts.backwardDepth > 0) --ts.backwardDepth;
  finish(fn, ts);
}

/// A torch.distributed backend's work item: ProcessGroupGloo, ProcessGroupNCCL, ProcessGroupMPI
/// and ProcessGroupUCC name the RecordFunction each collective opens after themselves.
bool isCollective(const char* name) {
  if (!name) return false;
  switch (name[0]) {
    case 'g': return std::strncmp(name, "gloo:", 5) == 0;
    case 'n': return std::strncmp(name, "nccl:", 5) == 0;
    case 'm': return std::strncmp(name, "mpi:", 4) == 0;
    case 'u': return std::strncmp(name, "ucc:", 4) == 0;
    default: return false;
  }
}

/// Where a collective's entry is, for its end: the backend ends the work item's RecordFunction on
/// its own thread when the collective completes or fails.
struct CollectiveContext final : at::ObserverContext {
  Ring* ring = nullptr;
  uint64_t index = 0;
};

std::unique_ptr<at::ObserverContext> onCollective(const at::RecordFunction& fn) {
  if (gForkedChild.load(std::memory_order_relaxed) || !gRunning.load(std::memory_order_relaxed)) return nullptr;
  const char* name = fn.name();
  if (!isCollective(name)) return nullptr;  // other user scopes: DataLoader.__next__, record_function blocks
  Ring* ring = gCollectives.load(std::memory_order_acquire);
  if (!ring) return nullptr;
  uint64_t index = ring->next.fetch_add(1, std::memory_order_relaxed);
  // A collective between steps (a validation all-reduce, a checkpoint's barrier) belongs to none.
  const int phase = gPhase ? gPhase->load(std::memory_order_relaxed) : static_cast<int>(Phase::Setup);
  const bool inStep = phase != static_cast<int>(Phase::Setup) && phase != static_cast<int>(Phase::BetweenSteps);
  const int64_t step = inStep ? currentStep() : -1;
  fill(ring->entries[index % ring->entries.size()], index, index, fn, name, false, step, tState);
  if (ProgressPage* p = gProgress.load(std::memory_order_relaxed)) {
    // Gloo begins collectives on its worker threads, two at once with DDP's buckets: only the
    // newest moves the count on and writes its name, so the count never goes back.
    uint64_t seen = p->collectivesIssued.load(std::memory_order_relaxed);
    while (seen < index + 1 &&
           !p->collectivesIssued.compare_exchange_weak(seen, index + 1, std::memory_order_acq_rel)) {
    }
    if (seen < index + 1) {
      storeName(p->lastCollective, sizeof p->lastCollective, name);
      p->lastCollectiveStep.store(step, std::memory_order_relaxed);
    }
  }
  std::unique_ptr<CollectiveContext> ctx(new (std::nothrow) CollectiveContext);
  if (ctx) {
    ctx->ring = ring;
    ctx->index = index;
  }
  return ctx;
}

void onCollectiveEnd(const at::RecordFunction&, at::ObserverContext* context) {
  auto* ctx = static_cast<CollectiveContext*>(context);
  if (!ctx || !ctx->ring) return;
  Entry& e = ctx->ring->entries[ctx->index % ctx->ring->entries.size()];
  if (e.committed.load(std::memory_order_acquire) == ctx->index + 1) e.endNs.store(monotonicNs(), std::memory_order_relaxed);
}

std::string dtypeText(int8_t d) {
  switch (d) {
    case -1: return "scalar";
    case -2: return "none";
    case -3: return "other";
    default: break;
  }
  if (d < 0 || d >= static_cast<int8_t>(c10::ScalarType::NumOptions)) return "other";
  std::string s = c10::toString(static_cast<c10::ScalarType>(d));
  // "Float" -> crashcap's dtype names where they exist.
  static const std::pair<const char*, const char*> names[] = {
      {"Float", "float32"}, {"Double", "float64"}, {"Half", "float16"}, {"BFloat16", "bfloat16"},
      {"Char", "int8"},     {"Short", "int16"},    {"Int", "int32"},    {"Long", "int64"},
      {"Byte", "uint8"},    {"Bool", "bool"},      {"ComplexFloat", "complex64"},
      {"ComplexDouble", "complex128"}};
  for (const auto& [from, to] : names)
    if (s == from) return to;
  return s;
}

/// Removes this thread's callbacks, if it has any.
void removeThisThreadsCallbacks(ThreadState& ts) {
  if (ts.opHandle) at::removeCallback(ts.opHandle);
  if (ts.backwardHandle) at::removeCallback(ts.backwardHandle);
  ts.opHandle = ts.backwardHandle = 0;
  ts.quietFrom = -1;
}

/// Nested ops go unbuilt only while crashcap's op callback is this thread's only one: another
/// observer (a profiler, the replayer's, a fault injector) sees every op as it would without
/// crashcap. Asked when a step begins.
void updateOuterOnly() {
  at::RecordFunctionGuard asIfOn(true);  // the recorder's own work runs with RecordFunction off
  at::StepCallbacks callbacks = at::getStepCallbacks(at::RecordScope::FUNCTION);
  gOuterOnly.store(callbacks.callbacks_.size() == 1, std::memory_order_relaxed);
}

}  // namespace

void observeOpsOnThisThread(bool on) {
  ThreadState& ts = tState;
  const uint64_t generation = gGeneration.load(std::memory_order_acquire);
  if (ts.generation != generation) {  // callbacks of an observer that stopped since
    removeThisThreadsCallbacks(ts);
    ts.generation = generation;
  }
  if (!on || !gRunning.load(std::memory_order_acquire) || gForkedChild.load(std::memory_order_relaxed)) {
    removeThisThreadsCallbacks(ts);
    return;
  }
  if (ts.opHandle) {
    updateOuterOnly();
    return;
  }
  // Thread-local callbacks travel with the thread's state where LibTorch hands work to other
  // threads (the autograd engine's device threads): the step's backward on a GPU is observed too.
  ts.opHandle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(&onOp, &onOpEnd).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  ts.backwardHandle = at::addThreadLocalCallback(at::RecordFunctionCallback(&onBackwardStart, &onBackwardEnd)
                                                     .needsInputs(false)
                                                     .scopes({at::RecordScope::BACKWARD_FUNCTION}));
  updateOuterOnly();
}

bool startOpObserver(size_t capacity, std::atomic<int64_t>* step, std::atomic<int>* phase, ProgressPage* progress) {
  std::lock_guard<std::mutex> lk(gMu);
  if (gRunning || capacity == 0) return false;
  gStep = step;
  gPhase = phase;
  gProgress.store(progress, std::memory_order_release);
  static bool forkHandler = (pthread_atfork(nullptr, nullptr, &onForkChild), true);
  (void)forkHandler;
  // A callback still finishing on another thread may hold the previous ring: retire it
  // instead of freeing it (one small ring per restart of the observer).
  static std::vector<std::unique_ptr<Ring>> retired;
  if (gRingOwner) retired.push_back(std::move(gRingOwner));
  gRingOwner = std::make_unique<Ring>(capacity);
  gRing.store(gRingOwner.get(), std::memory_order_release);
  if (gIndexOpsOwner) retired.push_back(std::move(gIndexOpsOwner));
  gIndexOpsOwner = std::make_unique<Ring>(kIndexOpCapacity);
  gIndexOps.store(gIndexOpsOwner.get(), std::memory_order_release);
  if (gCollectivesOwner) retired.push_back(std::move(gCollectivesOwner));
  gCollectivesOwner = std::make_unique<Ring>(kCollectiveCapacity);
  gCollectives.store(gCollectivesOwner.get(), std::memory_order_release);
  // Collectives are observed in every thread, all the time: they are few, and the one a rank
  // hangs in is issued from the autograd engine's threads or between steps as often as in one.
  // A callback for user scopes only leaves the cost of every other op as it was.
  gCollectiveHandle = at::addGlobalCallback(
      at::RecordFunctionCallback(&onCollective, &onCollectiveEnd).needsInputs(true).scopes({at::RecordScope::USER_SCOPE}));
  gGeneration.fetch_add(1, std::memory_order_acq_rel);
  gRunning.store(true, std::memory_order_release);
  observeOpsOnThisThread(true);
  return true;
}

void stopOpObserver() {
  std::lock_guard<std::mutex> lk(gMu);
  if (!gRunning) return;
  gRunning.store(false, std::memory_order_release);
  removeThisThreadsCallbacks(tState);  // other threads' stay registered, inert, until they ask again
  if (gCollectiveHandle) at::removeCallback(gCollectiveHandle);
  gCollectiveHandle = 0;
  gStep = nullptr;
  gPhase = nullptr;
  gProgress.store(nullptr, std::memory_order_release);
  // The ring itself stays: a crash after close can still be described.
}

namespace {
formats::OpData describe(const Entry& e, uint64_t i) {
  formats::OpData op;
  op.index = i;
  op.name.assign(e.name, strnlen(e.name, kNameBytes));
  op.phase = e.backward ? "backward" : "forward";
  op.sequenceNr = e.sequenceNr;
  op.step = e.step;
  op.thread = e.thread;
  op.startNs = e.startNs;
  op.endNs = e.endNs.load(std::memory_order_relaxed);
  for (int k = 0; k < e.inputCount && k < kMaxInputs; ++k) {
    formats::OpInputData in;
    in.dtype = dtypeText(e.inputs[k].dtype);
    for (int d = 0; d < e.inputs[k].rank && d < kMaxDims; ++d) in.shape.push_back(e.inputs[k].dims[d]);
    op.inputs.push_back(std::move(in));
  }
  return op;
}
}  // namespace

namespace {
/// The entries of `ring` still readable, oldest first, each as `describe` makes it; entries being
/// rewritten are skipped.
template <typename Describe>
void readRing(const Ring& ring, Describe describe) {
  uint64_t total = ring.next.load(std::memory_order_acquire);
  size_t cap = ring.entries.size();
  uint64_t first = total > cap ? total - cap : 0;
  for (uint64_t i = first; i < total; ++i) {
    const Entry& e = ring.entries[i % cap];
    if (e.committed.load(std::memory_order_acquire) != i + 1) continue;  // being rewritten
    Entry copy;
    copy.opIndex = e.opIndex;
    std::memcpy(copy.name, e.name, sizeof copy.name);
    copy.backward = e.backward;
    copy.inputCount = e.inputCount;
    copy.sequenceNr = e.sequenceNr;
    copy.step = e.step;
    copy.thread = e.thread;
    copy.startNs = e.startNs;
    copy.endNs.store(e.endNs.load(std::memory_order_relaxed), std::memory_order_relaxed);
    std::memcpy(copy.inputs, e.inputs, sizeof copy.inputs);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.committed.load(std::memory_order_relaxed) != i + 1) continue;  // overwritten while copied
    describe(copy, i);
  }
}
}  // namespace

std::optional<formats::OpTraceData> snapshotOps() {
  Ring* ring = gRing.load(std::memory_order_acquire);
  if (!ring) return std::nullopt;
  formats::OpTraceData out;
  out.totalOps = ring->next.load(std::memory_order_acquire);
  out.capacity = static_cast<uint32_t>(ring->entries.size());
  readRing(*ring, [&](const Entry& e, uint64_t i) { out.ops.push_back(describe(e, i)); });
  if (Ring* indexOps = gIndexOps.load(std::memory_order_acquire)) {
    // Those the main ring no longer holds.
    const uint64_t oldest = out.ops.empty() ? out.totalOps : out.ops.front().index;
    readRing(*indexOps, [&](const Entry& e, uint64_t) {
      if (e.opIndex < oldest) out.indexOps.push_back(describe(e, e.opIndex));
    });
  }
  if (Ring* collectives = gCollectives.load(std::memory_order_acquire)) {
    out.totalCollectives = collectives->next.load(std::memory_order_acquire);
    readRing(*collectives, [&](const Entry& e, uint64_t i) {
      formats::OpData op = describe(e, i);
      formats::CollectiveData c;
      c.seq = i;
      c.name = std::move(op.name);
      c.step = op.step;
      c.thread = op.thread;
      c.inputs = std::move(op.inputs);
      c.startNs = op.startNs;
      c.endNs = op.endNs;
      out.collectives.push_back(std::move(c));
    });
  }
  return out;
}



}  // namespace crashcap::recorder::detail
