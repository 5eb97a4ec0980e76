#include "crashcap/replayer/bisect.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

namespace crashcap::replayer {

RowBisection bisectRows(int64_t batchSize, const std::function<Trial(const std::vector<int64_t>&)>& test) {
  RowBisection result;
  auto run = [&](const std::vector<int64_t>& rows) {
    auto t = test(rows);
    result.replays++;
    result.log.emplace_back(rows, t);
    return t.fails;
  };
  std::vector<int64_t> current(batchSize);
  for (int64_t i = 0; i < batchSize; ++i) current[i] = i;
  if (!run(current)) return result;
  result.reproduced = true;
  size_t n = 2;
  while (current.size() >= 2) {
    // Split into n nearly equal parts.
    std::vector<std::vector<int64_t>> parts;
    size_t start = 0;
    for (size_t k = 0; k < n; ++k) {
      size_t end = start + (current.size() - start) / (n - k);
      parts.emplace_back(current.begin() + start, current.begin() + end);
      start = end;
    }
    bool reduced = false;
    for (const auto& p : parts) {
      if (!p.empty() && run(p)) {
        current = p;
        n = 2;
        reduced = true;
        break;
      }
    }
    if (!reduced && n > 2) {
      // Complements: with two parts they equal the parts, already tested.
      for (const auto& p : parts) {
        std::vector<int64_t> complement;
        std::set_difference(current.begin(), current.end(), p.begin(), p.end(), std::back_inserter(complement));
        if (!complement.empty() && run(complement)) {
          current = complement;
          n = std::max<size_t>(n - 1, 2);
          reduced = true;
          break;
        }
      }
    }
    if (!reduced) {
      if (n >= current.size()) break;
      n = std::min(2 * n, current.size());
    }
  }
  result.rows = current;
  return result;
}

ChildResult runChild(const std::vector<std::string>& argv, double timeoutSeconds) {
  ChildResult r;
  auto t0 = std::chrono::steady_clock::now();
  int out[2], err[2];
  if (pipe(out) != 0 || pipe(err) != 0) {
    r.err = std::strerror(errno);
    return r;
  }
  pid_t pid = fork();
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    close(out[0]);
    close(out[1]);
    close(err[0]);
    close(err[1]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open = 2;
  auto deadline = t0 + std::chrono::duration<double>(timeoutSeconds);
  while (open > 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      r.timedOut = true;
      kill(pid, SIGKILL);
      break;
    }
    if (poll(fds, 2, static_cast<int>(std::min<int64_t>(left.count(), 1000))) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[65536];
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n <= 0) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open;
      } else {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? -WTERMSIG(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace crashcap::replayer
