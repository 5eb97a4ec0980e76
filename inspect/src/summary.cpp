#include "crashcap/inspect/summary.hpp"

#include <fmt/format.h>

#include <map>

#include "crashcap/formats/clock.hpp"

namespace crashcap::inspect {

using formats::BundleReader;
using nlohmann::json;

json environmentJson(const formats::EnvironmentData& env) {
  json facts = json::object(), vars = json::object();
  for (const auto& [k, v] : env.facts) facts[k] = v;
  for (const auto& [k, v] : env.variables) vars[k] = v;
  return {{"facts", facts}, {"variables", vars}, {"command_line", env.commandLine}, {"redacted", env.redacted}};
}

std::string formatBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

namespace {

json reportJson(const formats::OpenReport& r) {
  json damage = json::array();
  for (const auto& d : r.damage) damage.push_back({{"offset", d.offset}, {"length", d.length}, {"what", d.what}});
  json lost = json::array();
  for (const auto& l : r.lostTensors)
    lost.push_back({{"name", l.name}, {"chunks_found", l.chunksFound}, {"chunk_count", l.chunkCount}});
  json unknown = json::object();
  for (const auto& [type, count] : r.unknownTypes) unknown[std::to_string(type)] = count;
  return {{"sealed", r.sealed},
          {"complete", r.complete()},
          {"summary", r.summary()},
          {"opened_by", r.sealed ? "index" : "scan"},
          {"why_scanned", r.sealed ? json(nullptr) : json(r.whyScanned)},
          {"file_header_damaged", r.fileHeaderDamaged},
          {"truncated_at", r.truncatedAt ? json(*r.truncatedAt) : json(nullptr)},
          {"usable_bytes", r.usableBytes},
          {"records_recovered", r.recordsRecovered},
          {"missing_records", r.missingSequenceCount},
          {"damage", damage},
          {"lost_tensors", lost},
          {"unknown_record_types", unknown},
          {"notices", r.notices}};
}

}  // namespace

json bundleInfoJson(const BundleReader& reader) {
  const auto& h = reader.fileHeader();
  const auto& r = reader.report();
  std::map<std::string, uint64_t> byType;
  for (const auto& rec : reader.records()) byType[formats::recordTypeName(rec.type)]++;
  uint64_t raw = 0, stored = 0;
  for (const auto& t : reader.tensors()) {
    raw += t.totalBytes;
    stored += t.storedBytes;
  }
  json notes = json::array();
  for (const auto& n : reader.notes()) notes.push_back({{"key", n.key}, {"text", n.text}});
  json j = {{"path", reader.path()},
            {"file_size", r.fileSize},
            {"format", {{"major", h.formatMajor}, {"minor", h.formatMinor}}},
            {"recording_id", r.fileHeaderDamaged ? json(nullptr) : json(formats::formatRecordingId(h.recordingId))},
            {"state", reportJson(r)},
            {"records", {{"count", reader.records().size()}, {"by_type", byType}}},
            {"tensors", {{"count", reader.tensors().size()}, {"raw_bytes", raw}, {"stored_bytes", stored}}},
            {"notes", notes}};
  if (auto env = reader.environment())
    j["env"] = environmentJson(*env);
  else
    j["env"] = nullptr;
  if (auto info = reader.recordingInfo()) {
    j["producer"] = info->producer;
    j["tool_version"] = info->toolVersion;
    j["hostname"] = info->hostname;
    j["pid"] = info->pid;
    j["created_ns"] = info->createdNs;
    j["created"] = formats::formatTime(info->createdNs);
  } else {
    j["producer"] = nullptr;
  }
  return j;
}

std::string bundleInfoText(const BundleReader& reader) {
  const auto& h = reader.fileHeader();
  const auto& r = reader.report();
  std::string s;
  s += fmt::format("bundle     {} ({})\n", reader.path(), formatBytes(r.fileSize));
  if (r.fileHeaderDamaged)
    s += "format     unknown (file header damaged)\n";
  else
    s += fmt::format("format     {}.{}, recording {}\n", h.formatMajor, h.formatMinor,
                     formats::formatRecordingId(h.recordingId));
  if (auto info = reader.recordingInfo())
    s += fmt::format("written    {} by {} (crashcap {}) on {}, pid {}\n", formats::formatTime(info->createdNs), info->producer,
                     info->toolVersion, info->hostname.empty() ? "?" : info->hostname, info->pid);
  s += fmt::format("state      {}\n", r.summary());
  std::map<std::string, uint64_t> byType;
  for (const auto& rec : reader.records()) byType[formats::recordTypeName(rec.type)]++;
  std::string types;
  for (const auto& [name, count] : byType) types += fmt::format("{}{} {}", types.empty() ? "" : ", ", name, count);
  s += fmt::format("records    {}{}\n", reader.records().size(), types.empty() ? "" : " (" + types + ")");
  uint64_t raw = 0, stored = 0;
  for (const auto& t : reader.tensors()) {
    raw += t.totalBytes;
    stored += t.storedBytes;
  }
  s += fmt::format("tensors    {}, {} ({} stored{})\n", reader.tensors().size(), formatBytes(raw), formatBytes(stored),
                   stored ? fmt::format(", {:.2f}x", double(raw) / double(stored)) : "");
  if (auto env = reader.environment()) {
    auto f = [&](const char* k) { return env->fact(k).empty() ? std::string("?") : env->fact(k); };
    s += fmt::format("machine    {} ({} logical CPUs), {}, WSL2: {}\n", f("cpu.model"), f("cpu.logical"),
                     f("os.name"), f("os.wsl2"));
    std::string cmd;
    for (const auto& a : env->commandLine) cmd += (cmd.empty() ? "" : " ") + a;
    if (!cmd.empty()) s += fmt::format("command    {}\n", cmd.size() > 200 ? cmd.substr(0, 200) + "..." : cmd);
    for (const auto& [k, v] : env->variables)
      if (k.rfind("CUDA_", 0) == 0 || k.rfind("PYTORCH_", 0) == 0 || k.rfind("TORCH_", 0) == 0 ||
          k.rfind("CUBLAS_", 0) == 0 || k.rfind("NCCL_", 0) == 0)
        s += fmt::format("env        {}={}\n", k, v);
    if (!env->redacted.empty())
      s += fmt::format("redacted   {} value(s) withheld: {}\n", env->redacted.size(), fmt::join(env->redacted, ", "));
  }
  for (const auto& n : reader.notes()) {
    std::string text = n.text;
    if (text.size() > 200) text = text.substr(0, 200) + "...";
    for (auto& c : text)
      if (c == '\n') c = ' ';
    s += fmt::format("note       {}: {}\n", n.key, text);
  }
  for (const auto& [type, count] : r.unknownTypes)
    s += fmt::format("notice     {} record(s) of unknown type {} skipped (written by a newer crashcap?)\n", count, type);
  for (const auto& n : r.notices) s += fmt::format("notice     {}\n", n);
  for (const auto& d : r.damage) s += fmt::format("damage     bytes {}..{}: {}\n", d.offset, d.offset + d.length, d.what);
  for (const auto& l : r.lostTensors)
    s += fmt::format("lost       tensor '{}' ({} of {} chunks present)\n", l.name, l.chunksFound, l.chunkCount);
  if (!r.complete())
    s += fmt::format("hint       `crashcap recover {} OUT.ccap` writes a sealed copy of what is intact\n",
                     reader.path());
  return s;
}

json tensorListJson(const BundleReader& reader) {
  json list = json::array();
  for (const auto& t : reader.tensors())
    list.push_back({{"name", t.name},
                    {"dtype", formats::dtypeName(t.dtype)},
                    {"shape", t.shape},
                    {"bytes", t.totalBytes},
                    {"stored_bytes", t.storedBytes},
                    {"chunks", t.chunkRecords.size()}});
  return {{"path", reader.path()}, {"tensors", list}};
}

std::string tensorListText(const BundleReader& reader) {
  size_t nameWidth = 4, shapeWidth = 5;
  for (const auto& t : reader.tensors()) {
    nameWidth = std::max(nameWidth, t.name.size());
    shapeWidth = std::max(shapeWidth, formats::formatShape(t.shape).size());
  }
  std::string s = fmt::format("{:<{}}  {:<10}  {:<{}}  {:>10}  {:>10}  {:>6}\n", "NAME", nameWidth, "DTYPE", "SHAPE",
                              shapeWidth, "SIZE", "STORED", "CHUNKS");
  for (const auto& t : reader.tensors())
    s += fmt::format("{:<{}}  {:<10}  {:<{}}  {:>10}  {:>10}  {:>6}\n", t.name, nameWidth, formats::dtypeName(t.dtype),
                     formats::formatShape(t.shape), shapeWidth, formatBytes(t.totalBytes), formatBytes(t.storedBytes),
                     t.chunkRecords.size());
  if (reader.tensors().empty()) s += "(no tensors)\n";
  return s;
}

json verifyJson(const std::string& path, const formats::VerifyReport& v) {
  json problems = json::array();
  for (const auto& p : v.problems)
    problems.push_back({{"offset", p.offset}, {"length", p.length}, {"where", p.where}, {"what", p.what}});
  return {{"path", path},
          {"ok", v.ok()},
          {"sealed", v.sealed},
          {"file_size", v.fileSize},
          {"records_checked", v.recordsChecked},
          {"tensors_checked", v.tensorsChecked},
          {"bytes_checked", v.bytesChecked},
          {"problems", problems},
          {"notices", v.notices}};
}

std::string verifyText(const std::string& path, const formats::VerifyReport& v) {
  std::string s;
  for (const auto& p : v.problems)
    s += p.length ? fmt::format("DAMAGED  {} (bytes {}..{}): {}\n", p.where, p.offset, p.offset + p.length, p.what)
                  : fmt::format("DAMAGED  {}: {}\n", p.where, p.what);
  for (const auto& n : v.notices) s += fmt::format("notice   {}\n", n);
  if (v.ok())
    s += fmt::format("OK  {}: {} records, {} tensor{}, {} checked, every checksum matches\n", path, v.recordsChecked,
                     v.tensorsChecked, v.tensorsChecked == 1 ? "" : "s", formatBytes(v.bytesChecked));
  else
    s += fmt::format("FAILED  {}: {} problem{}; `crashcap recover {} OUT.ccap` writes a sealed copy of what is intact\n",
                     path, v.problems.size(), v.problems.size() == 1 ? "" : "s", path);
  return s;
}

json recoverJson(const std::string& in, const std::string& out, const formats::RecoverReport& r) {
  return {{"input", in},
          {"output", out},
          {"records_copied", r.recordsCopied},
          {"tensors_copied", r.tensorsCopied},
          {"bytes_written", r.bytesWritten},
          {"source", reportJson(r.source)}};
}

std::string recoverText(const std::string& in, const std::string& out, const formats::RecoverReport& r) {
  std::string s = fmt::format("source   {}: {}\n", in, r.source.summary());
  for (const auto& l : r.source.lostTensors)
    s += fmt::format("lost     tensor '{}' ({} of {} chunks present)\n", l.name, l.chunksFound, l.chunkCount);
  s += fmt::format("wrote    {}: {} records, {} tensor{}, {} (sealed; {} untouched)\n", out, r.recordsCopied,
                   r.tensorsCopied, r.tensorsCopied == 1 ? "" : "s", formatBytes(r.bytesWritten), in);
  return s;
}

}  // namespace crashcap::inspect
