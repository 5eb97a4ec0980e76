#include "crashcap/inspect/import.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_writer.hpp"
#include "crashcap/formats/error.hpp"
#include "crashcap/formats/tensor_info.hpp"
#include "crashcap/inspect/npy.hpp"

namespace crashcap::inspect {

ImportReport importNpyFiles(const std::string& out, const std::vector<ImportItem>& items, const ImportOptions& options) {
  for (const auto& it : items) formats::validateTensorName(it.name);
  if (!options.overwrite && access(out.c_str(), F_OK) == 0)
    throw Error(ErrorCode::InvalidArgument, fmt::format("{} already exists", out), "pass --force to replace it");
  // Read every input before creating the output, so a bad file leaves nothing behind.
  std::vector<HostTensor> tensors;
  for (const auto& it : items)
    tensors.push_back(withContext("while importing " + it.file, [&] { return readNpy(it.file); }));
  formats::PartialOutput output(out);
  formats::WriterOptions w;
  w.zstdLevel = options.zstdLevel;
  w.overwrite = true;  // OUT.partial: a leftover of an earlier failed run is ours to replace
  w.producer = "crashcap import";
  auto writer = formats::BundleWriter::create(output.path(), w);
  for (size_t i = 0; i < items.size(); ++i) {
    writer->writeTensor(items[i].name, tensors[i].dtype, tensors[i].shape, tensors[i].bytes.data(), tensors[i].bytes.size());
    writer->writeNote("crashcap.import.source", items[i].name + "=" + items[i].file);
  }
  for (const auto& [k, v] : options.notes) writer->writeNote(k, v);
  writer->seal();
  output.commit();
  return {items.size(), writer->stats().fileBytes};
}

}  // namespace crashcap::inspect
