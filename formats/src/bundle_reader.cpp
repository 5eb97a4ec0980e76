#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/records.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "codec.hpp"
#include "crashcap/formats/error.hpp"
#include "file_io.hpp"
#include "meta.hpp"
#include "scanner.hpp"

namespace crashcap::formats {

bool OpenReport::complete() const {
  return footerPresent && !truncatedAt && damage.empty() && lostTensors.empty() && !fileHeaderDamaged && missingSequenceCount == 0;
}

std::string EnvironmentData::fact(const std::string& key) const {
  for (const auto& [k, v] : facts)
    if (k == key) return v;
  return {};
}

std::string OpenReport::summary() const {
  if (complete())
    return fmt::format(sealed ? "sealed, {} records" : "sealed, {} records (read by a full scan)", recordsRecovered);
  std::vector<std::string> parts;
  if (truncatedAt)
    parts.push_back(fmt::format("truncated at byte {} (crash during recording?)", fileSize));
  else if (!sealed)
    parts.push_back(fmt::format("not sealed ({})", whyScanned));
  if (fileHeaderDamaged) parts.push_back("file header damaged");
  parts.push_back(fmt::format("{} record{} recovered", recordsRecovered, recordsRecovered == 1 ? "" : "s"));
  if (!damage.empty()) {
    uint64_t bytes = 0;
    for (const auto& d : damage) bytes += d.length;
    parts.push_back(fmt::format("{} damaged range{} ({} bytes) skipped", damage.size(), damage.size() == 1 ? "" : "s",
                                bytes));
  }
  if (truncatedAt && *truncatedAt < fileSize)
    parts.push_back(fmt::format("the incomplete record at byte {} dropped", *truncatedAt));
  if (missingSequenceCount) parts.push_back(fmt::format("{} records missing", missingSequenceCount));
  if (!lostTensors.empty()) {
    std::string lost;
    for (size_t i = 0; i < lostTensors.size() && i < 3; ++i)
      lost += fmt::format("{}'{}' ({} of {} chunks)", i ? ", " : "", lostTensors[i].name, lostTensors[i].chunksFound,
                          lostTensors[i].chunkCount);
    if (lostTensors.size() > 3) lost += fmt::format(" and {} more", lostTensors.size() - 3);
    parts.push_back(fmt::format("{} tensor{} lost: {}", lostTensors.size(), lostTensors.size() == 1 ? "" : "s", lost));
  }
  std::string s;
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? (i == 1 ? ": " : "; ") : "") + parts[i];
  return s;
}

struct BundleReader::Impl {
  std::vector<uint8_t> memory;  // openBytes/scanBytes: the bundle itself, read through `file`
  detail::File file;
  ReaderLimits limits;
  FileHeader header;
  OpenReport report;
  std::optional<RecordingInfoData> info;
  std::vector<NoteData> notes;
  std::optional<EnvironmentData> environment;
  std::vector<RecordEntry> records;
  std::vector<TensorInfo> tensors;
  std::unordered_map<std::string, size_t> byName;
  std::vector<RecordEntry> lazyMetas;  // sealed bundles: recording info and notes, not yet read
  std::once_flag lazyOnce;

  /// Reads the recording info and notes of a sealed bundle on first use. A damaged one is
  /// reported (damage + notice) and skipped, as the scan would; it never throws.
  void loadLazyMetas() {
    std::call_once(lazyOnce, [this] {
      for (const auto& e : lazyMetas) {
        try {
          auto r = read(e.offset, false);
          if (e.type == static_cast<uint16_t>(RecordType::RecordingInfo))
            info = detail::decodeRecordingInfo(r.meta.data(), r.meta.size(), limits);
          else if (e.type == static_cast<uint16_t>(RecordType::Environment))
            environment = detail::decodeEnvironment(r.meta.data(), r.meta.size(), limits);
          else
            notes.push_back(detail::decodeNote(r.meta.data(), r.meta.size(), limits));
        } catch (const Error& err) {
          report.damage.push_back({e.offset, e.length, err.message()});
          report.notices.push_back(fmt::format("{} record #{} at byte {} is damaged and was skipped: {}",
                                               recordTypeName(e.type), e.sequence, e.offset, err.message()));
        }
      }
    });
  }

  void reset() {
    info.reset();
    notes.clear();
    environment.reset();
    lazyMetas.clear();
    records.clear();
    tensors.clear();
    byName.clear();
  }

  /// Reads and checks one record: header, limits, meta and body checksums; decodes the body.
  BundleReader::RawRecord read(uint64_t offset, bool decodeBody = true) const {
    uint64_t size = file.size();
    if (offset < kFileHeaderSize || offset > size || size - offset < kRecordHeaderSize)
      throw Error(ErrorCode::Corrupt, fmt::format("no record header fits at byte {} of a {}-byte file", offset, size));
    uint8_t head[kRecordHeaderSize];
    file.preadExact(head, kRecordHeaderSize, offset);
    auto check = decodeRecordHeader(head);
    if (!check.header) throw Error(ErrorCode::Corrupt, fmt::format("record at byte {}: {}", offset, check.problem));
    const RecordHeader& h = *check.header;
    uint64_t bodyLimit = detail::bodyLimitFor(h.type, limits);
    if (h.metaLength > limits.maxMetaBytes || h.bodyLength > bodyLimit || h.rawLength > bodyLimit)
      throw Error(ErrorCode::LimitExceeded,
                  fmt::format("{} record #{} at byte {} has a {}-byte meta and a {}-byte body ({} decoded); the limits "
                              "are {} and {}",
                              recordTypeName(h.type), h.sequence, offset, h.metaLength, h.bodyLength, h.rawLength,
                              limits.maxMetaBytes, bodyLimit));
    if (h.totalLength() > size - offset)
      throw Error(ErrorCode::Truncated,
                  fmt::format("{} record #{} at byte {} needs {} bytes but the file ends at byte {}",
                              recordTypeName(h.type), h.sequence, offset, h.totalLength(), size));
    BundleReader::RawRecord r;
    r.header = h;
    r.meta.resize(h.metaLength);
    file.preadExact(r.meta.data(), h.metaLength, offset + kRecordHeaderSize);
    if (hash64(r.meta.data(), r.meta.size()) != h.metaHash)
      throw Error(ErrorCode::Corrupt, fmt::format("meta checksum mismatch in {} record #{} at byte {}",
                                                  recordTypeName(h.type), h.sequence, offset),
                  "run `crashcap verify` for details and `crashcap recover` for a repaired copy");
    std::vector<uint8_t> stored(h.bodyLength);
    file.preadExact(stored.data(), h.bodyLength, offset + kRecordHeaderSize + h.metaLength);
    if (hash64(stored.data(), stored.size()) != h.bodyHash)
      throw Error(ErrorCode::Corrupt,
                  fmt::format("body checksum mismatch in {} record #{} at byte {} (body bytes {}..{})",
                              recordTypeName(h.type), h.sequence, offset, offset + kRecordHeaderSize + h.metaLength,
                              offset + h.totalLength()),
                  "run `crashcap verify` for details and `crashcap recover` for a repaired copy");
    if (!decodeBody || h.codec() == Codec::None) {
      r.body = std::move(stored);
    } else {
      r.body.resize(h.rawLength);
      detail::Decompressor d(limits.zstdWindowLogMax);
      auto problem = d.decompress(stored.data(), stored.size(), r.body.data(), r.body.size());
      if (!problem.empty())
        throw Error(ErrorCode::Corrupt, fmt::format("{} record #{} at byte {}: {}", recordTypeName(h.type),
                                                    h.sequence, offset, problem));
    }
    return r;
  }

  void addTensor(TensorInfo t) {
    if (byName.count(t.name)) {
      report.notices.push_back(fmt::format("a second tensor named '{}' (id {}) was ignored", t.name, t.id));
      return;
    }
    byName[t.name] = tensors.size();
    tensors.push_back(std::move(t));
  }

  void noteUnknown(uint16_t type, uint16_t flags, uint64_t offset) {
    if (flags & kFlagRequired)
      throw Error(ErrorCode::IncompatibleVersion,
                  fmt::format("record at byte {} has type {} which this crashcap ({}) does not know and which is marked "
                              "required",
                              offset, type, CRASHCAP_VERSION),
                  "the bundle was made by a newer crashcap; upgrade to read it");
    report.unknownTypes[type]++;
  }

  /// The fast path: footer -> index. Throws Error when anything does not check out.
  void loadIndexed(const Footer& footer) {
    uint64_t size = file.size();
    uint64_t indexOffset = footer.indexOffset;
    if (indexOffset < kFileHeaderSize || indexOffset > size - kFooterSize - kRecordHeaderSize)
      throw Error(ErrorCode::Corrupt, fmt::format("footer points at an index at byte {} outside the file", indexOffset));
    auto rec = withContext("while reading the index", [&] { return read(indexOffset); });
    if (rec.header.type != static_cast<uint16_t>(RecordType::Index))
      throw Error(ErrorCode::Corrupt, fmt::format("footer points at a {} record, not the index",
                                                  recordTypeName(rec.header.type)));
    if (indexOffset + rec.header.totalLength() != size - kFooterSize)
      throw Error(ErrorCode::Corrupt, fmt::format("{} bytes lie between the index and the footer",
                                                  size - kFooterSize - indexOffset - rec.header.totalLength()));
    auto [recordCount, tensorCount] =
        detail::decodeIndexInfo(rec.meta.data(), rec.meta.size(), limits);
    auto index = detail::decodeIndex(rec.body.data(), rec.body.size(), kFileHeaderSize, indexOffset, limits);
    if (recordCount != index.records.size() || footer.recordCount != index.records.size() ||
        tensorCount != index.tensors.size())
      throw Error(ErrorCode::Corrupt,
                  fmt::format("index lists {} records and {} tensors; its header says {} and {}, the footer {} records",
                              index.records.size(), index.tensors.size(), recordCount, tensorCount,
                              footer.recordCount));
    std::unordered_set<uint64_t> chunkOffsets;
    for (const auto& e : index.records) {
      switch (static_cast<RecordType>(e.type)) {
        case RecordType::TensorChunk:
          chunkOffsets.insert(e.offset);
          break;
        case RecordType::RecordingInfo:
        case RecordType::Note:
        case RecordType::Environment:
          lazyMetas.push_back(e);  // decoded on first use: opening touches only footer and index
          break;
        case RecordType::Index:
          throw Error(ErrorCode::Corrupt, fmt::format("index lists a second index at byte {}", e.offset));
        default: {
          if (isRecorderRecord(e.type)) break;  // decoded on demand (records.hpp)
          uint8_t head[kRecordHeaderSize];
          file.preadExact(head, kRecordHeaderSize, e.offset);
          auto check = decodeRecordHeader(head);
          noteUnknown(e.type, check.header ? check.header->flags : 0, e.offset);
        }
      }
    }
    for (auto& t : index.tensors) {
      for (uint64_t off : t.chunkRecords)
        if (!chunkOffsets.count(off))
          throw Error(ErrorCode::Corrupt,
                      fmt::format("index places a chunk of tensor '{}' at byte {}, where no tensor_chunk record is",
                                  t.name, off));
      if (byName.count(t.name))
        throw Error(ErrorCode::Corrupt, fmt::format("index lists tensor '{}' twice", t.name));
      addTensor(std::move(t));
    }
    records = std::move(index.records);
    report.sealed = true;
    report.recordsRecovered = records.size();
    report.usableBytes = size;
  }

  void loadScanned(uint64_t end, const Progress& progress) {
    report.scanned = true;
    std::vector<uint64_t> sequences;
    struct Group {
      detail::ChunkMeta first;
      struct Found {
        uint64_t offset;
        uint64_t bodyLength;
        detail::ChunkMeta meta;
      };
      std::map<uint32_t, Found> chunks;  // by chunk index; never sized by the untrusted count
      uint64_t order = 0;
    };
    std::unordered_map<uint64_t, Group> groups;
    uint64_t groupOrder = 0;
    auto damaged = [&](uint64_t offset, uint64_t length, std::string what) {
      report.damage.push_back({offset, length, std::move(what)});
    };
    detail::ScanOptions options;
    options.end = end;
    options.progress = progress;
    auto result = detail::scanRecords(
        file, limits, options,
        [&](detail::ScannedRecord& rec) {
          const auto& h = rec.header;
          try {
            switch (static_cast<RecordType>(h.type)) {
              case RecordType::RecordingInfo:
                info = detail::decodeRecordingInfo(rec.meta.data(), rec.meta.size(), limits);
                break;
              case RecordType::Note:
                notes.push_back(detail::decodeNote(rec.meta.data(), rec.meta.size(), limits));
                break;
              case RecordType::Environment:
                environment = detail::decodeEnvironment(rec.meta.data(), rec.meta.size(), limits);
                break;
              case RecordType::Index:
                break;  // rebuilt from the records themselves
              case RecordType::TensorChunk: {
                auto c = detail::decodeChunk(rec.meta.data(), rec.meta.size(), h.rawLength, limits);
                auto it = groups.find(c.tensorId);
                if (it == groups.end()) {
                  Group g;
                  g.first = c;
                  g.order = groupOrder++;
                  it = groups.emplace(c.tensorId, std::move(g)).first;
                }
                auto& g = it->second;
                if (!detail::sameTensor(g.first, c)) {
                  damaged(rec.offset, h.totalLength(),
                          fmt::format("tensor_chunk record #{} claims tensor id {} but its descriptor ('{}' {} {}) "
                                      "differs from that tensor's first chunk ('{}' {} {})",
                                      h.sequence, c.tensorId, c.name, dtypeName(c.dtype), formatShape(c.shape),
                                      g.first.name, dtypeName(g.first.dtype), formatShape(g.first.shape)));
                  return;
                }
                if (g.chunks.count(c.chunkIndex)) {
                  report.notices.push_back(fmt::format("duplicate chunk {} of tensor '{}' at byte {} ignored",
                                                       c.chunkIndex, c.name, rec.offset));
                  return;
                }
                uint32_t index = c.chunkIndex;
                g.chunks.emplace(index, Group::Found{rec.offset, h.bodyLength, std::move(c)});
                break;
              }
              default:
                if (isRecorderRecord(h.type))
                  validateRecorderMeta(h.type, rec.meta.data(), rec.meta.size(), limits);
                else
                  noteUnknown(h.type, h.flags, rec.offset);
            }
          } catch (const Error& e) {
            if (e.code() == ErrorCode::IncompatibleVersion) throw;
            damaged(rec.offset, h.totalLength(),
                    fmt::format("{} record #{}: {}", recordTypeName(h.type), h.sequence, e.message()));
            return;
          }
          if (h.type != static_cast<uint16_t>(RecordType::Index)) {
            records.push_back({rec.offset, h.type, h.sequence, h.totalLength()});
            sequences.push_back(h.sequence);
          }
        },
        [&](const detail::ScanDamage& d) { damaged(d.offset, d.length, d.what); });

    report.truncatedAt = result.truncatedAt;
    report.usableBytes = result.usableEnd;
    report.recordsRecovered = records.size();
    if (result.truncatedAt) {
      std::string what = "the incomplete record there";
      if (result.truncatedHeader) {
        const auto& h = *result.truncatedHeader;
        what = fmt::format("the file ends inside {} record #{} at byte {} ({} of its {} bytes present)",
                           recordTypeName(h.type), h.sequence, *result.truncatedAt, end - *result.truncatedAt,
                           h.totalLength());
        if (h.type == static_cast<uint16_t>(RecordType::TensorChunk) && !result.truncatedMeta.empty()) {
          try {
            auto c = detail::decodeChunk(result.truncatedMeta.data(), result.truncatedMeta.size(), h.rawLength, limits);
            what += fmt::format(": tensor '{}' chunk {} of {}", c.name, c.chunkIndex, c.chunkCount);
            if (!groups.count(c.tensorId)) report.lostTensors.push_back({c.name, 0, c.chunkCount});
          } catch (const Error&) {
          }
        }
        report.notices.push_back(what);
      } else {
        report.notices.push_back(fmt::format("the file ends {} bytes into a record header at byte {}",
                                             end - *result.truncatedAt, *result.truncatedAt));
      }
    }

    // Sequence gaps say how many records were lost in damaged ranges or at the end.
    std::sort(sequences.begin(), sequences.end());
    uint64_t expect = 0;
    for (uint64_t s : sequences) {
      if (s > expect) {
        report.missingSequenceCount += s - expect;
        for (uint64_t m = expect; m < s && report.missingSequences.size() < 100; ++m)
          report.missingSequences.push_back(m);
      }
      expect = std::max(expect, s + 1);
    }

    std::vector<std::pair<uint64_t, Group*>> ordered;
    for (auto& [id, g] : groups) ordered.emplace_back(g.order, &g);
    std::sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [order, g] : ordered) {
      uint32_t found = 0;
      bool tiles = true;
      uint64_t next = 0, stored = 0;
      TensorInfo t;
      uint32_t expectIndex = 0;
      for (const auto& [index, c] : g->chunks) {
        ++found;
        if (index != expectIndex++ || c.meta.offset != next) tiles = false;
        next = c.meta.offset + c.meta.length;
        stored += c.bodyLength;
        t.chunkRecords.push_back(c.offset);
      }
      if (!tiles || next != g->first.totalBytes || found != g->first.chunkCount) {
        report.lostTensors.push_back({g->first.name, found, g->first.chunkCount});
        continue;
      }
      t.id = g->first.tensorId;
      t.name = g->first.name;
      t.dtype = g->first.dtype;
      t.shape = g->first.shape;
      t.totalBytes = g->first.totalBytes;
      t.storedBytes = stored;
      addTensor(std::move(t));
    }
  }
};

BundleReader::BundleReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BundleReader::~BundleReader() = default;

std::unique_ptr<BundleReader::Impl> BundleReader::load(std::unique_ptr<Impl> m, const ReaderLimits& limits,
                                                      bool useIndex, const Progress& progress) {
  const std::string& path = m->file.path();
  m->limits = limits;
  uint64_t size = m->file.size();
  m->report.fileSize = size;
  if (size == 0)
    throw Error(ErrorCode::NotABundle, fmt::format("{} is empty (0 bytes), not a crashcap bundle", path));
  uint8_t head[kFileHeaderSize] = {};
  uint64_t got = m->file.preadSome(head, kFileHeaderSize, 0);
  size_t magicBytes = std::min<size_t>(got, kMagic.size());
  if (std::memcmp(head, kMagic.data(), magicBytes) != 0 && !detail::recordFollowsFileHeader(m->file)) {
    try {
      decodeFileHeader(head);  // builds the message that shows the bytes found
    } catch (Error& e) {
      throw e.with("while opening " + path);
    }
  }
  if (got < kFileHeaderSize) {
    m->report.scanned = true;
    m->report.whyScanned = "the file ends inside the file header";
    m->report.truncatedAt = got;
    m->report.fileHeaderDamaged = true;
    m->report.notices.push_back(
        fmt::format("truncated at byte {} inside the {}-byte file header: no records", got, kFileHeaderSize));
    return m;
  }
  try {
    m->header = decodeFileHeader(head);
  } catch (const Error& e) {
    // Reaching here with a bad magic means an intact record follows: a damaged bundle.
    if (e.code() != ErrorCode::Corrupt && e.code() != ErrorCode::NotABundle) throw;
    m->report.fileHeaderDamaged = true;
    m->report.notices.push_back("file header damaged (" + e.message() +
                                "); an intact record follows it, so the records are read anyway");
  }
  if (!m->report.fileHeaderDamaged && m->header.formatMajor != kFormatMajor)
    throw Error(ErrorCode::IncompatibleVersion,
                fmt::format("{} was made by an incompatible crashcap: bundle format {}.{}, this crashcap ({}) reads "
                            "format {}.x",
                            path, m->header.formatMajor, m->header.formatMinor, CRASHCAP_VERSION, kFormatMajor),
                m->header.formatMajor > kFormatMajor ? "upgrade crashcap to read it"
                                                     : "use the older crashcap that wrote it");

  uint64_t scanEnd = size;
  if (size >= kFileHeaderSize + kRecordHeaderSize + kFooterSize) {
    uint8_t foot[kFooterSize];
    m->file.preadExact(foot, kFooterSize, size - kFooterSize);
    auto fc = decodeFooter(foot);
    if (fc.footer) {
      scanEnd = size - kFooterSize;
      m->report.footerPresent = true;
      if (useIndex) {
        try {
          m->loadIndexed(*fc.footer);
          return m;
        } catch (const Error& e) {
          if (e.code() == ErrorCode::IncompatibleVersion || e.code() == ErrorCode::Io) throw;
          m->reset();
          bool headerDamaged = m->report.fileHeaderDamaged;
          auto notices = std::move(m->report.notices);
          m->report = OpenReport{};
          m->report.fileSize = size;
          m->report.fileHeaderDamaged = headerDamaged;
          m->report.notices = std::move(notices);
          m->report.footerPresent = true;
          m->report.whyScanned = "index unusable: " + e.message();
        }
      } else {
        m->report.whyScanned = "scan requested";
      }
    } else {
      m->report.whyScanned = "no valid footer (crash during recording, or the end of the file is damaged)";
    }
  } else {
    m->report.whyScanned = "too short for a footer";
  }
  m->loadScanned(scanEnd, progress);
  if (scanEnd != size && !m->report.truncatedAt) m->report.usableBytes = size;
  return m;
}

std::unique_ptr<BundleReader> BundleReader::open(const std::string& path, const ReaderLimits& limits,
                                                 const Progress& progress) {
  auto m = std::make_unique<Impl>();
  m->file = detail::File::openRead(path);
  return std::unique_ptr<BundleReader>(new BundleReader(load(std::move(m), limits, true, progress)));
}

std::unique_ptr<BundleReader> BundleReader::scan(const std::string& path, const ReaderLimits& limits,
                                                 const Progress& progress) {
  auto m = std::make_unique<Impl>();
  m->file = detail::File::openRead(path);
  return std::unique_ptr<BundleReader>(new BundleReader(load(std::move(m), limits, false, progress)));
}

std::unique_ptr<BundleReader> BundleReader::openBytes(std::vector<uint8_t> bytes, const std::string& name,
                                                      const ReaderLimits& limits) {
  auto m = std::make_unique<Impl>();
  m->memory = std::move(bytes);
  m->file = detail::File::inMemory(m->memory.data(), m->memory.size(), name);
  return std::unique_ptr<BundleReader>(new BundleReader(load(std::move(m), limits, true, {})));
}

std::unique_ptr<BundleReader> BundleReader::scanBytes(std::vector<uint8_t> bytes, const std::string& name,
                                                      const ReaderLimits& limits) {
  auto m = std::make_unique<Impl>();
  m->memory = std::move(bytes);
  m->file = detail::File::inMemory(m->memory.data(), m->memory.size(), name);
  return std::unique_ptr<BundleReader>(new BundleReader(load(std::move(m), limits, false, {})));
}

const std::string& BundleReader::path() const { return impl_->file.path(); }
const FileHeader& BundleReader::fileHeader() const { return impl_->header; }
const OpenReport& BundleReader::report() const {
  impl_->loadLazyMetas();  // so the report includes damage found in those records
  return impl_->report;
}
const ReaderLimits& BundleReader::limits() const { return impl_->limits; }
std::optional<RecordingInfoData> BundleReader::recordingInfo() const {
  impl_->loadLazyMetas();
  return impl_->info;
}
const std::vector<NoteData>& BundleReader::notes() const {
  impl_->loadLazyMetas();
  return impl_->notes;
}
std::optional<EnvironmentData> BundleReader::environment() const {
  impl_->loadLazyMetas();
  return impl_->environment;
}
const std::vector<RecordEntry>& BundleReader::records() const { return impl_->records; }
const std::vector<TensorInfo>& BundleReader::tensors() const { return impl_->tensors; }

const TensorInfo* BundleReader::find(const std::string& name) const {
  auto it = impl_->byName.find(name);
  return it == impl_->byName.end() ? nullptr : &impl_->tensors[it->second];
}

const TensorInfo& BundleReader::get(const std::string& name) const {
  if (const auto* t = find(name)) return *t;
  std::vector<std::string> close;
  for (const auto& t : impl_->tensors) {
    if (close.size() >= 5) break;
    auto slash = name.rfind('/');
    std::string leaf = slash == std::string::npos ? name : name.substr(slash + 1);
    if (t.name.find(leaf) != std::string::npos || name.find(t.name) != std::string::npos) close.push_back(t.name);
  }
  std::string hint = close.empty() ? "run `crashcap ls` to list the tensors"
                                   : fmt::format("did you mean {}?", fmt::join(close, ", "));
  throw Error(ErrorCode::NotFound,
              fmt::format("no tensor named '{}' in {} ({} tensors)", name, impl_->file.path(), impl_->tensors.size()),
              hint);
}

BundleReader::RawRecord BundleReader::readRecord(uint64_t offset) const { return impl_->read(offset); }
BundleReader::RawRecord BundleReader::readStoredRecord(uint64_t offset) const { return impl_->read(offset, false); }

void BundleReader::readTensor(const TensorInfo& t, void* out, uint64_t outSize) const {
  const auto& m = *impl_;
  if (outSize != t.totalBytes)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("tensor '{}' has {} bytes; the buffer has {}", t.name, t.totalBytes, outSize));
  if (t.totalBytes > m.limits.maxTensorBytes)
    throw Error(ErrorCode::LimitExceeded,
                fmt::format("tensor '{}' is {} bytes; the reader's limit is {}", t.name, t.totalBytes,
                            m.limits.maxTensorBytes),
                "raise the limit (--max-tensor-bytes) if you trust the bundle and have the memory");
  auto* dst = static_cast<uint8_t*>(out);
  detail::Decompressor dec(m.limits.zstdWindowLogMax);
  std::vector<uint8_t> scratch;
  uint64_t next = 0;
  const uint32_t count = uint32_t(t.chunkRecords.size());
  for (uint32_t i = 0; i < count; ++i) {
    try {
      uint64_t offset = t.chunkRecords[i];
      auto r = m.read(offset, false);
      if (r.header.type != static_cast<uint16_t>(RecordType::TensorChunk))
        throw Error(ErrorCode::Corrupt, fmt::format("record at byte {} is {}, not a tensor_chunk", offset,
                                                    recordTypeName(r.header.type)));
      auto c = detail::decodeChunk(r.meta.data(), r.meta.size(), r.header.rawLength, m.limits);
      if (c.tensorId != t.id || c.name != t.name || c.dtype != t.dtype || c.shape != t.shape ||
          c.totalBytes != t.totalBytes || c.chunkCount != count || c.chunkIndex != i || c.offset != next)
        throw Error(ErrorCode::Corrupt,
                    fmt::format("chunk record at byte {} describes '{}' chunk {}/{} at tensor byte {}, expected '{}' "
                                "chunk {}/{} at byte {}",
                                offset, c.name, c.chunkIndex, c.chunkCount, c.offset, t.name, i, count, next));
      uint8_t* target = dst + c.offset;
      if (r.header.codec() == Codec::None) {
        if (c.shuffle) detail::unshuffleBytes(r.body.data(), target, c.length, c.shuffle);
        else if (c.length) std::memcpy(target, r.body.data(), c.length);
      } else {
        uint8_t* into = target;
        if (c.shuffle) {
          scratch.resize(c.length);
          into = scratch.data();
        }
        auto problem = dec.decompress(r.body.data(), r.body.size(), into, c.length);
        if (!problem.empty())
          throw Error(ErrorCode::Corrupt, fmt::format("chunk record at byte {}: {}", offset, problem));
        if (c.shuffle) detail::unshuffleBytes(scratch.data(), target, c.length, c.shuffle);
      }
      next += c.length;
    } catch (Error& e) {
      // The frame is formatted only on failure: a tensor of many chunks reads without it.
      e.with(fmt::format("while reading tensor '{}' chunk {} of {}", t.name, i, count));
      throw;
    }
  }
  if (next != t.totalBytes)
    throw Error(ErrorCode::Corrupt,
                fmt::format("tensor '{}' chunks cover {} of its {} bytes", t.name, next, t.totalBytes));
}

std::vector<uint8_t> BundleReader::readTensor(const TensorInfo& t) const {
  if (t.totalBytes > impl_->limits.maxTensorBytes)
    throw Error(ErrorCode::LimitExceeded,
                fmt::format("tensor '{}' is {} bytes; the reader's limit is {}", t.name, t.totalBytes,
                            impl_->limits.maxTensorBytes),
                "raise the limit (--max-tensor-bytes) if you trust the bundle and have the memory");
  std::vector<uint8_t> out(t.totalBytes);
  readTensor(t, out.data(), out.size());
  return out;
}

}  // namespace crashcap::formats
