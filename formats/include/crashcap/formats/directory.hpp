#pragma once
// Removing and listing directory trees through the C library instead of std::filesystem's
// remove_all and recursive_directory_iterator: the official LibTorch 2.x builds carry a static
// copy of libstdc++'s filesystem code and export its symbols, so in a program that links them
// (crashcap-torch, the Python extension) those calls bind to LibTorch's copy, and its remove_all
// (which walks with the recursive iterator) jumped to address 0 in `crashcap replay` on torch 2.11
// (docs/ARCHITECTURE.md, "LibTorch versions"). tests/architecture/check_filesystem.py keeps both
// calls out of the project.
#include <string>
#include <vector>

namespace crashcap::formats {

/// Removes PATH and everything under it, as `rm -rf` does: symbolic links are removed, never
/// followed (also for "link/"); a PATH that does not exist, or that leads through something that
/// is not a directory, is no error. Returns "" on success, else what failed
/// (the first entry that could not be removed and why); it goes on removing what it can.
std::string removeTree(const std::string& path);

struct DirectoryEntry {
  std::string name;      // the entry's name in its directory (never "." or "..")
  bool directory = false;  // a directory, or a symbolic link to one
  bool symlink = false;    // a symbolic link (a walk does not descend through one)
};

/// The entries of DIR, sorted by name. Returns "" on success, else why DIR could not be listed,
/// without DIR's name, which the caller shows as it likes ("cannot open it: Permission denied");
/// ENTRIES then holds what was read.
std::string listDirectory(const std::string& dir, std::vector<DirectoryEntry>& entries);

}  // namespace crashcap::formats
