#pragma once
// Why a bundle holds nothing to replay, in words its user can act on.
#include <string>

#include "crashcap/formats/error.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/records.hpp"

namespace crashcap::replayer {

/// The error for a bundle with no step program record, saying why it has none: the process
/// ended before its training's first batch under `crashcap run --record` (where recording
/// begins), or it ran under `crashcap run` without a recorder, or a Python training recorded from
/// outside made its batches itself; otherwise how to record one.
Error noStepProgram(const std::string& bundle, const formats::BundleReader& reader, const formats::BundleRecords& view);

}  // namespace crashcap::replayer
