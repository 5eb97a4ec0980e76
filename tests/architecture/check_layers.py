#!/usr/bin/env python3
"""The dependency rules of docs/ARCHITECTURE.md, checked on the sources.

Every `#include "crashcap/..."` of a library must name a library that library may depend on
(its own, or one below it), and the libraries that build without LibTorch must include no
LibTorch header. Prints each violation with its file and line; exit 1 when there is one.

usage: check_layers.py SOURCE_DIR
"""
import pathlib
import re
import sys

# What each library may include besides itself (direct dependencies and what they expose).
ALLOWED = {
    "formats": set(),
    "formats_torch": {"formats"},
    "inspect": {"formats"},
    "cupti": {"formats"},
    "recorder_core": {"formats", "cupti"},
    "fault_injection": {"formats", "formats_torch"},
    "recorder": {"recorder_core", "formats_torch", "formats", "cupti", "replayer"},
    "supervisor": {"recorder_core", "cupti", "inspect", "formats"},
    "replayer": {"formats", "formats_torch", "fault_injection"},
    "investigate": {"replayer", "supervisor", "inspect", "formats_torch", "formats"},
    # The Python package's extension: a front end beside the CLI, over the recorder and replayer.
    "python": {"recorder", "recorder_core", "replayer", "supervisor", "formats_torch", "formats", "cupti"},
}
WITHOUT_TORCH = {"formats", "inspect", "cupti", "recorder_core", "supervisor"}
TORCH_HEADER = re.compile(r'#\s*include\s*[<"](torch/|ATen/|c10/|caffe2/)')
CRASHCAP_HEADER = re.compile(r'#\s*include\s*"(crashcap/[^"]+)"')
# The Recorder's own files; the rest of recorder/ is recorder_core.
RECORDER_FILES = {"recorder.hpp", "recorder.cpp", "op_ring.hpp", "op_ring.cpp"}


def library_of_source(rel: pathlib.PurePosixPath):
    parts = rel.parts
    if parts[0] == "formats":
        return "formats_torch" if len(parts) > 1 and parts[1] == "torch" else "formats"
    if parts[0] == "recorder":
        if len(parts) > 1 and parts[1] == "cupti":
            return "cupti"
        return "recorder" if rel.name in RECORDER_FILES else "recorder_core"
    if parts[0] == "testing":
        return "fault_injection"
    if parts[0] in ALLOWED:
        return parts[0]
    return None


def library_of_header(include: str):
    parts = include.split("/")  # crashcap/<lib>/...
    lib = parts[1]
    if lib == "formats":
        return "formats_torch" if parts[2] == "torch" else "formats"
    if lib == "recorder":
        return "recorder" if parts[-1] in RECORDER_FILES else "recorder_core"
    if lib == "testing":
        return "fault_injection"
    return lib


def main(root: pathlib.Path) -> int:
    problems = []
    checked = 0
    for path in sorted(root.rglob("*")):
        if path.suffix not in {".hpp", ".cpp", ".h", ".def"} or not path.is_file():
            continue
        rel = pathlib.PurePosixPath(path.relative_to(root).as_posix())
        if rel.parts[0].startswith("build"):
            continue
        lib = library_of_source(rel)
        if lib is None:
            continue
        checked += 1
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = CRASHCAP_HEADER.search(line)
            if m:
                target = library_of_header(m.group(1))
                if target != lib and target not in ALLOWED[lib]:
                    problems.append(f"{rel}:{number}: {lib} includes {m.group(1)} ({target}), "
                                    f"which it may not depend on (allowed: {', '.join(sorted(ALLOWED[lib])) or 'nothing'})")
            if lib in WITHOUT_TORCH and TORCH_HEADER.search(line):
                problems.append(f"{rel}:{number}: {lib} builds without LibTorch but includes a LibTorch header")
    for p in problems:
        print(p)
    print(f"checked the includes of {checked} library files: {len(problems)} violation(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(pathlib.Path(sys.argv[1])))
