#include "crashcap/cupti/trace_file.hpp"

#include <fmt/format.h>

#include <optional>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"

namespace crashcap::cupti {

std::string traceFilePath(const std::string& dir, uint32_t pid) {
  return fmt::format("{}/{}{}{}", dir, kTraceFilePrefix, pid, kTraceFileExtension);
}

void writeTraceFile(const std::string& path, const formats::KernelTraceData& trace, const std::string& producer) {
  formats::PartialOutput output(path);
  {
    formats::WriterOptions wo;
    wo.overwrite = true;
    wo.producer = producer;
    auto writer = formats::BundleWriter::create(output.path(), wo);
    formats::writeMetaRecord(*writer, trace);
    writer->seal();
  }
  output.commit();
}

std::vector<formats::KernelTraceData> readKernelTraces(const std::string& path) {
  auto reader = formats::BundleReader::open(path);
  return formats::readRecords(*reader).kernelTraces;
}

namespace {

/// The earliest of one kind of error among the traces, on CLOCK_MONOTONIC.
const formats::ApiErrorData* earliest(const std::vector<formats::KernelTraceData>& traces,
                                      std::optional<formats::ApiErrorData> formats::KernelTraceData::*which,
                                      uint32_t* pid) {
  const formats::ApiErrorData* best = nullptr;
  int64_t bestNs = 0;
  for (const auto& t : traces) {
    const auto& e = t.*which;
    if (!e) continue;
    int64_t ns = static_cast<int64_t>(e->timeNs) + t.clockOffsetNs;
    if (!best || ns < bestNs) {
      best = &*e;
      bestNs = ns;
      if (pid) *pid = t.pid;
    }
  }
  return best;
}

std::string errorText(const formats::ApiErrorData& e) {
  return fmt::format("{} in {}", e.name.empty() ? fmt::format("code {}", e.code) : e.name, e.api);
}

}  // namespace

const formats::ApiErrorData* firstStickyError(const std::vector<formats::KernelTraceData>& traces, uint32_t* pid) {
  return earliest(traces, &formats::KernelTraceData::stickyError, pid);
}

std::string describeTraces(const std::vector<formats::KernelTraceData>& traces, const std::string& fallback) {
  size_t recorded = 0;
  uint64_t launches = 0;
  std::string unavailable;
  for (const auto& t : traces) {
    if (!t.available()) {
      if (unavailable.empty()) unavailable = t.status;
      continue;
    }
    ++recorded;
    launches += t.totalLaunches;
  }
  if (recorded == 0) return unavailable.empty() ? fallback : unavailable;
  std::string s = fmt::format("recorded: {} process{}, {} kernel launch{}", recorded, recorded == 1 ? "" : "es", launches,
                              launches == 1 ? "" : "es");
  // The sticky error is the failure; a soft one before it (a recovered allocation failure) is not.
  if (const auto* e = firstStickyError(traces))
    s += ", first sticky error " + errorText(*e);
  else if (const auto* f = earliest(traces, &formats::KernelTraceData::firstError, nullptr))
    s += ", first error " + errorText(*f) + " (not sticky: the context survived it)";
  else
    s += ", no CUDA API error";
  return s;
}

}  // namespace crashcap::cupti
