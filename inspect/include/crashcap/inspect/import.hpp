#pragma once
// `crashcap import`: a bundle built from .npy files, e.g. to attach tensors to a bug report.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace crashcap::inspect {

struct ImportItem {
  std::string name;   ///< the tensor's name in the bundle (formats::validateTensorName)
  std::string file;   ///< the .npy file
};

struct ImportOptions {
  int zstdLevel = 3;                                         ///< 0 stores raw
  bool overwrite = false;                                    ///< replace an existing output
  std::vector<std::pair<std::string, std::string>> notes;    ///< KEY, TEXT annotations
};

struct ImportReport {
  uint64_t tensors = 0;
  uint64_t bytes = 0;                                        ///< of the sealed bundle
};

/// Reads every item (untrusted .npy files) before creating anything, then writes `out` through
/// OUT.partial and a rename, so a bad input or a failed write leaves nothing behind. Each
/// tensor's source file is kept as a note `crashcap.import.source`. Throws crashcap::Error
/// (InvalidArgument: a bad name, or `out` exists without `overwrite`; the .npy reader's errors
/// with the file named).
ImportReport importNpyFiles(const std::string& out, const std::vector<ImportItem>& items, const ImportOptions& options);

}  // namespace crashcap::inspect
