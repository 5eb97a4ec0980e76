// libcrashcap_inject.so as CUDA would load it: dlopen, then InitializeInjection, in a child
// process of its own. Without a GPU it must still leave a trace file that says why no kernel
// was traced, and never fail the process it was injected into.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "crashcap/cupti/trace_file.hpp"
#include "crashcap/cupti/tracer.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using namespace crashcap;

#if CRASHCAP_HAVE_CUPTI
namespace {

/// Forks; the child loads the library the way CUDA does and reports InitializeInjection's
/// return value as its exit status. stderr goes to `errFile`.
std::pair<pid_t, int> injectInChild(const char* crashcapDir, const std::string& errFile) {
  std::string lib = test::binPath("libcrashcap_inject.so");
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::open(errFile.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    if (crashcapDir) ::setenv("CRASHCAP_DIR", crashcapDir, 1);
    else ::unsetenv("CRASHCAP_DIR");
    void* h = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) ::_exit(90);
    auto init = reinterpret_cast<int (*)()>(::dlsym(h, "InitializeInjection"));
    if (!init) ::_exit(91);
    ::_exit(init());  // 1: success, as CUDA expects
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return {pid, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("libcrashcap_inject.so without a GPU: a trace file that says why, and the process goes on", "[inject]") {
  REQUIRE(fs::exists(test::binPath("libcrashcap_inject.so")));
  test::TempDir dir;
  auto [pid, rc] = injectInChild(dir.path().c_str(), dir.path() + "/err.txt");
  INFO(slurp(dir.path() + "/err.txt"));
  CHECK(rc == 1);
  std::string file = cupti::traceFilePath(dir.path(), static_cast<uint32_t>(pid));
  REQUIRE(fs::exists(file));
  auto traces = cupti::readKernelTraces(file);
  REQUIRE(traces.size() == 1);
  CHECK(traces[0].pid == static_cast<uint32_t>(pid));
  CHECK(traces[0].activities.empty());
  std::string reason = cupti::gpuUnavailableReason();
  if (!reason.empty()) CHECK(traces[0].status == "unavailable: " + reason);
  else CHECK(traces[0].status == "recorded");  // a machine with a GPU
  CHECK(cupti::describeTraces(traces, "fallback") == traces[0].status);
}

TEST_CASE("libcrashcap_inject.so without CRASHCAP_DIR says so and writes nothing", "[inject]") {
  test::TempDir dir;
  auto [pid, rc] = injectInChild(nullptr, dir.path() + "/err.txt");
  CHECK(rc == 1);
  CHECK(slurp(dir.path() + "/err.txt").find("without CRASHCAP_DIR") != std::string::npos);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) files += e.path().filename() != "err.txt";
  CHECK(files == 0);
}
#endif
