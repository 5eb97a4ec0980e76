#pragma once
// A .zip written through libzip: `crashcap pack --zip`, the form issue trackers take.

#include <string>
#include <vector>

namespace crashcap::investigate {

struct ZipEntry {
  std::string name;        ///< the name inside the archive
  std::string file;        ///< the bytes of this file, or
  std::string text;        ///< these bytes, when `file` is ""
  bool compress = true;    ///< deflate; false stores it (a bundle is zstd-compressed already)
};

/// Writes `entries` into a new archive at `path` (replacing it). Throws Error{Io} naming libzip's
/// reason.
void writeZip(const std::string& path, const std::vector<ZipEntry>& entries);

}  // namespace crashcap::investigate
