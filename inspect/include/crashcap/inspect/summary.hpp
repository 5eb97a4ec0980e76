#pragma once
// What the CLI's read commands print about a bundle, as text for people and JSON for scripts.

#include <string>

#include <nlohmann/json.hpp>

#include "crashcap/formats/bundle_check.hpp"
#include "crashcap/formats/bundle_reader.hpp"
#include "crashcap/formats/bundle_writer.hpp"

namespace crashcap::inspect {

/// `crashcap info`: identity, state (sealed / what was recovered and lost), tensors, notes.
nlohmann::json bundleInfoJson(const formats::BundleReader& reader);
std::string bundleInfoText(const formats::BundleReader& reader);

/// `crashcap ls`: one entry per tensor with dtype, shape, sizes and chunk count.
nlohmann::json tensorListJson(const formats::BundleReader& reader);
std::string tensorListText(const formats::BundleReader& reader);

/// `crashcap verify`.
nlohmann::json verifyJson(const std::string& path, const formats::VerifyReport& report);
std::string verifyText(const std::string& path, const formats::VerifyReport& report);

/// `crashcap recover`.
nlohmann::json recoverJson(const std::string& in, const std::string& out, const formats::RecoverReport& report);
std::string recoverText(const std::string& in, const std::string& out, const formats::RecoverReport& report);

/// The environment fingerprint as {"facts", "variables", "command_line", "redacted"}.
nlohmann::json environmentJson(const formats::EnvironmentData& env);

/// "1.5 MiB", "312 B".
std::string formatBytes(uint64_t bytes);

}  // namespace crashcap::inspect
