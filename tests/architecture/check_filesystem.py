#!/usr/bin/env python3
"""No source calls the std::filesystem functions that crashed against LibTorch 2.x.

Official LibTorch 2.x builds link a static copy of libstdc++'s filesystem code and export its
symbols, so a program that links LibTorch binds remove_all (and the recursive directory iterator
it walks with) to that copy, whose remove_all jumped to address 0 in `crashcap replay` on torch
2.11 (docs/ARCHITECTURE.md, "LibTorch versions"). crashcap::formats::removeTree and listDirectory
(formats/directory.hpp) do the same work through the C library. Comments and string literals may
name the functions. Prints each use with its file and line; exit 1 when there is one.

usage: check_filesystem.py SOURCE_DIR
"""
import pathlib
import re
import subprocess
import sys

FORBIDDEN = re.compile(r"\b(remove_all|recursive_directory_iterator)\b")
SOURCES = {".cpp", ".hpp", ".cu", ".h", ".cc"}
STRING = re.compile(r'"(?:\\.|[^"\\])*"' + r"|'(?:\\.|[^'\\])*'")


def source_files(root: pathlib.Path):
    """The tracked files of the checkout; every file under ROOT when it is not a git checkout."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=True).stdout
        return [root / name for name in out.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in root.rglob("*") if not p.relative_to(root).as_posix().startswith((".", "build"))]


def code_of(text: str):
    """Each line's code: string literals blanked, // and /* */ comments removed."""
    in_block = False
    for line in text.splitlines():
        line = STRING.sub('""', line)
        code = ""
        while line:
            if in_block:
                end = line.find("*/")
                if end < 0:
                    line = ""
                else:
                    line, in_block = line[end + 2:], False
                continue
            starts = [i for i in (line.find("//"), line.find("/*")) if i >= 0]
            if not starts:
                code, line = code + line, ""
            elif line.startswith("//", min(starts)):
                code, line = code + line[:min(starts)], ""
            else:
                code, line, in_block = code + line[:min(starts)], line[min(starts) + 2:], True
        yield code


def main() -> int:
    root = pathlib.Path(sys.argv[1])
    found = []
    for path in sorted(source_files(root)):
        if path.suffix not in SOURCES or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for number, code in enumerate(code_of(text), 1):
            if FORBIDDEN.search(code):
                found.append(f"{path.relative_to(root).as_posix()}:{number}: {text.splitlines()[number - 1].strip()}")
    for f in found:
        print(f"{f}\n  use crashcap::formats::removeTree / listDirectory (formats/directory.hpp) instead")
    print(f"{len(found)} use(s) of std::filesystem functions that crashed against LibTorch 2.x")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
