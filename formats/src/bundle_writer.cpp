#include "crashcap/formats/bundle_writer.hpp"

#include <unistd.h>

#include <fmt/format.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "codec.hpp"
#include "crashcap/formats/clock.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/limits.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/tensor_info.hpp"
#include "file_io.hpp"
#include "meta.hpp"

namespace crashcap::formats {

const char* toolVersion() { return CRASHCAP_VERSION; }

std::array<uint8_t, 16> newRecordingId() {
  std::random_device rd;
  std::array<uint8_t, 16> id{};
  for (size_t i = 0; i < 16; i += 4) {
    uint32_t v = rd();
    for (size_t j = 0; j < 4; ++j) id[i + j] = uint8_t(v >> (8 * j));
  }
  id[6] = uint8_t((id[6] & 0x0f) | 0x40);
  id[8] = uint8_t((id[8] & 0x3f) | 0x80);
  return id;
}

std::string formatRecordingId(const std::array<uint8_t, 16>& id) {
  std::string s;
  for (size_t i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += fmt::format("{:02x}", id[i]);
  }
  return s;
}

namespace {

/// After a chunk that did not compress, the writer tries every this-many-th chunk of the tensor.
constexpr uint64_t kChunkRetryEvery = 8;

/// A tensor's role: its name with every run of digits blanked ("steps/12/batch/image" ->
/// "steps/#/batch/image"), so that one step's image and the next one's share it.
std::string tensorRole(const std::string& name) {
  std::string role;
  role.reserve(name.size());
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] >= '0' && name[i] <= '9') {
      role += '#';
      while (i + 1 < name.size() && name[i + 1] >= '0' && name[i + 1] <= '9') ++i;
    } else {
      role += name[i];
    }
  }
  return role;
}


/// A fixed set of threads, each with its own zstd context, running chunk encodings.
class EncodePool {
 public:
  EncodePool(unsigned threads, bool forkPrivate) : forkPrivate_(forkPrivate) {
    for (unsigned i = 0; i < threads; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~EncodePool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  std::future<void> submit(std::function<void(detail::Compressor&, detail::WorkBuffer&)> job) {
    auto task = std::make_shared<std::packaged_task<void(detail::Compressor&, detail::WorkBuffer&)>>(std::move(job));
    auto fut = task->get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(task));
    }
    cv_.notify_one();
    return fut;
  }

 private:
  void loop() {
    detail::Compressor compressor(forkPrivate_);
    detail::WorkBuffer scratch(forkPrivate_);
    for (;;) {
      std::shared_ptr<std::packaged_task<void(detail::Compressor&, detail::WorkBuffer&)>> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      (*task)(compressor, scratch);
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<std::packaged_task<void(detail::Compressor&, detail::WorkBuffer&)>>> queue_;
  bool forkPrivate_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
};

}  // namespace

struct EncodeMemory::Parts {
  explicit Parts(bool fp) : forkPrivate(fp), compressor(fp), scratch(fp), encoded(fp) {}
  bool forkPrivate;
  detail::Compressor compressor;
  detail::WorkBuffer scratch;
  detail::EncodedBody encoded;
  std::vector<std::unique_ptr<detail::EncodedBody>> spareBodies;
};

EncodeMemory::EncodeMemory(bool forkPrivate) : parts_(std::make_unique<Parts>(forkPrivate)) {}

EncodeMemory::~EncodeMemory() = default;

std::shared_ptr<EncodeMemory> EncodeMemory::create(bool forkPrivate) {
  return std::shared_ptr<EncodeMemory>(new EncodeMemory(forkPrivate));
}

struct BundleWriter::Impl {
  WriterOptions options;
  detail::File file;
  FileHeader header;
  WriterStats stats;
  uint64_t offset = 0;
  uint64_t sequence = 0;
  uint64_t bytesSinceSync = 0;
  bool sealed = false;
  bool broken = false;  // a write failed: the file may end inside a record
  std::vector<RecordEntry> records;
  std::vector<TensorInfo> tensors;
  std::unordered_set<std::string> names;
  uint64_t nextTensorId = 1;
  std::shared_ptr<EncodeMemory> memory;
  detail::Compressor& compressor;
  detail::WorkBuffer& scratch;
  /// The encoded chunk or body, reused: a compressed chunk is as large as the chunk, and a fresh
  /// buffer per chunk would be mapped and unmapped each time (page faults, and TLB shootdowns on
  /// every core the process runs on).
  detail::EncodedBody& encoded;
  std::vector<std::unique_ptr<detail::EncodedBody>>& spareBodies;  ///< the same, for the encode pool's chunks
  std::unique_ptr<EncodePool> pool;

  explicit Impl(std::shared_ptr<EncodeMemory> m);
  /// Tensor roles whose last compression saved too little: how many times each was stored raw
  /// since (WriterOptions::rawRetryEvery).
  std::unordered_map<std::string, uint32_t> rawRoles;

  void checkWritable() const {
    if (sealed) throw Error(ErrorCode::InvalidArgument, fmt::format("bundle {} is already sealed", file.path()));
    if (broken)
      throw Error(ErrorCode::Io, fmt::format("an earlier write to {} failed; the writer accepts no more records",
                                             file.path()),
                  "the records written before the failure are recoverable with `crashcap recover`");
  }

  uint64_t append(uint16_t type, uint16_t flags, const std::vector<uint8_t>& meta, const detail::EncodedBody& body,
                  uint64_t rawLength) {
    if (meta.size() > kMaxMetaBytes)
      throw Error(ErrorCode::InvalidArgument,
                  fmt::format("{} meta is {} bytes; readers accept at most {}", recordTypeName(type), meta.size(),
                              kMaxMetaBytes));
    RecordHeader h;
    h.type = type;
    h.flags = uint16_t(flags | static_cast<uint16_t>(body.codec));
    h.sequence = sequence;
    h.metaLength = uint32_t(meta.size());
    h.bodyLength = body.size;
    h.rawLength = rawLength;
    h.metaHash = hash64(meta.data(), meta.size());
    h.bodyHash = hash64(body.data, body.size);
    return appendWithHeader(h, meta, body.data);
  }

  /// Writes header, meta and body in one writev; `h` must already describe them.
  uint64_t appendWithHeader(const RecordHeader& h, const std::vector<uint8_t>& meta, const void* bodyData) {
    checkWritable();
    const uint16_t type = h.type;
    const uint64_t rawLength = h.rawLength;
    const detail::EncodedBody body(h.codec(), 0, static_cast<const uint8_t*>(bodyData), h.bodyLength);
    uint8_t head[kRecordHeaderSize];
    encodeRecordHeader(h, head);
    const void* parts[3] = {head, meta.data(), body.data};
    uint64_t sizes[3] = {kRecordHeaderSize, meta.size(), body.size};
    const auto started = std::chrono::steady_clock::now();
    try {
      file.writeAll(parts, sizes, 3, offset);
    } catch (...) {
      broken = true;
      throw;
    }
    stats.writeNs += elapsedNs(started);
    uint64_t at = offset;
    offset += h.totalLength();
    sequence = std::max(sequence, h.sequence + 1);
    records.push_back({at, type, h.sequence, h.totalLength()});
    stats.records++;
    stats.rawBodyBytes += rawLength;
    stats.storedBodyBytes += body.size;
    stats.fileBytes = offset;
    bytesSinceSync += h.totalLength();
    if (options.durability.syncEveryBytes && bytesSinceSync >= options.durability.syncEveryBytes) doSync();
    return at;
  }

  static uint64_t elapsedNs(std::chrono::steady_clock::time_point since) {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since)
                        .count());
  }

  void doSync() {
    const auto started = std::chrono::steady_clock::now();
    file.datasync();
    stats.writeNs += elapsedNs(started);
    bytesSinceSync = 0;
    stats.syncs++;
  }
};

BundleWriter::Impl::Impl(std::shared_ptr<EncodeMemory> m)
    : memory(m ? std::move(m) : EncodeMemory::create(false)),
      compressor(memory->parts().compressor),
      scratch(memory->parts().scratch),
      encoded(memory->parts().encoded),
      spareBodies(memory->parts().spareBodies) {}

BundleWriter::BundleWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BundleWriter::~BundleWriter() = default;

std::unique_ptr<BundleWriter> BundleWriter::create(const std::string& path, const WriterOptions& options) {
  if (options.zstdLevel < 0 || options.zstdLevel > 19)
    throw Error(ErrorCode::InvalidArgument, fmt::format("zstd level {} is outside 0..19", options.zstdLevel));
  if (options.chunkBytes < 4096 || options.chunkBytes > (64ull << 20))
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("chunk size {} is outside 4 KiB..64 MiB", options.chunkBytes));
  if (options.compressionThreads > 64)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("{} compression threads requested; at most 64", options.compressionThreads));
  if (options.producer.size() > 1024)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("producer name is {} bytes; at most 1024", options.producer.size()));
  auto impl = std::make_unique<Impl>(options.encodeMemory);
  impl->options = options;
  impl->nextTensorId = std::max<uint64_t>(1, options.firstTensorId);
  impl->file = detail::File::create(path, options.overwrite);
  impl->header.recordingId = newRecordingId();
  impl->header.createdNs = unixTimeNs();
  if (options.compressionThreads > 0)
    impl->pool = std::make_unique<EncodePool>(options.compressionThreads, impl->memory->parts().forkPrivate);
  uint8_t head[kFileHeaderSize];
  encodeFileHeader(impl->header, head);
  const void* parts[1] = {head};
  uint64_t sizes[1] = {kFileHeaderSize};
  impl->file.writeAll(parts, sizes, 1, 0);
  impl->offset = kFileHeaderSize;
  std::unique_ptr<BundleWriter> w(new BundleWriter(std::move(impl)));

  RecordingInfoData info;
  info.producer = options.producer;
  info.toolVersion = toolVersion();
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) == 0) info.hostname = host;
  info.pid = uint32_t(getpid());
  info.createdNs = w->impl_->header.createdNs;
  detail::EncodedBody none;
  w->impl_->append(static_cast<uint16_t>(RecordType::RecordingInfo), 0, detail::encodeRecordingInfo(info), none, 0);
  return w;
}

uint64_t BundleWriter::writeTensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                                   const void* bytes, uint64_t size) {
  auto& m = *impl_;
  m.checkWritable();
  validateTensorName(name);
  uint64_t total = tensorByteSize(dtype, shape, "'" + name + "'");
  if (total != size)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("tensor '{}' of shape {} and dtype {} needs {} bytes, got {}", name, formatShape(shape),
                            dtypeName(dtype), total, size));
  if (m.names.count(name))
    throw Error(ErrorCode::InvalidArgument, fmt::format("tensor '{}' was already written to this bundle", name),
                "tensor names are unique within a bundle");

  const size_t es = elementSize(dtype);
  const uint64_t chunk = m.options.chunkBytes / es * es;
  const uint64_t count = total == 0 ? 1 : (total + chunk - 1) / chunk;
  if (count > UINT32_MAX) throw Error(ErrorCode::InvalidArgument, fmt::format("tensor '{}' needs too many chunks", name));
  const size_t shuffle = (m.options.shuffle && isFloating(dtype) && es > 1) ? es : 0;

  TensorInfo info;
  info.id = m.nextTensorId++;
  info.name = name;
  info.dtype = dtype;
  info.shape = shape;
  info.totalBytes = total;

  detail::ChunkMeta meta;
  meta.tensorId = info.id;
  meta.name = name;
  meta.dtype = dtype;
  meta.shape = shape;
  meta.totalBytes = total;
  meta.chunkCount = uint32_t(count);
  const auto* src = static_cast<const uint8_t*>(bytes);

  // A role that did not compress last time is stored raw until it is due to be tried again.
  const std::string role = tensorRole(name);
  int level = m.options.zstdLevel;
  auto raw = m.rawRoles.find(role);
  if (level > 0 && m.options.rawRetryEvery > 0 && raw != m.rawRoles.end() && ++raw->second < m.options.rawRetryEvery)
    level = 0;
  bool compressed = false;
  // Within a tensor, a chunk zstd could not shrink enough makes the writer try only every
  // kChunkRetryEvery-th chunk after it, until one compresses again: a large tensor of noise (an
  // fp32 weight matrix, an archive of them) costs a compression of a few chunks, not of all.
  bool lastTriedFailed = false;
  auto chunkLevel = [&](uint64_t i) { return lastTriedFailed && i % kChunkRetryEvery != 0 ? 0 : level; };

  auto writeChunk = [&](uint64_t i, const detail::EncodedBody& body, int triedLevel) {
    compressed = compressed || body.codec != Codec::None;
    if (triedLevel > 0) lastTriedFailed = body.codec == Codec::None;
    meta.chunkIndex = uint32_t(i);
    meta.offset = i * chunk;
    meta.length = std::min(chunk, total - meta.offset);
    meta.shuffle = body.shuffle;
    uint64_t at = m.append(static_cast<uint16_t>(RecordType::TensorChunk), 0, detail::encodeChunk(meta), body,
                           meta.length);
    info.chunkRecords.push_back(at);
    info.storedBytes += body.size;
  };
  auto chunkLen = [&](uint64_t i) { return std::min(chunk, total - i * chunk); };

  if (!m.pool || count == 1) {
    detail::EncodedBody& body = m.encoded;
    for (uint64_t i = 0; i < count; ++i) {
      const int tried = chunkLevel(i);
      detail::encodeBody(m.compressor, src + i * chunk, chunkLen(i), tried, shuffle, m.options.minSavings, m.scratch,
                         body);
      writeChunk(i, body, tried);
    }
  } else {
    // Keep at most two chunks per thread in flight; write them back in order.
    const uint64_t window = 2ull * m.options.compressionThreads;
    struct Inflight {
      std::future<void> done;
      std::unique_ptr<detail::EncodedBody> body;
      int level;
    };
    std::deque<Inflight> inflight;
    // If a write fails, the workers may still be encoding into these bodies (and reading the
    // caller's bytes): wait for all of them before unwinding frees anything.
    struct WaitAll {
      decltype(inflight)& jobs;
      ~WaitAll() {
        for (auto& j : jobs)
          if (j.done.valid()) j.done.wait();
      }
    } waitAll{inflight};
    uint64_t next = 0, done = 0;
    const double minSavings = m.options.minSavings;
    while (done < count) {
      while (next < count && next - done < window) {
        std::unique_ptr<detail::EncodedBody> body;
        if (m.spareBodies.empty()) {
          body = std::make_unique<detail::EncodedBody>(m.memory->parts().forkPrivate);
        } else {
          body = std::move(m.spareBodies.back());
          m.spareBodies.pop_back();
        }
        auto* out = body.get();
        const uint8_t* in = src + next * chunk;
        uint64_t len = chunkLen(next);
        const int tried = chunkLevel(next);  // by the chunks written so far
        inflight.push_back({m.pool->submit([=](detail::Compressor& c, detail::WorkBuffer& scratch) {
                              detail::encodeBody(c, in, len, tried, shuffle, minSavings, scratch, *out);
                            }),
                            std::move(body), tried});
        ++next;
      }
      inflight.front().done.get();
      writeChunk(done, *inflight.front().body, inflight.front().level);
      m.spareBodies.push_back(std::move(inflight.front().body));
      inflight.pop_front();
      ++done;
    }
  }
  if (level > 0 && total > 0) {  // it was tried: remember whether it paid
    if (compressed || m.options.rawRetryEvery == 0)
      m.rawRoles.erase(role);
    else
      m.rawRoles[role] = 0;
  }
  m.names.insert(name);
  m.tensors.push_back(std::move(info));
  return m.tensors.back().id;
}

void BundleWriter::setZstdLevel(int level) {
  if (level < 0 || level > 19)
    throw Error(ErrorCode::InvalidArgument, fmt::format("zstd level {} is outside 0..19", level));
  impl_->options.zstdLevel = level;
}

int BundleWriter::zstdLevel() const { return impl_->options.zstdLevel; }

void BundleWriter::writeNote(const std::string& key, const std::string& text) {
  if (key.empty() || key.size() > 256)
    throw Error(ErrorCode::InvalidArgument, fmt::format("note key must be 1..256 bytes, got {}", key.size()));
  if (text.size() > kMaxNoteTextBytes)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("note text is {} bytes; at most {}", text.size(), kMaxNoteTextBytes));
  detail::EncodedBody none;
  impl_->append(static_cast<uint16_t>(RecordType::Note), 0, detail::encodeNote({key, text}), none, 0);
}

void BundleWriter::writeEnvironment(const EnvironmentData& environment) {
  detail::EncodedBody none;
  impl_->append(static_cast<uint16_t>(RecordType::Environment), 0, detail::encodeEnvironment(environment), none, 0);
}

uint64_t BundleWriter::writeRecord(uint16_t type, const std::vector<uint8_t>& meta, const void* body,
                                   uint64_t bodySize, bool compress, uint16_t extraFlags) {
  if (meta.size() % 8 != 0 || meta.empty())
    throw Error(ErrorCode::InvalidArgument, fmt::format("record meta is {} bytes; it must be a positive multiple of 8",
                                                        meta.size()));
  if (type == static_cast<uint16_t>(RecordType::Index) || type == static_cast<uint16_t>(RecordType::TensorChunk))
    throw Error(ErrorCode::InvalidArgument, fmt::format("record type {} is written by the writer itself",
                                                        recordTypeName(type)));
  if (extraFlags & kCodecMask) throw Error(ErrorCode::InvalidArgument, "extraFlags must not set codec bits");
  if (bodySize > ReaderLimits{}.maxChunkBytes)
    throw Error(ErrorCode::InvalidArgument,
                fmt::format("record body is {} bytes; readers accept at most {} by default", bodySize,
                            ReaderLimits{}.maxChunkBytes));
  detail::EncodedBody& enc = impl_->encoded;
  detail::encodeBody(impl_->compressor, static_cast<const uint8_t*>(body), bodySize,
                     compress ? std::max(1, impl_->options.zstdLevel) : 0, 0, impl_->options.minSavings,
                     impl_->scratch, enc);
  return impl_->append(type, extraFlags, meta, enc, bodySize);
}

std::unique_ptr<BundleWriter> BundleWriter::createCopy(const std::string& path, const FileHeader& header,
                                                      const WriterOptions& options) {
  auto impl = std::make_unique<Impl>(options.encodeMemory);
  impl->options = options;
  impl->file = detail::File::create(path, options.overwrite);
  impl->header = header;
  uint8_t head[kFileHeaderSize];
  encodeFileHeader(impl->header, head);
  const void* parts[1] = {head};
  uint64_t sizes[1] = {kFileHeaderSize};
  impl->file.writeAll(parts, sizes, 1, 0);
  impl->offset = kFileHeaderSize;
  return std::unique_ptr<BundleWriter>(new BundleWriter(std::move(impl)));
}

uint64_t BundleWriter::copyRecord(const RecordHeader& header, const std::vector<uint8_t>& meta,
                                  const std::vector<uint8_t>& storedBody) {
  CRASHCAP_ASSERT(meta.size() == header.metaLength && storedBody.size() == header.bodyLength,
                  fmt::format("meta {} / body {} bytes vs header {} / {}", meta.size(), storedBody.size(),
                              header.metaLength, header.bodyLength));
  RecordHeader h = header;
  h.sequence = impl_->sequence;  // renumbered so the copy has no gaps where records were lost
  return impl_->appendWithHeader(h, meta, storedBody.data());
}

void BundleWriter::indexTensor(const TensorInfo& tensor) {
  if (!impl_->names.insert(tensor.name).second)
    throw Error(ErrorCode::InvalidArgument, fmt::format("tensor '{}' is already indexed", tensor.name));
  impl_->tensors.push_back(tensor);
  impl_->nextTensorId = std::max(impl_->nextTensorId, tensor.id + 1);
}

void BundleWriter::sync() {
  impl_->checkWritable();
  impl_->doSync();
}

void BundleWriter::seal(bool sync) {
  auto& m = *impl_;
  m.checkWritable();
  detail::IndexData index;
  index.records = m.records;
  index.tensors = m.tensors;
  std::vector<uint8_t> body = detail::encodeIndex(index);
  if (body.size() > ReaderLimits{}.maxIndexBytes)
    throw Error(ErrorCode::LimitExceeded,
                fmt::format("the index of {} records is {} bytes; readers accept at most {}", m.records.size(),
                            body.size(), ReaderLimits{}.maxIndexBytes),
                "the records written so far stay readable by a scan (`crashcap recover`)");
  detail::EncodedBody enc;
  detail::encodeBody(m.compressor, body.data(), body.size(), std::max(1, m.options.zstdLevel), 0, 0.0, m.scratch,
                     enc);
  uint64_t recordCount = m.records.size();
  uint64_t indexOffset = m.append(static_cast<uint16_t>(RecordType::Index), 0,
                                  detail::encodeIndexInfo(recordCount, m.tensors.size()), enc, body.size());
  m.records.pop_back();
  Footer f;
  f.indexOffset = indexOffset;
  f.recordCount = recordCount;
  uint8_t foot[kFooterSize];
  encodeFooter(f, foot);
  const void* parts[1] = {foot};
  uint64_t sizes[1] = {kFooterSize};
  try {
    m.file.writeAll(parts, sizes, 1, m.offset);
  } catch (...) {
    m.broken = true;
    throw;
  }
  m.offset += kFooterSize;
  m.stats.fileBytes = m.offset;
  try {
    if (sync && m.options.durability.syncOnSeal) m.doSync();
    m.file.close();
  } catch (...) {
    m.broken = true;  // index and footer are written; a second seal() must not append more
    throw;
  }
  if (sync && m.options.durability.syncOnSeal) detail::syncParentDirectory(m.file.path());
  m.sealed = true;
}

bool BundleWriter::sealed() const { return impl_->sealed; }
const std::string& BundleWriter::path() const { return impl_->file.path(); }
const FileHeader& BundleWriter::fileHeader() const { return impl_->header; }
const WriterStats& BundleWriter::stats() const { return impl_->stats; }

}  // namespace crashcap::formats
