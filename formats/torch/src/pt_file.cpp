#include "crashcap/formats/torch/pt_file.hpp"

#include <ATen/ATen.h>
#include <fmt/format.h>
// torch::pickle_save/pickle_load write and read the zip + pickle layout of Python's
// torch.save. torch::save would not do: it writes a TorchScript archive, which Python's
// torch.load hands to torch.jit.load and returns as a ScriptModule, not a tensor.
#include <torch/serialize.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <sstream>
#include <vector>

#include "crashcap/formats/error.hpp"
#include "crashcap/formats/torch/errors.hpp"

namespace crashcap::formats::torch {
namespace {


struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

void writeWholeFile(const std::string& path, const std::vector<char>& bytes) {
  File f(std::fopen(path.c_str(), "wb"));
  if (!f) throw Error(ErrorCode::Io, fmt::format("cannot create {}: {}", path, std::strerror(errno)));
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size())
    throw Error(ErrorCode::Io, fmt::format("cannot write {} bytes to {}: {}", bytes.size(), path, std::strerror(errno)));
  // fclose flushes the buffer: a full disk shows up here, not in fwrite.
  if (std::fclose(f.release()) != 0)
    throw Error(ErrorCode::Io, fmt::format("cannot write {} bytes to {}: {}", bytes.size(), path, std::strerror(errno)));
}

std::vector<char> readWholeFile(const std::string& path) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    auto code = errno == ENOENT ? ErrorCode::NotFound : ErrorCode::Io;
    throw Error(code, fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  }
  std::vector<char> bytes;
  char buf[1 << 16];
  size_t got = 0;
  while ((got = std::fread(buf, 1, sizeof buf, f.get())) > 0) bytes.insert(bytes.end(), buf, buf + got);
  if (std::ferror(f.get()))
    throw Error(ErrorCode::Io, fmt::format("cannot read {} after {} bytes: {}", path, bytes.size(), std::strerror(errno)));
  return bytes;
}

}  // namespace

void savePt(const at::Tensor& t, const std::string& path) {
  if (!t.defined()) throw Error(ErrorCode::InvalidArgument, fmt::format("cannot save an undefined tensor to {}", path));
  std::vector<char> bytes;
  try {
    // The pickle stores the tensor's whole storage and its strides: a contiguous host copy
    // keeps a slice of a big tensor small, and resolve_conj/resolve_neg make the stored
    // bytes the values.
    at::Tensor host = t.detach().cpu().resolve_conj().resolve_neg().contiguous();
    bool ownsStorage = host.storage_offset() == 0 &&
                       host.storage().nbytes() == static_cast<size_t>(host.numel()) * host.element_size();
    if (!ownsStorage) host = host.clone();
    bytes = ::torch::pickle_save(host);
  } catch (const std::exception& e) {
    std::ostringstream shape;
    shape << t.sizes();
    throw Error(ErrorCode::Unsupported,
                fmt::format("cannot save a {} tensor of shape {} on {} to {}: {}", c10::toString(t.scalar_type()),
                            shape.str(), t.device().str(), path, errorMessage(e)));
  }
  writeWholeFile(path, bytes);
}

at::Tensor loadPt(const std::string& path) {
  std::vector<char> bytes = readWholeFile(path);
  // torch.save has written zip archives since PyTorch 1.6; say so rather than pass on the
  // unpickler's message about the first bytes.
  static constexpr char kZipMagic[4] = {'P', 'K', '\x03', '\x04'};
  if (bytes.size() < sizeof kZipMagic || std::memcmp(bytes.data(), kZipMagic, sizeof kZipMagic) != 0) {
    std::string found;
    for (size_t i = 0; i < std::min<size_t>(bytes.size(), 4); ++i)
      found += fmt::format("{}{:02x}", i ? " " : "", static_cast<unsigned char>(bytes[i]));
    throw Error(ErrorCode::Corrupt,
                fmt::format("{} ({} bytes) is not a .pt file: expected a zip archive (50 4b 03 04), found [{}]", path,
                            bytes.size(), found),
                "loadPt reads files written by Python's torch.save(tensor, path) (PyTorch >= 1.6) or by savePt");
  }
  c10::IValue value;
  try {
    value = ::torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    throw Error(ErrorCode::Corrupt,
                fmt::format("{} ({} bytes) is a zip archive but not a .pt file LibTorch can read: {}", path,
                            bytes.size(), errorMessage(e)),
                "loadPt reads one tensor saved with torch.save(tensor, path) or savePt; a file cut short, or "
                "some containers (LibTorch 1.13 cannot read a one-item dict or list), fail this way");
  }
  if (!value.isTensor())
    throw Error(ErrorCode::Unsupported, fmt::format("{} holds a {}, not a single tensor", path, value.tagKind()),
                "loadPt reads files written by torch.save(tensor, path); save one tensor per file");
  return value.toTensor();
}

}  // namespace crashcap::formats::torch
