#include "zip_writer.hpp"

#include <fmt/format.h>
#include <zip.h>

#include <cstdio>

#include "crashcap/formats/error.hpp"

namespace crashcap::investigate {

void writeZip(const std::string& path, const std::vector<ZipEntry>& entries) {
  int code = 0;
  zip_t* archive = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &code);
  if (!archive) {
    zip_error_t error;
    zip_error_init_with_code(&error, code);
    std::string why = zip_error_strerror(&error);
    zip_error_fini(&error);
    throw Error(ErrorCode::Io, fmt::format("cannot create {}: {}", path, why));
  }
  auto fail = [&](const std::string& what) {
    std::string why = zip_strerror(archive);
    zip_discard(archive);
    std::remove(path.c_str());
    throw Error(ErrorCode::Io, fmt::format("cannot write {} into {}: {}", what, path, why));
  };
  for (const auto& e : entries) {
    // libzip reads the sources when the archive is closed: the text must outlive zip_close, and does
    // (it lives in `entries`).
    zip_source_t* source = e.file.empty() ? zip_source_buffer(archive, e.text.data(), e.text.size(), 0)
                                          : zip_source_file(archive, e.file.c_str(), 0, -1);  // -1: to its end
    if (!source) fail(e.name);
    const zip_int64_t index = zip_file_add(archive, e.name.c_str(), source, ZIP_FL_ENC_UTF_8 | ZIP_FL_OVERWRITE);
    if (index < 0) {
      zip_source_free(source);
      fail(e.name);
    }
    if (zip_set_file_compression(archive, static_cast<zip_uint64_t>(index), e.compress ? ZIP_CM_DEFLATE : ZIP_CM_STORE,
                                 0) != 0)
      fail(e.name);
  }
  if (zip_close(archive) != 0) fail("the archive");
}

}  // namespace crashcap::investigate
