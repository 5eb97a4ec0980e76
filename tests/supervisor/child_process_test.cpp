// The one child-process loop: output captured from both pipes, exit status or signal, the
// timeout, a grandchild that keeps the pipes open, and a command that cannot start.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

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

TEST_CASE("processes run together: a peer left running after one ended is stopped; with a deadline, so are all that never end",
          "[supervisor][child]") {
  using supervisor::runTogether;
  auto sleeper = [](const char* text) {
    return supervisor::TogetherCommand{{"/bin/sh", "-c", std::string("echo ") + text + "; exec sleep 30"}, {}};
  };
  SECTION("one ends: the other is stopped hangSeconds later, long before a deadline") {
    auto t0 = std::chrono::steady_clock::now();
    auto runs = runTogether({{{"/bin/sh", "-c", "exit 4"}, {}}, sleeper("waiting")}, 0.5, 20.0);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    REQUIRE(runs.size() == 2);
    CHECK(runs[0].exitCode == 4);
    CHECK_FALSE(runs[0].timedOut);
    CHECK(runs[1].timedOut);
    CHECK_FALSE(runs[1].pastDeadline);
    CHECK(runs[1].exitCode == -SIGKILL);
    CHECK(runs[1].out == "waiting\n");
    CHECK(seconds < 10);
  }
  SECTION("none ends: without a deadline nothing would stop them; with one, every one is stopped there") {
    auto t0 = std::chrono::steady_clock::now();
    auto runs = runTogether({sleeper("first"), sleeper("second")}, 0.5, 1.0);
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    REQUIRE(runs.size() == 2);
    for (const auto& r : runs) {
      CHECK(r.timedOut);
      CHECK(r.pastDeadline);
      CHECK(r.exitCode == -SIGKILL);
      CHECK(r.seconds >= 1.0);
    }
    CHECK(runs[0].out == "first\n");
    CHECK(runs[1].out == "second\n");
    CHECK(seconds < 10);  // the deadline, not the 30 s of the sleeps
  }
  SECTION("one ends, and the deadline comes before hangSeconds: the other is stopped at the deadline") {
    auto runs = runTogether({{{"/bin/sh", "-c", "exit 0"}, {}}, sleeper("waiting")}, 30, 1.0);
    REQUIRE(runs.size() == 2);
    CHECK(runs[0].exitCode == 0);
    CHECK_FALSE(runs[0].timedOut);
    CHECK(runs[1].timedOut);
    CHECK(runs[1].pastDeadline);
    CHECK(runs[1].seconds < 10);
  }
  SECTION("one that has exited is never counted as stopped, though a grandchild holds its pipes past the deadline") {
    auto runs = runTogether({{{"/bin/sh", "-c", "sleep 20 & echo answered"}, {}}}, 30, 0.5);
    REQUIRE(runs.size() == 1);
    CHECK(runs[0].exitCode == 0);
    CHECK(runs[0].out == "answered\n");
    CHECK_FALSE(runs[0].timedOut);
    CHECK_FALSE(runs[0].pastDeadline);
  }
}

TEST_CASE("a child that ended in time is not timed out while a grandchild holds its pipes", "[supervisor][child]") {
  auto r = runCaptured({"/bin/sh", "-c", "sleep 20 & echo answered"}, 0.5);
  CHECK(r.exitCode == 0);
  CHECK(r.out == "answered\n");
  CHECK_FALSE(r.timedOut);
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

TEST_CASE("a child runs in the working directory it is given, and a missing one is NotFound", "[supervisor][child]") {
  ChildProcess::Options o;
  o.workingDirectory = "/usr";
  auto r = runCaptured({"/bin/sh", "-c", "pwd"}, 30, o);
  CHECK(r.out == "/usr\n");
  o.workingDirectory = "/nonexistent/crashcap-dir";
  try {
    runCaptured({"/bin/sh", "-c", "pwd"}, 30, o);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::NotFound);
    CHECK_THAT(e.what(), Catch::Contains("/nonexistent/crashcap-dir"));
  }
}

namespace {
/// Alive and not a zombie.
bool running(pid_t pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return false;
  char state = 0;
  int ignored = std::fscanf(f, "%*d %*s %c", &state);
  std::fclose(f);
  return ignored == 1 && state != 'Z' && state != 'X';
}
}  // namespace

TEST_CASE("a child started with dieWithParent does not outlive the process that started it", "[supervisor][child]") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  pid_t helper = ::fork();
  REQUIRE(helper >= 0);
  if (helper == 0) {  // the parent that dies: starts a long child and is killed outright
    ChildProcess::Options o;
    o.dieWithParent = true;
    auto child = ChildProcess::start({"/bin/sleep", "60"}, o);
    pid_t pid = child.pid();
    (void)!::write(fds[1], &pid, sizeof pid);
    ::pause();
    ::_exit(0);
  }
  ::close(fds[1]);
  pid_t grandchild = 0;
  REQUIRE(::read(fds[0], &grandchild, sizeof grandchild) == sizeof grandchild);
  ::close(fds[0]);
  REQUIRE(running(grandchild));
  ::kill(helper, SIGKILL);  // no destructor runs: only the kernel can end the child now
  int status = 0;
  ::waitpid(helper, &status, 0);
  auto t0 = std::chrono::steady_clock::now();
  while (running(grandchild) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
    ::usleep(20000);
  CHECK_FALSE(running(grandchild));
}
