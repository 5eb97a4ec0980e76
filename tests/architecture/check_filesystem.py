#!/usr/bin/env python3
"""No source calls the std::filesystem functions that official LibTorch 2.x builds interpose.

Those builds link a static copy of libstdc++'s filesystem code and export its symbols, so a
program that links LibTorch binds remove_all and the recursive directory iterator to that copy,
which crashed `crashcap replay` on torch 2.11 (docs/ARCHITECTURE.md, "LibTorch versions").
crashcap::formats::removeTree and listDirectory (formats/directory.hpp) do the same work through
the C library. Prints each use with its file and line; exit 1 when there is one.

usage: check_filesystem.py SOURCE_DIR
"""
import pathlib
import re
import sys

FORBIDDEN = re.compile(r"\b(remove_all|recursive_directory_iterator)\b")
SOURCES = {".cpp", ".hpp", ".cu", ".h", ".cc"}
# The one file that names them to say why they are not used.
EXEMPT = {"formats/include/crashcap/formats/directory.hpp"}


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    found = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.suffix not in SOURCES or rel in EXEMPT or rel.split("/")[0].startswith((".", "build")):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            code = line.split("//", 1)[0]
            if FORBIDDEN.search(code):
                found.append(f"{rel}:{number}: {line.strip()}")
    for f in found:
        print(f"{f}\n  use crashcap::formats::removeTree / listDirectory (formats/directory.hpp) instead")
    print(f"{len(found)} use(s) of std::filesystem functions that LibTorch 2.x interposes")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
