// Removing and listing directory trees without std::filesystem's out-of-line functions
// (formats/directory.hpp): what `rm -rf` and a sorted `ls` would do, links included.
#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "crashcap/formats/directory.hpp"

using namespace crashcap;

namespace {

std::string makeTempDir() {
  std::string templ = "/tmp/crashcap-directory-test-XXXXXX";
  REQUIRE(::mkdtemp(templ.data()) != nullptr);
  return templ;
}

void writeFile(const std::string& path) { std::ofstream(path) << "x"; }

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

TEST_CASE("removeTree removes a tree as rm -rf does, without following links", "[formats][directory]") {
  const std::string root = makeTempDir();
  const std::string outside = makeTempDir();
  writeFile(outside + "/keep");
  REQUIRE(::mkdir((root + "/a").c_str(), 0755) == 0);
  REQUIRE(::mkdir((root + "/a/b").c_str(), 0755) == 0);
  writeFile(root + "/a/b/deep");
  writeFile(root + "/top");
  REQUIRE(::symlink(outside.c_str(), (root + "/a/link-to-dir").c_str()) == 0);
  REQUIRE(::symlink((outside + "/keep").c_str(), (root + "/link-to-file").c_str()) == 0);
  REQUIRE(::symlink("/nonexistent/target", (root + "/dangling").c_str()) == 0);

  CHECK(formats::removeTree(root).empty());
  CHECK(!exists(root));
  // What the links pointed at is untouched.
  CHECK(exists(outside + "/keep"));

  CHECK(formats::removeTree(root).empty());  // absent: no error
  CHECK(formats::removeTree(outside + "/keep").empty());  // a plain file
  CHECK(!exists(outside + "/keep"));
  CHECK(!formats::removeTree("").empty());
  CHECK(formats::removeTree(outside).empty());
}

TEST_CASE("removeTree takes a path through a file as absent, as rm -rf does", "[formats][directory]") {
  const std::string root = makeTempDir();
  writeFile(root + "/file");
  CHECK(formats::removeTree(root + "/file/below").empty());
  CHECK(exists(root + "/file"));
  CHECK(formats::removeTree(root).empty());
}

TEST_CASE("removeTree removes a link named with a trailing slash, not what it points at", "[formats][directory]") {
  const std::string root = makeTempDir();
  const std::string outside = makeTempDir();
  writeFile(outside + "/keep");
  REQUIRE(::symlink(outside.c_str(), (root + "/link").c_str()) == 0);
  CHECK(formats::removeTree(root + "/link/").empty());
  CHECK(!exists(root + "/link"));
  CHECK(exists(outside + "/keep"));
  CHECK(formats::removeTree("/").find("refusing") != std::string::npos);
  CHECK(formats::removeTree(root).empty());
  CHECK(formats::removeTree(outside).empty());
}

TEST_CASE("removeTree refuses a path ending in . or .., as rm -rf does, and removes nothing", "[formats][directory]") {
  const std::string root = makeTempDir();
  REQUIRE(::mkdir((root + "/sub").c_str(), 0755) == 0);
  writeFile(root + "/sub/keep");
  for (const std::string& path : {root + "/sub/.", root + "/sub/..", root + "/sub/../", std::string("/."),
                                  std::string("/.."), std::string(".."), std::string(".")}) {
    CAPTURE(path);
    CHECK(formats::removeTree(path).find("refusing") != std::string::npos);
  }
  CHECK(exists(root + "/sub/keep"));
  CHECK(formats::removeTree(root).empty());
}

TEST_CASE("removeTree names the path it could not remove and why, and removes the rest", "[formats][directory]") {
  // A file of the proc file system cannot be unlinked, not even by root.
  const std::string proc = formats::removeTree("/proc/self/status");
  CHECK(proc.find("cannot remove /proc/self/status") != std::string::npos);
  if (::geteuid() == 0) {
    WARN("skipped: root may remove entries of a directory it cannot write");
    return;
  }
  const std::string root = makeTempDir();
  REQUIRE(::mkdir((root + "/locked").c_str(), 0755) == 0);
  writeFile(root + "/locked/stuck");
  writeFile(root + "/other");
  REQUIRE(::chmod((root + "/locked").c_str(), 0555) == 0);
  const std::string error = formats::removeTree(root);
  CHECK(error.find(root + "/locked/stuck") != std::string::npos);
  CHECK(error.find("Permission denied") != std::string::npos);
  CHECK(!exists(root + "/other"));
  CHECK(exists(root + "/locked/stuck"));
  REQUIRE(::chmod((root + "/locked").c_str(), 0755) == 0);
  CHECK(formats::removeTree(root).empty());
  CHECK(!exists(root));
}

TEST_CASE("listDirectory lists names sorted, with directories and links told apart", "[formats][directory]") {
  const std::string root = makeTempDir();
  REQUIRE(::mkdir((root + "/sub").c_str(), 0755) == 0);
  writeFile(root + "/b.ccap");
  writeFile(root + "/.hidden");
  REQUIRE(::symlink((root + "/sub").c_str(), (root + "/a-link").c_str()) == 0);
  REQUIRE(::symlink("/nonexistent/target", (root + "/dangling").c_str()) == 0);

  std::vector<formats::DirectoryEntry> entries;
  REQUIRE(formats::listDirectory(root, entries).empty());
  REQUIRE(entries.size() == 5);
  CHECK(entries[0].name == ".hidden");
  CHECK(!entries[0].directory);
  CHECK(entries[1].name == "a-link");
  CHECK(entries[1].directory);
  CHECK(entries[1].symlink);
  CHECK(entries[2].name == "b.ccap");
  CHECK(!entries[2].directory);
  CHECK(!entries[2].symlink);
  CHECK(entries[3].name == "dangling");
  CHECK(entries[3].symlink);
  CHECK(!entries[3].directory);
  CHECK(entries[4].name == "sub");
  CHECK(entries[4].directory);
  CHECK(!entries[4].symlink);

  const std::string missing = formats::listDirectory(root + "/nope", entries);
  CHECK(missing == "cannot open it: No such file or directory");
  CHECK(entries.empty());
  const std::string notDir = formats::listDirectory(root + "/b.ccap", entries);
  CHECK(notDir.find("Not a directory") != std::string::npos);
  CHECK(formats::removeTree(root).empty());
}
