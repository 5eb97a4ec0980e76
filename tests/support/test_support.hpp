#pragma once
// Helpers shared by the test binaries: scratch directories, files, child processes.

#include <cstdint>
#include <string>
#include <vector>

namespace crashcap::test {

/// A fresh directory under $TMPDIR, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

std::vector<uint8_t> readFile(const std::string& path);
void writeFile(const std::string& path, const std::vector<uint8_t>& bytes);
void writeText(const std::string& path, const std::string& text);
std::string readText(const std::string& path);

/// Result of running a child process.
struct RunResult {
  int exitCode = -1;      ///< exit status, or -signal when killed by a signal
  std::string out, err;
};

/// Runs argv[0] (searched in PATH when it has no '/') with the given arguments, capturing
/// stdout and stderr, killing it after timeoutSeconds.
RunResult run(const std::vector<std::string>& argv, int timeoutSeconds = 120);

/// The *.ccap files directly in `dir`, sorted (bundle names sort by time).
std::vector<std::string> bundlesIn(const std::string& dir);

/// Path to a built executable: $CRASHCAP_BIN/name, else build/bin/name.
std::string binPath(const std::string& name);
/// The source tree root ($CRASHCAP_SOURCE_DIR, else the one this build was configured from).
std::string sourceDir();

/// Deterministic pseudo-random bytes / floats for test data.
std::vector<uint8_t> randomBytes(uint64_t n, uint64_t seed);
std::vector<float> randomFloats(uint64_t n, uint64_t seed);

}  // namespace crashcap::test
