#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/records.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "codec.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "file_io.hpp"
#include "meta.hpp"
#include "scanner.hpp"

namespace crashcap::formats {
namespace {

std::string recordLabel(const RecordHeader& h, uint64_t offset, const std::string& detail = {}) {
  return fmt::format("record #{} ({}{}) at byte {}", h.sequence, recordTypeName(h.type),
                     detail.empty() ? "" : " " + detail, offset);
}

/// verifyBundle on an open file (on disk or in memory).
VerifyReport verifyFile(const detail::File& file, const ReaderLimits& limits, const Progress& progress) {
  const std::string& path = file.path();
  VerifyReport report;
  uint64_t size = file.size();
  report.fileSize = size;
  if (size == 0) throw Error(ErrorCode::NotABundle, fmt::format("{} is empty (0 bytes), not a crashcap bundle", path));
  uint8_t head[kFileHeaderSize] = {};
  uint64_t got = file.preadSome(head, kFileHeaderSize, 0);
  if (std::memcmp(head, kMagic.data(), std::min<size_t>(got, kMagic.size())) != 0 &&
      !detail::recordFollowsFileHeader(file))
    decodeFileHeader(head);  // throws NotABundle showing the bytes found
  auto problem = [&](uint64_t offset, uint64_t length, std::string where, std::string what) {
    report.problems.push_back({offset, length, std::move(where), std::move(what)});
  };
  if (got < kFileHeaderSize) {
    problem(0, got, "file header", fmt::format("the file ends at byte {}, inside the {}-byte file header", got,
                                               kFileHeaderSize));
    return report;
  }
  try {
    auto h = decodeFileHeader(head);
    if (h.formatMajor != kFormatMajor)
      problem(0, kFileHeaderSize, "file header",
              fmt::format("format version {}.{}; this crashcap reads {}.x", h.formatMajor, h.formatMinor, kFormatMajor));
  } catch (const Error& e) {
    // We only get here with a bad magic when an intact record follows: the magic is damaged.
    problem(0, kFileHeaderSize, "file header",
            e.code() == ErrorCode::NotABundle ? "damaged magic: " + e.message() : e.message());
  }
  report.bytesChecked += kFileHeaderSize;

  std::optional<Footer> footer;
  uint64_t scanEnd = size;
  if (size >= kFileHeaderSize + kFooterSize) {
    uint8_t foot[kFooterSize];
    file.preadExact(foot, kFooterSize, size - kFooterSize);
    auto fc = decodeFooter(foot);
    if (fc.footer) {
      footer = fc.footer;
      scanEnd = size - kFooterSize;
      report.bytesChecked += kFooterSize;
    } else {
      problem(size - kFooterSize, kFooterSize, "footer", "not sealed: " + fc.problem);
    }
  } else {
    problem(kFileHeaderSize, size - kFileHeaderSize, "footer", "not sealed: the file is too short for a footer");
  }

  struct Chunk {
    uint64_t offset;
    detail::ChunkMeta meta;
  };
  std::map<uint64_t, std::vector<Chunk>> chunksById;
  std::vector<RecordEntry> scanned;
  std::optional<std::pair<uint64_t, detail::IndexData>> index;
  std::optional<uint64_t> indexAt;
  std::vector<uint64_t> sequences;
  std::unordered_set<uint64_t> damagedAt;
  detail::Decompressor dec(limits.zstdWindowLogMax);
  std::vector<uint8_t> decoded;
  detail::ScanOptions options;
  options.end = scanEnd;
  options.keepBodies = true;
  options.progress = progress;
  auto result = detail::scanRecords(
      file, limits, options,
      [&](detail::ScannedRecord& rec) {
        const auto& h = rec.header;
        report.recordsChecked++;
        report.bytesChecked += h.totalLength();
        sequences.push_back(h.sequence);
        auto label = [&] { return recordLabel(h, rec.offset); };  // only for problems and notices
        try {
          if (h.codec() == Codec::Zstd) {
            decoded.resize(h.rawLength);
            auto p = dec.decompress(rec.body.data(), rec.body.size(), decoded.data(), decoded.size());
            if (!p.empty()) throw Error(ErrorCode::Corrupt, p);
          } else {
            decoded = std::move(rec.body);
          }
          switch (static_cast<RecordType>(h.type)) {
            case RecordType::RecordingInfo:
              detail::decodeRecordingInfo(rec.meta.data(), rec.meta.size(), limits);
              break;
            case RecordType::Note:
              detail::decodeNote(rec.meta.data(), rec.meta.size(), limits);
              break;
            case RecordType::Environment:
              detail::decodeEnvironment(rec.meta.data(), rec.meta.size(), limits);
              break;
            case RecordType::TensorChunk: {
              auto c = detail::decodeChunk(rec.meta.data(), rec.meta.size(), h.rawLength, limits);
              chunksById[c.tensorId].push_back({rec.offset, std::move(c)});
              break;
            }
            case RecordType::Index: {
              indexAt = rec.offset;
              auto counts = detail::decodeIndexInfo(rec.meta.data(), rec.meta.size(), limits);
              auto idx = detail::decodeIndex(decoded.data(), decoded.size(), kFileHeaderSize, rec.offset, limits);
              if (counts.first != idx.records.size() || counts.second != idx.tensors.size())
                throw Error(ErrorCode::Corrupt,
                            fmt::format("index lists {} records and {} tensors; its meta says {} and {}",
                                        idx.records.size(), idx.tensors.size(), counts.first, counts.second));
              index.emplace(rec.offset, std::move(idx));
              return;
            }
            default:
              if (isRecorderRecord(h.type)) {
                validateRecorderMeta(h.type, rec.meta.data(), rec.meta.size(), limits);
                break;
              }
              if (h.flags & kFlagRequired)
                throw Error(ErrorCode::IncompatibleVersion,
                            fmt::format("unknown record type {} is marked required: this crashcap cannot read the "
                                        "bundle (made by a newer version?)",
                                        h.type));
              report.notices.push_back(fmt::format("{}: unknown record type {} skipped", label(), h.type));
          }
          scanned.push_back({rec.offset, h.type, h.sequence, h.totalLength()});
        } catch (const Error& e) {
          problem(rec.offset, h.totalLength(), label(), e.message());
          scanned.push_back({rec.offset, h.type, h.sequence, h.totalLength()});
          damagedAt.insert(rec.offset);
        }
      },
      [&](const detail::ScanDamage& d) {
        std::string where = d.header ? recordLabel(*d.header, d.offset)
                                     : fmt::format("bytes {}..{}", d.offset, d.offset + d.length);
        if (d.header) {
          // Its header is intact, so the index may list it: compare it like any record
          // instead of reporting the same damage again as an index mismatch.
          sequences.push_back(d.header->sequence);
          scanned.push_back({d.offset, d.header->type, d.header->sequence, d.header->totalLength()});
        }
        damagedAt.insert(d.offset);
        problem(d.offset, d.length, where, d.what);
      });
  if (result.truncatedAt) {
    std::string where = result.truncatedHeader ? recordLabel(*result.truncatedHeader, *result.truncatedAt)
                                               : fmt::format("bytes {}..{}", *result.truncatedAt, scanEnd);
    problem(*result.truncatedAt, scanEnd - *result.truncatedAt, where,
            fmt::format("truncated: the file ends at byte {} inside this record", scanEnd));
  }

  std::sort(sequences.begin(), sequences.end());
  uint64_t expect = 0;
  for (uint64_t s : sequences) {
    if (s > expect)
      problem(0, 0, "record sequence",
              s - expect == 1 ? fmt::format("record #{} is missing", expect)
                              : fmt::format("records #{}..#{} are missing", expect, s - 1));
    else if (s < expect)
      problem(0, 0, "record sequence", fmt::format("record #{} appears twice", s));
    expect = std::max(expect, s + 1);
  }

  // Tensors: chunks of one id must agree and tile their bytes exactly.
  std::unordered_map<std::string, uint64_t> names;
  std::map<std::string, const detail::ChunkMeta*> complete;  // tensors whose chunks tile them
  std::map<std::string, std::vector<uint64_t>> tensorChunks;
  for (auto& [id, chunks] : chunksById) {
    std::sort(chunks.begin(), chunks.end(), [](const Chunk& a, const Chunk& b) {
      return a.meta.chunkIndex < b.meta.chunkIndex;
    });
    const auto& first = chunks.front().meta;
    std::string where = fmt::format("tensor '{}' (id {})", first.name, id);
    uint64_t next = 0;
    bool ok = true;
    for (size_t i = 0; i < chunks.size(); ++i) {
      const auto& c = chunks[i].meta;
      if (!detail::sameTensor(first, c)) {
        problem(chunks[i].offset, 0, where, fmt::format("chunk {} describes a different tensor", c.chunkIndex));
        ok = false;
      } else if (c.chunkIndex != i || c.offset != next) {
        problem(chunks[i].offset, 0, where,
                fmt::format("chunk {} at tensor byte {} does not follow the previous chunk (expected chunk {} at "
                            "byte {})",
                            c.chunkIndex, c.offset, i, next));
        ok = false;
        break;
      }
      next = c.offset + c.length;
    }
    if (ok && (chunks.size() != first.chunkCount || next != first.totalBytes))
      problem(chunks.back().offset, 0, where,
              fmt::format("incomplete: {} of {} chunks, {} of {} bytes", chunks.size(), first.chunkCount, next,
                          first.totalBytes));
    if (names.count(first.name))
      problem(chunks.front().offset, 0, where, "another tensor has the same name");
    names[first.name] = id;
    for (const auto& c : chunks) tensorChunks[first.name].push_back(c.offset);
    if (ok && chunks.size() == first.chunkCount && next == first.totalBytes) complete[first.name] = &first;
    report.tensorsChecked++;
  }

  // The index must describe exactly the records and tensors found.
  const size_t problemsBeforeIndex = report.problems.size();
  if (footer) {
    if (!indexAt || *indexAt != footer->indexOffset) {
      problem(footer->indexOffset, 0, "index",
              fmt::format("the footer points at an index at byte {}, but no intact index record is there",
                          footer->indexOffset));
    } else if (index) {
      const auto& idx = index->second;
      if (idx.records.size() != scanned.size() || footer->recordCount != idx.records.size())
        problem(*indexAt, 0, "index",
                fmt::format("lists {} records (footer: {}); {} intact records were found", idx.records.size(),
                            footer->recordCount, scanned.size()));
      for (size_t i = 0; i < std::min(idx.records.size(), scanned.size()); ++i) {
        const auto& a = idx.records[i];
        const auto& b = scanned[i];
        if (a.offset != b.offset || a.type != b.type || a.sequence != b.sequence || a.length != b.length) {
          problem(*indexAt, 0, "index",
                  fmt::format("entry {} says record #{} ({}) at byte {}, the file has record #{} ({}) there", i,
                              a.sequence, recordTypeName(a.type), a.offset, b.sequence, recordTypeName(b.type)));
          break;
        }
      }
      for (const auto& t : idx.tensors) {
        bool alreadyReported = std::any_of(t.chunkRecords.begin(), t.chunkRecords.end(),
                                           [&](uint64_t off) { return damagedAt.count(off) > 0; });
        if (alreadyReported) continue;
        auto it = tensorChunks.find(t.name);
        auto c = complete.find(t.name);
        if (it == tensorChunks.end() || it->second != t.chunkRecords)
          problem(*indexAt, 0, "index",
                  fmt::format("entry for tensor '{}' lists {} chunk records; the file has {} for it", t.name,
                              t.chunkRecords.size(), it == tensorChunks.end() ? 0 : it->second.size()));
        else if (c == complete.end() || c->second->dtype != t.dtype || c->second->shape != t.shape ||
                 c->second->totalBytes != t.totalBytes)
          problem(*indexAt, 0, "index",
                  fmt::format("entry for tensor '{}' says {} {}; its chunks say otherwise", t.name,
                              dtypeName(t.dtype), formatShape(t.shape)));
      }
      // Every complete tensor must be in the index, or opening the bundle would hide it.
      std::unordered_set<std::string> listed;
      for (const auto& t : idx.tensors) listed.insert(t.name);
      for (const auto& [name, meta] : complete)
        if (!listed.count(name))
          problem(*indexAt, 0, "index", fmt::format("tensor '{}' is complete in the file but missing from the index",
                                                    name));
    }
    report.sealed = index && indexAt && *indexAt == footer->indexOffset && report.problems.size() == problemsBeforeIndex;
  }
  return report;
}

}  // namespace

VerifyReport verifyBundle(const std::string& path, const ReaderLimits& limits, const Progress& progress) {
  return verifyFile(detail::File::openRead(path), limits, progress);
}

VerifyReport verifyBundleBytes(const std::vector<uint8_t>& bytes, const std::string& name, const ReaderLimits& limits) {
  return verifyFile(detail::File::inMemory(bytes.data(), bytes.size(), name), limits, {});
}

PartialOutput::PartialOutput(std::string out) : out_(std::move(out)), partial_(out_ + ".partial") {}

PartialOutput::~PartialOutput() {
  if (!committed_) std::remove(partial_.c_str());
}

void PartialOutput::commit() {
  if (std::rename(partial_.c_str(), out_.c_str()) != 0)
    throw Error(ErrorCode::Io, fmt::format("cannot rename {} to {}: {}", partial_, out_, std::strerror(errno)));
  committed_ = true;
  auto slash = out_.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : out_.substr(0, slash));
  if (int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY); fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

CopyReport copyRecords(const BundleReader& reader, BundleWriter& writer,
                       const std::function<bool(const RecordEntry&)>& keep, bool decodeChunks,
                       const std::function<bool(const TensorInfo&)>& keepTensor) {
  CopyReport report;
  // Records whose checksums hold can still fail to decode (a body that is no zstd frame):
  // decode every record first and drop tensors that have such a chunk.
  std::unordered_set<uint64_t> leftOut;  // chunks of the tensors keepTensor rejected
  if (keepTensor)
    for (const auto& t : reader.tensors())
      if (!keepTensor(t))
        leftOut.insert(t.chunkRecords.begin(), t.chunkRecords.end());
  std::unordered_map<uint64_t, std::string> undecodable;
  for (const auto& r : reader.records()) {
    if (!decodeChunks && r.type == static_cast<uint16_t>(RecordType::TensorChunk)) continue;
    if (leftOut.count(r.offset)) continue;
    try {
      (void)reader.readRecord(r.offset);
    } catch (const Error& e) {
      undecodable[r.offset] = e.message();
    }
  }
  std::unordered_map<uint64_t, const TensorInfo*> chunkOwner;
  for (const auto& t : reader.tensors()) {
    if (keepTensor && !keepTensor(t)) continue;
    bool ok = std::none_of(t.chunkRecords.begin(), t.chunkRecords.end(),
                           [&](uint64_t off) { return undecodable.count(off) > 0; });
    if (!ok) {
      report.lines.push_back(fmt::format("tensor '{}' dropped: a chunk does not decode", t.name));
      continue;
    }
    for (uint64_t off : t.chunkRecords) chunkOwner[off] = &t;
  }
  std::unordered_map<uint64_t, uint64_t> moved;
  for (const auto& r : reader.records()) {
    bool isChunk = r.type == static_cast<uint16_t>(RecordType::TensorChunk);
    if (isChunk && leftOut.count(r.offset)) continue;
    if ((isChunk && !chunkOwner.count(r.offset)) || undecodable.count(r.offset)) {
      ++report.recordsSkipped;
      continue;
    }
    if (!isChunk && keep && !keep(r)) continue;
    // Every record here passed its checks when the reader opened the bundle (or just above):
    // one failing now means the file changed underneath.
    BundleReader::RawRecord raw;
    try {
      raw = reader.readStoredRecord(r.offset);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::Io) throw;
      throw Error(ErrorCode::Io,
                  fmt::format("{} changed while it was being copied (record at byte {}: {})", reader.path(), r.offset,
                              e.message()),
                  "copy from a file nothing else writes to");
    }
    moved[r.offset] = writer.copyRecord(raw.header, raw.meta, raw.body);
    report.recordsCopied++;
  }
  for (const auto& t : reader.tensors()) {
    bool all = std::all_of(t.chunkRecords.begin(), t.chunkRecords.end(),
                           [&](uint64_t off) { return moved.count(off) > 0; });
    if (!all) continue;
    TensorInfo copy = t;
    for (auto& off : copy.chunkRecords) off = moved.at(off);
    writer.indexTensor(copy);
    report.tensorsCopied++;
  }
  for (const auto& [off, why] : undecodable) report.lines.push_back(fmt::format("record at byte {} dropped: {}", off, why));
  return report;
}

RecoverReport recoverBundle(const std::string& in, const std::string& out, const ReaderLimits& limits,
                            const Progress& progress) {
  struct stat a, b;
  if (stat(in.c_str(), &a) == 0 && stat(out.c_str(), &b) == 0) {
    if (a.st_dev == b.st_dev && a.st_ino == b.st_ino)
      throw Error(ErrorCode::InvalidArgument, fmt::format("{} and {} are the same file", in, out),
                  "recover never modifies the evidence file; give another output path");
    throw Error(ErrorCode::InvalidArgument, fmt::format("{} already exists", out),
                "recover never overwrites; choose another output path");
  }
  auto reader = BundleReader::scan(in, limits, progress);
  RecoverReport report;
  report.source = reader->report();

  FileHeader header = reader->fileHeader();
  if (report.source.fileHeaderDamaged) {
    header = FileHeader{};
    header.recordingId = newRecordingId();
  }
  PartialOutput output(out);
  WriterOptions options;
  options.overwrite = true;
  auto writer = BundleWriter::createCopy(output.path(), header, options);

  auto copied = copyRecords(*reader, *writer);
  report.recordsCopied = copied.recordsCopied;
  report.tensorsCopied = copied.tensorsCopied;
  std::string text = fmt::format("recovered from {}: {}", in, report.source.summary());
  if (copied.recordsSkipped)
    text += fmt::format("; {} records of incomplete or undecodable tensors dropped", copied.recordsSkipped);
  for (const auto& line : copied.lines) text += "\n" + line;
  for (const auto& n : report.source.notices) text += "\n" + n;
  for (const auto& d : report.source.damage)
    text += fmt::format("\ndamaged bytes {}..{}: {}", d.offset, d.offset + d.length, d.what);
  if (text.size() > kMaxNoteTextBytes) {
    size_t cut = kMaxNoteTextBytes - 64;
    while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;  // whole UTF-8 characters
    text = text.substr(0, cut) + fmt::format("\n... ({} more bytes; run `crashcap info` on the input)",
                                             text.size() - cut);
  }
  writer->writeNote("crashcap.recovery", text);
  writer->seal();
  report.bytesWritten = writer->stats().fileBytes;
  output.commit();
  return report;
}

}  // namespace crashcap::formats
