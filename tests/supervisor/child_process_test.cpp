// The one child-process loop: output captured from both pipes, exit status or signal, the
// timeout, a grandchild that keeps the pipes open, and a command that cannot start.
#include <catch2/catch.hpp>

#include <signal.h>

#include <chrono>

#include "crashcap/formats/error.hpp"
#include "crashcap/supervisor/child_process.hpp"

using namespace crashcap;
using supervisor::ChildProcess;
using supervisor::runCaptured;

TEST_CASE("a captured run keeps stdout and stderr apart and gives the exit status", "[supervisor][child]") {
  auto r = runCaptured({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, 30);
  CHECK(r.out == "out\n");
  CHECK(r.err == "err\n");
  CHECK(r.exitCode == 3);
  CHECK_FALSE(r.timedOut);
}

TEST_CASE("a child killed by a signal reports minus the signal", "[supervisor][child]") {
  auto r = runCaptured({"/bin/sh", "-c", "kill -SEGV $$"}, 30);
  CHECK(r.exitCode == -SIGSEGV);
  CHECK_FALSE(r.timedOut);
}

TEST_CASE("a child past its timeout is killed and says so", "[supervisor][child]") {
  auto t0 = std::chrono::steady_clock::now();
  auto r = runCaptured({"/bin/sh", "-c", "echo started; exec sleep 30"}, 0.5);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(r.timedOut);
  CHECK(r.exitCode == -SIGKILL);
  CHECK(r.out == "started\n");
  CHECK(seconds < 10);  // not the 30 s of the sleep
}

TEST_CASE("a grandchild holding the pipes does not keep a finished run waiting", "[supervisor][child]") {
  auto t0 = std::chrono::steady_clock::now();
  auto r = runCaptured({"/bin/sh", "-c", "sleep 20 & echo parent done"}, 60);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(r.exitCode == 0);
  CHECK(r.out == "parent done\n");
  CHECK_FALSE(r.timedOut);
  CHECK(seconds < 15);  // the child's exit plus a short grace, not the grandchild's 20 s
}

TEST_CASE("a command that cannot be executed is Error NotFound naming it", "[supervisor][child]") {
  try {
    runCaptured({"/nonexistent/crashcap-child"}, 5);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::NotFound);
    CHECK_THAT(e.what(), Catch::Contains("cannot run '/nonexistent/crashcap-child'"));
  }
}

TEST_CASE("environment entries given to a child replace the inherited ones", "[supervisor][child]") {
  setenv("CRASHCAP_CHILD_TEST", "inherited", 1);
  ChildProcess::Options o;
  o.environment = {"CRASHCAP_CHILD_TEST=given", "CRASHCAP_CHILD_NEW=new"};
  auto child = ChildProcess::start({"/bin/sh", "-c", "echo $CRASHCAP_CHILD_TEST $CRASHCAP_CHILD_NEW"}, o);
  std::string out;
  while (child.outputOpen() || !child.exited())
    child.poll(100, [&](int stream, const char* data, size_t n) {
      if (stream == 1) out.append(data, n);
    });
  child.wait();
  CHECK(out == "given new\n");
  CHECK(child.exitCode() == 0);
  unsetenv("CRASHCAP_CHILD_TEST");
}
