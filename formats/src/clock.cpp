#include "crashcap/formats/clock.hpp"

#include <chrono>

namespace crashcap::formats {

int64_t unixTimeNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace crashcap::formats
