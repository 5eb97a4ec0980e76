#include "crashcap/formats/clock.hpp"

#include <chrono>
#include <ctime>

namespace crashcap::formats {

int64_t unixTimeNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string formatTime(int64_t ns) {
  std::time_t t = std::time_t(ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return buf;
}

}  // namespace crashcap::formats
