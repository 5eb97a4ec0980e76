#include "crashcap/cupti/trace_file.hpp"

#include <fmt/format.h>

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
  return formats::readRecording(*reader).kernelTraces;
}

std::string describeTraces(const std::vector<formats::KernelTraceData>& traces, const std::string& fallback) {
  size_t recorded = 0;
  uint64_t launches = 0;
  const formats::KernelTraceData* firstError = nullptr;
  std::string unavailable;
  for (const auto& t : traces) {
    if (!t.available()) {
      if (unavailable.empty()) unavailable = t.status;
      continue;
    }
    ++recorded;
    launches += t.totalLaunches;
    if (t.firstError && (!firstError || t.firstError->timeNs < firstError->firstError->timeNs)) firstError = &t;
  }
  if (recorded == 0) return unavailable.empty() ? fallback : unavailable;
  std::string s = fmt::format("recorded: {} process{}, {} kernel launch{}", recorded, recorded == 1 ? "" : "es", launches,
                              launches == 1 ? "" : "es");
  if (firstError) {
    const auto& e = *firstError->firstError;
    s += fmt::format(", first error {} in {}", e.name.empty() ? fmt::format("code {}", e.code) : e.name, e.api);
  } else {
    s += ", no CUDA API error";
  }
  return s;
}

}  // namespace crashcap::cupti
