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
