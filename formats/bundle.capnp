# crashcap bundle record metas. Each record's meta is one unpacked Cap'n Proto message
# (standard serialization: segment table, then segments; at most 1 MiB) of one of the structs below, chosen by the record type in the record header
# (formats/include/crashcap/formats/layout.hpp). Record bodies are raw bytes or one zstd
# frame; which struct describes the body is said per struct.
#
# Evolution rules (also in docs/FORMAT.md):
# - Fields are only ever added, with the next ordinal; never renumbered, retyped or removed
#   (a field that is no longer written stays, documented as obsolete).
# - A new record kind gets a new RecordType number and a new struct here; readers that do
#   not know the type skip the record with a notice, unless its header carries
#   kFlagRequired, in which case they refuse the bundle.
# - Enum values are only appended. A reader treats an unknown enum value as invalid input
#   for that record (reported, the record skipped), never as a crash.
# - Incompatible changes bump the format major version in the file header.
@0xad53396b4f2398d9;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("crashcap::schema");

# Element types; the numbers match crashcap::formats::DType.
enum DType {
  float64 @0;
  float32 @1;
  float16 @2;
  bfloat16 @3;
  int8 @4;
  int16 @5;
  int32 @6;
  int64 @7;
  uint8 @8;
  bool @9;      # one byte per element, 0 or 1
  complex64 @10;   # (float32 real, float32 imag)
  complex128 @11;  # (float64 real, float64 imag)
}

# Record type 1. The first record of every bundle. No body.
struct RecordingInfo {
  producer @0 :Text;      # what wrote the bundle: "crashcap import", "crashcap recorder", ...
  toolVersion @1 :Text;   # crashcap version string, e.g. "0.1.0"
  hostname @2 :Text;      # may be empty
  pid @3 :UInt32;         # writer's process id; 0 when unknown
  createdNs @4 :Int64;    # wall clock, ns since the Unix epoch; equals the file header's
}

# Record type 2. One chunk of one tensor. The body holds bytes [offset, offset+length) of
# the tensor's contiguous row-major little-endian element bytes, after the shuffle below,
# as stored (raw or one zstd frame; see the record header's codec).
#
# Invariants (a reader rejects a chunk that breaks one):
# - tensorId > 0; all chunks of one tensor carry the same tensorId, name, dtype, shape,
#   totalBytes and chunkCount.
# - name: 1..1024 bytes of valid UTF-8 without control characters; '/' separates path parts;
#   unique within a bundle.
# - rank (shape length) <= 16; every dim >= 0;
#   totalBytes = product(shape) * elementSize(dtype), computed without overflow.
# - 0 <= chunkIndex < chunkCount; the chunks sorted by chunkIndex tile [0, totalBytes)
#   exactly: chunk 0 has offset 0, each next offset = previous offset + previous length.
# - length = the record header's rawLength; length is a multiple of elementSize(dtype).
# - An empty tensor (totalBytes = 0) is one chunk of length 0.
struct TensorChunk {
  tensorId @0 :UInt64;
  name @1 :Text;
  dtype @2 :DType;
  shape @3 :List(Int64);
  totalBytes @4 :UInt64;
  chunkIndex @5 :UInt32;
  chunkCount @6 :UInt32;
  offset @7 :UInt64;      # bytes into the tensor
  length @8 :UInt64;      # decoded bytes in this chunk
  shuffle @9 :UInt8;      # 0: none; k > 1: bytes were transposed with element size k
                          # (all first bytes of each element, then all second bytes, ...)
}

# Record type 3. A free-form annotation ("crashcap.import.source", "crashcap.recovery", user
# notes). No body.
struct Note {
  key @0 :Text;   # 1..256 bytes; dotted namespace, "crashcap." reserved for the tool
  text @1 :Text;  # UTF-8, at most 64 KiB
}

# Record type 4. The environment fingerprint of the recorded process (machine, OS, WSL2,
# versions, threads, the environment variables that change CUDA/PyTorch behaviour, the
# command line). The writer's caller redacts secrets before writing: a secret's value never
# appears here, only its name in `redacted` and the text "<redacted>" in its place. No body.
struct Environment {
  facts @0 :List(Entry);       # "cpu.model", "os.wsl2", "torch.version", ...; keys unique
  variables @1 :List(Entry);   # environment variables, sorted by name
  commandLine @2 :List(Text);  # argv, secret values replaced
  redacted @3 :List(Text);     # names (or "argv[i]") whose values were withheld
}

struct Entry {
  key @0 :Text;     # at most 4 KiB
  value @1 :Text;   # at most 64 KiB
}

# ---------------------------------------------------------------------------------------
# Records written by the recorder (recorder/). Step numbers are the training loop's own
# step indices as given to Recorder::beginStep (>= 0, strictly increasing within a
# recording). Tensor names follow fixed paths so tools find them without an index:
#   steps/<step>/batch/<name>                       the batch as fed to the step
#   steps/<step>/rng/<device>                       generator state before the step ("cpu", "cuda0")
#   crash/batch/<name>                              another loader's batch, kept at a crash (Crash.otherBatch)
#   keyframes/<step>/parameters/<name>              weights before the step ran
#   keyframes/<step>/buffers/<name>                 buffers (batch-norm statistics) before the step
#   keyframes/<step>/optimizer/<parameter>/<key>    optimizer state ("momentum_buffer", "exp_avg")
# A record that refers to tensors is written after all of them, so its presence means they
# reached the file first (a commit marker).

# Record type 5. The step program: what the replayer executes, a TorchScript archive
# (torch.jit.save format) of a module in training mode whose forward(inputs...) returns the
# loss: a scalar tensor, or a tuple whose element 0 is the loss, or a dict with key "loss".
# The archive holds every weight, so it is stored as a uint8 tensor (chunked like any other,
# no size limit), written before this record. No body.
struct StepProgram {
  format @0 :Text;              # "torchscript"; "module": no archive (Recorder::setModel), the
                                # program's own step function replays it; "python": a Python training
                                # (the crashcap Python package), replayed by its own loop
  inputs @1 :List(Text);        # forward's batch arguments, in order; each a batch tensor name
  parameters @2 :List(Text);    # trainable parameters by name, in module order
  buffers @3 :List(Text);       # buffers by name, in module order
  archive @4 :Text;             # name of the uint8 [n] tensor holding the archive ("program/torchscript")
  device @5 :Text;              # where the parameters lived: "cpu", "cuda:0", ... ("" in older bundles: unknown)
  servesReplay @6 :Bool;        # format "module": the program gave its step function (Recorder::setStep),
                                # so re-running its command line in replay mode replays it; format
                                # "python": always (the Python loop is its own replay)
  sources @7 :List(SourceFile); # format "python": the program's own source files (not installed
                                # packages), each stored as a uint8 tensor, so replay can tell a
                                # changed script and a bug report carries the code
}

struct SourceFile {
  path @0 :Text;                # as the program imported it: relative to the working directory
                                # when inside it, else absolute
  sha256 @1 :Text;              # hex digest of the file's bytes when recorded
  bytes @2 :UInt64;
  tensor @3 :Text;              # the uint8 [bytes] tensor holding them ("program/sources/<path>");
                                # "" when the file was too large to keep (its hash still is)
}

# Record type 6. The optimizer and the recipe replay follows:
#   zero_grad -> forward -> backward -> [clip grad norm] -> optimizer step. No body.
struct OptimizerSpec {
  kind @0 :Text;                # "sgd" | "adam" | "adamw" | "rmsprop" | "adagrad" | "unknown"
  groups @1 :List(ParamGroup);
  gradClipNorm @2 :Float64;     # max total norm; 0 = no clipping
  gradClipNormType @3 :Float64; # p of the p-norm (2.0 usually)
}

struct ParamGroup {
  parameters @0 :List(Text);    # parameter names in this group
  options @1 :List(Number);     # "lr", "momentum", "dampening", "weight_decay", "nesterov" (0/1),
                                # "beta1", "beta2", "eps", "amsgrad" (0/1), "alpha", "centered",
                                # "lr_decay", "initial_accumulator_value"
}

struct Number {
  key @0 :Text;
  value @1 :Float64;
}

# Record type 7. A step began: its batch and generator states are in the file (written just
# before this record). No body.
struct StepBegin {
  step @0 :Int64;
  batch @1 :List(Text);         # tensor names, in step-program input order when a program is set
  rng @2 :List(Text);           # tensor names of generator states
  learningRates @3 :List(Float64);  # per parameter group, as the optimizer will use them
  timeNs @4 :Int64;             # wall clock at step begin, ns since the Unix epoch
  keyframe @5 :Int64;           # step of the newest keyframe at or before this step; -1 none
  previousStep @6 :Int64 = -2;  # the step the process began before this one: -1 this is its first;
                                # -2 unknown (written before the field existed). A previousStep that
                                # the bundle has no step_begin for, inside the retained window, is a
                                # step the recorder lost. Invariant: -2 <= previousStep < step.
  structure @7 :Text;           # how the batch tensors nest (Python: tuples, lists, dicts), JSON
                                # (docs/FORMAT.md); "" a flat set of named tensors. At most 64 KiB.
  rowDims @8 :List(Int8);       # per batch tensor (parallel to batch): the dimension holding the
                                # batch's rows (samples), -1 none; empty in bundles written before
                                # it (readers take dimension 0 where it equals the first tensor's)
  accumulating @9 :Bool;        # the step begins with gradients that earlier steps accumulated (a
                                # backward since the last optimizer update): a keyframe here would
                                # not hold them (Recorder::holdKeyframes); false when not known
}

# Record type 8. A step ended normally (the guard's end(loss) ran). No body.
struct StepEnd {
  step @0 :Int64;
  loss @1 :Float64;             # the loss as computed (float32 losses widened exactly); NaN/Inf kept
  gradNorm @2 :Float64;         # total 2-norm of all gradients after backward; NaN when unknown
  hasGradNorm @3 :Bool;
  nonFinite @4 :Bool;           # loss or gradient norm is NaN/Inf
  durationNs @5 :Int64;         # beginStep to end(loss)
  gradNormMethod @6 :UInt8;     # how gradNorm was computed: 0 at::_foreach_norm and the norm of the
                                # norms (LibTorch's), 1 blocked float32 sum of squares
                                # (formats/torch/fingerprint.hpp)
  updateLearningRates @7 :List(Float64);  # per parameter group, as the optimizer held them at
                                # end(loss), for its update, when the program set them after the
                                # step began (a warm-up computed from its own step counter); empty:
                                # the begin's learningRates (and in bundles written before it)
}

# Record type 9. A keyframe: the full pre-step state of step `step`, whose tensors precede
# this record. No body.
struct Keyframe {
  step @0 :Int64;
  parameters @1 :List(Text);    # tensor names
  buffers @2 :List(Text);
  optimizerState @3 :List(Text);
  optimizerScalars @4 :List(Number);   # "<parameter>/step" for Adam-like optimizers
  documents @5 :List(Text);     # names of uint8 tensors holding JSON documents of state that is not
                                # tensors ("keyframes/<step>/documents/optimizer": a Python
                                # optimizer's state_dict with its tensors referenced by name;
                                # ".../scheduler", ".../grad_scaler")
}

# Record type 10. The ring of the last ATen ops the recorder saw before a crash (or at
# seal), oldest first. No body.
struct OpTrace {
  ops @0 :List(Op);
  totalOps @1 :UInt64;          # ops observed since recording began
  capacity @2 :UInt32;          # ring size
  collectives @3 :List(Collective);  # the last collectives the process issued, oldest first
  totalCollectives @4 :UInt64;  # collectives issued since recording began
  indexOps @5 :List(Op);        # the last calls of ops that declare an index domain (an embedding, a
                                # classification loss, a gather or scatter: formats::declaresIndexDomain)
                                # that `ops` no longer holds, oldest first: a long backward or what
                                # runs after it pushes the step's embedding out of the ring. Their
                                # endNs is 0 (not kept)
}

# A collective (all-reduce, broadcast, barrier, ...) a process issued to its torch.distributed
# backend, as the backend's work item reports it: issued on one thread, completed on another.
struct Collective {
  seq @0 :UInt64;               # 0-based count of collectives this process issued since recording
                                # began: the ranks of one job issue the same collectives in the
                                # same order, so equal numbers are the same collective
  name @1 :Text;                # the backend's name for it: "gloo:all_reduce", "nccl:broadcast"
  step @2 :Int64;               # step in progress when it was issued; -1 outside steps
  thread @3 :UInt64;            # OS thread that issued it
  inputs @4 :List(OpInput);     # its first tensors (at most 4)
  startNs @5 :Int64;            # CLOCK_MONOTONIC ns when it was issued
  endNs @6 :Int64;              # when the backend ended it: completed, or failed (a peer gone);
                                # 0: it had not ended (the process was waiting in it)
}

struct Op {
  index @0 :UInt64;             # 0-based count of ops observed since recording began
  name @1 :Text;                # "aten::conv2d", "ConvolutionBackward0"
  phase @2 :Text;               # "forward" | "backward"
  sequenceNr @3 :Int64;         # autograd sequence number (links forward and backward); -1 none
  step @4 :Int64;               # step in progress; -1 outside steps
  thread @5 :UInt64;            # OS thread id
  inputs @6 :List(OpInput);     # first inputs (at most 4)
  startNs @7 :Int64;            # CLOCK_MONOTONIC ns when the op began; 0 unknown (older bundles)
  endNs @8 :Int64;              # CLOCK_MONOTONIC ns when it returned; 0 unknown or still running
}

struct OpInput {
  dtype @0 :Text;               # "float32", ... for tensors; "scalar", "none", "other" otherwise
  shape @1 :List(Int64);
}

# Record type 11. How the recorded process failed. No body.
struct Crash {
  kind @0 :Text;                # "exception" | "terminate" | "signal" | "nonfinite"
  step @1 :Int64;               # step in progress; -1 outside steps
  phase @2 :Text;               # "setup" | "forward" | "backward" | "optimizer" | "between-steps" | "loading"
                                # ("loading": the training's DataLoader raised instead of giving the
                                # batch after `step`, which ran to its end; a Python front end's)
  error @3 :Text;               # the error text, as the program would have printed it
  errorType @4 :Text;           # demangled exception type; "" when none
  signal @5 :Int32;             # signal number; 0 when the failure was no signal
  signalName @6 :Text;          # "SIGSEGV"; "" when none
  stack @7 :List(Text);         # native stack, innermost first, one frame per entry
  timeNs @8 :Int64;
  pid @9 :UInt32;
  thread @10 :UInt64;
  # Phase "loading": the batch that never came, as the loader's sampler drew it (at most 1 << 20
  # indices; both empty when not known: an IterableDataset, a sampler of other keys).
  loadingIndices @11 :List(Int64);         # into the loader's own dataset (what a replay loads)
  loadingDatasetIndices @12 :List(Int64);  # the same samples in the data under any Subset (what
                                           # triage names, like a recorded batch's dataset indices)
  # A crash between steps while the program held a batch of a DataLoader other than the
  # training's (a validation pass's): that batch, as it was at the crash. A Python front end's;
  # its batches are no step's, and a replay of the steps does not run the code that takes them.
  otherLoader @13 :Int32 = -1;  # the loader's number (the order loaders were first iterated); -1 none
  otherBatch @14 :List(Text);   # its tensors, named crash/batch/<name> ("index": its samples'
                                # dataset indices, as in a step's batch); CPU tensors only
  otherStructure @15 :Text;     # how they nest, as StepBegin.structure
  otherRowDims @16 :List(Int8); # per tensor (parallel to otherBatch), as StepBegin.rowDims
}

# Record type 12. The recorder's own health: written when a recording closes and into every
# sealed bundle. No body.
struct RunStatus {
  state @0 :Text;               # "finished" | "crashed" | "interrupted" (sealed from a directory
                                # whose process never closed it)
  stepsBegun @1 :UInt64;
  lastStep @2 :Int64;           # -1 none
  droppedRecords @3 :UInt64;    # records the recorder could not write (disk full, queue full)
  droppedBytes @4 :UInt64;
  warnings @5 :List(Text);
  segmentsDeleted @6 :UInt64;   # by the retention budget
  lostSteps @7 :List(Int64);    # steps whose records the recorder could not queue (the writer was
                                # behind), ascending; at most 4096, the first ones (lostStepCount
                                # counts all)
  lostStepCount @8 :UInt64;
  keyframesSkipped @9 :UInt64;  # keyframes not taken because the last one was still being written
  lastPhase @10 :Text;          # where in lastStep the run was ("forward", "backward", ...; "" unknown)
  keyframeInterval @11 :Int64;  # steps between keyframes at the end (the policy's, or the one the
                                # automatic cadence chose); 0 unknown
  bufferPoolPeakBytes @12 :UInt64;  # the most host memory the recorder's copies held at once
  keyframesWrittenRaw @13 :UInt64;  # keyframes finished uncompressed because the writer fell behind
  # From the progress file, for a process that could not write its op trace (SIGKILL): the newest
  # op it began and the collectives it issued, the last by name and step.
  lastOp @14 :Text;             # "" unknown
  collectivesIssued @15 :UInt64;  # 0: none, or unknown
  lastCollective @16 :Text;     # "gloo:all_reduce"; "" none
  lastCollectiveStep @17 :Int64 = -1;  # between steps, or unknown
}

# Record type 13. What `crashcap run` saw of one run of the supervised command: how it ended,
# why (classification), and the tails of its output. Written into that run's crash bundle.
# No body.
struct Supervision {
  command @0 :List(Text);       # argv, secrets redacted
  attempt @1 :UInt32;           # 1 for the first run; restarts count up
  pid @2 :UInt32;               # the child's
  exitCode @3 :Int32;           # exit status; -1 when a signal ended it
  signal @4 :Int32;             # 0 when none
  signalName @5 :Text;          # "SIGSEGV"; "" when none
  classification @6 :Text;      # "cuda-illegal-instruction" ... "exit-nonzero" (docs/RUN.md)
  evidence @7 :Text;            # the output line (or fact) the classification rests on
  stdoutTail @8 :Text;          # the last bytes of the child's stdout (bounded)
  stderrTail @9 :Text;
  startNs @10 :Int64;
  endNs @11 :Int64;
  trace @12 :Text;              # the kernel trace in one line: "recorded: ..." or "unavailable: <reason>"
  interrupted @13 :Bool;        # `crashcap run` itself was stopped (Ctrl-C, SIGTERM)
  environment @14 :List(Text);  # "NAME=VALUE" that `crashcap run` set for the child
  cudnnLogTail @15 :Text;       # the last bytes of cuDNN's API log (`crashcap run --cudnn-log`); "" off
  params @16 :List(Text);       # "NAME=VALUE": the run's hyperparameters, from its command line's
                                # `--name value` options and what the program declared
                                # (crashcap.hyperparameters); at most 256, each at most 4 KiB
  stopped @17 :Bool;            # `crashcap run --nproc` stopped this rank (SIGTERM, then SIGKILL)
                                # because another rank of its job had failed and this one had not
                                # ended --hang-timeout seconds later
}

# Record type 14. The kernel trace of one process: what its GPU ran last, the launches its
# host threads made, and the first CUDA API call that failed. Written by the in-process
# recorder and by libcrashcap_inject.so (a `trace-<pid>.cctrace` bundle in the recording
# directory), copied by `crashcap run` into the crash bundle: one record per traced process.
# When no trace could be taken the record still says why (`status`). No body.
# Invariants: every name index is < names.size(); names are at most 4 KiB (longer symbols are
# cut and counted in truncatedNames); activities and launches are oldest first.
# Times are the tracer's clock (CUPTI's timestamps, ns); adding clockOffsetNs gives
# CLOCK_MONOTONIC ns, the clock of Op.startNs.
struct KernelTrace {
  status @0 :Text;                  # "recorded" | "unavailable: <reason>"
  pid @1 :UInt32;
  names @2 :List(Text);             # string table: kernel symbols (as the driver gives them,
                                    # usually mangled), API functions, copy directions
  activities @3 :List(TraceActivity);   # the last ones CUPTI delivered (a bounded ring)
  launches @4 :List(KernelLaunch);      # the host-side launch ring (the callback API)
  firstError @5 :ApiError;          # meaningful when hasFirstError
  hasFirstError @6 :Bool;
  totalActivities @7 :UInt64;       # activities delivered since tracing began
  droppedActivities @8 :UInt64;     # activities lost: CUPTI's buffers were full, or this
                                    # record had no room for the oldest
  totalLaunches @9 :UInt64;         # launches seen since tracing began
  clockOffsetNs @10 :Int64;         # CLOCK_MONOTONIC ns minus tracer ns
  cuptiVersion @11 :UInt32;         # cuptiGetVersion; 0 unknown
  truncatedNames @12 :UInt64;       # names cut to 4 KiB
  stickyError @13 :ApiError;        # the first call whose error poisons the CUDA context (700,
                                    # 710, 715, ...: every later call fails); meaningful when
                                    # hasStickyError. The same call as firstError, or a later
                                    # one when a soft error (a recovered allocation failure) came first.
  hasStickyError @14 :Bool;
}

enum ActivityKind {
  kernel @0;
  memcpy @1;
  memset @2;
  runtime @3;                       # a CUDA runtime API call (cudaMalloc, cudaLaunchKernel...)
  driver @4;                        # a CUDA driver API call (cuLaunchKernel...)
  overhead @5;                      # time CUPTI itself took (buffer flushes, instrumentation)
}

struct TraceActivity {
  kind @0 :ActivityKind;
  name @1 :UInt32;                  # names index: kernel symbol, API function, copy direction
                                    # ("HtoD"), memset memory kind, overhead kind
  startNs @2 :UInt64;
  endNs @3 :UInt64;
  deviceId @4 :UInt32;
  contextId @5 :UInt32;
  streamId @6 :UInt32;
  correlationId @7 :UInt32;         # links an API call to the kernel/copy it launched
  opIndex @8 :Int64;                # Op.index of the ATen op that launched it (external
                                    # correlation); -1 none
  gridX @9 :Int32;
  gridY @10 :Int32;
  gridZ @11 :Int32;
  blockX @12 :Int32;
  blockY @13 :Int32;
  blockZ @14 :Int32;
  bytes @15 :UInt64;                # memcpy / memset
  returnCode @16 :Int32;            # runtime / driver: cudaError_t / CUresult
  threadId @17 :UInt32;             # runtime / driver: the calling OS thread
}

struct KernelLaunch {
  index @0 :UInt64;                 # launches seen before this one
  symbol @1 :UInt32;                # names index
  api @2 :UInt32;                   # names index: "cudaLaunchKernel", "cuLaunchKernel", ...
  gridX @3 :Int32;
  gridY @4 :Int32;
  gridZ @5 :Int32;
  blockX @6 :Int32;
  blockY @7 :Int32;
  blockZ @8 :Int32;
  stream @9 :UInt64;                # the stream handle, as an address
  correlationId @10 :UInt32;
  timeNs @11 :UInt64;               # tracer clock at the call
  threadId @12 :UInt32;
  returnCode @13 :Int32;            # what the launch call returned; -1 it had not returned
  opIndex @14 :Int64;               # -1 none
}

struct ApiError {
  domain @0 :Text;                  # "runtime" | "driver"
  api @1 :Text;                     # "cudaLaunchKernel"
  code @2 :Int32;
  name @3 :Text;                    # "cudaErrorIllegalInstruction"; "" unknown
  correlationId @4 :UInt32;
  timeNs @5 :UInt64;                # tracer clock
  threadId @6 :UInt32;
  symbol @7 :Text;                  # the kernel, when the call was a launch
  opIndex @8 :Int64;                # -1 none
}

# Record type 15. Written once, when the bundle is sealed. The meta is IndexInfo; the body
# is an Index message (zstd-compressed unless that does not make it smaller).
struct IndexInfo {
  recordCount @0 :UInt64;   # records listed in Index.records
  tensorCount @1 :UInt64;   # tensors listed in Index.tensors
}

struct Index {
  records @0 :List(RecordRef);     # every record before the index, in file order
  tensors @1 :List(TensorEntry);   # every complete tensor, in first-write order
}

struct RecordRef {
  offset @0 :UInt64;     # file offset of the record header
  type @1 :UInt16;
  sequence @2 :UInt64;
  length @3 :UInt64;     # header + meta + body bytes
}

struct TensorEntry {
  tensorId @0 :UInt64;
  name @1 :Text;
  dtype @2 :DType;
  shape @3 :List(Int64);
  totalBytes @4 :UInt64;
  storedBytes @5 :UInt64;   # sum of the chunks' stored body lengths
  chunkRecords @6 :List(UInt64);   # file offsets of the chunk records, by chunkIndex
}

# Record type 16. Where the recorded process stood in a multi-process job (torch.distributed,
# c10d): one rank's recording of the job. Written by the recorder when it learns it (from the
# launcher's environment at start, from the process group when the program gives it or the
# Python recorder finds one); the last one written holds. No body.
# Invariants: worldSize >= 1; 0 <= rank < worldSize; -1 <= localRank < worldSize (-1: not
# known); texts at most 4 KiB.
struct Distributed {
  jobId @0 :Text;        # the same in every rank's recording of one job; "" not known
  jobIdSource @1 :Text;  # where jobId came from: "crashcap run", "torchelastic", "rendezvous", "program"
  rank @2 :Int32;
  worldSize @3 :Int32;
  localRank @4 :Int32;
  backend @5 :Text;      # "gloo", "nccl", "mpi", ...; "" not known
  rendezvous @6 :Text;   # how the ranks found each other: "tcp://HOST:PORT", "file://PATH", "env://HOST:PORT"
  source @7 :Text;       # who said: "environment" (the launcher's variables), "torch.distributed", "c10d", "program"
}
