#!/usr/bin/env python3
"""coverage.py: fails unless the Swift layer calls every function of the C API.

Lists each `latent_cache_*` function declared in the header that no Swift file under the
given folder calls (a name followed by `(`), and fails unless every one left is in the
allow-list, one `name: reason` a line (`#` starts a comment). Allow-list entries whose
function is covered, or no longer declared, fail too, so the list never goes stale.

  coverage.py HEADER SWIFT_SOURCES ALLOW_LIST
"""
import pathlib
import re
import sys


def main(header, sources, allow_path):
    text = pathlib.Path(header).read_text()
    # Declarations: a return type, the name, then its parameter list.
    declared = sorted(set(re.findall(r"^[A-Za-z_][\w \*]*?\b(latent_cache_\w+)\(", text, re.M)))
    swift = "\n".join(p.read_text() for p in sorted(pathlib.Path(sources).rglob("*.swift")))
    # Line comments are not calls.
    swift = re.sub(r"//[^\n]*", "", swift)
    called = set(re.findall(r"\b(latent_cache_\w+)\s*\(", swift))
    allowed = {}
    for line in pathlib.Path(allow_path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, reason = line.partition(":")
            if not reason.strip():
                sys.exit(f"coverage: {allow_path}: {name.strip()} has no reason")
            allowed[name.strip()] = reason.strip()
    missing = [f for f in declared if f not in called]
    bad = [f for f in missing if f not in allowed]
    stale = [f for f in allowed if f not in missing]
    print(f"coverage: {len(declared)} functions in the header, {len(declared) - len(missing)} called from Swift")
    for f in missing:
        if f in allowed:
            print(f"  not called (allowed): {f}: {allowed[f]}")
    for f in bad:
        print(f"  NOT CALLED: {f}")
    for f in stale:
        print(f"  STALE allow-list entry (called, or not declared): {f}")
    if bad or stale:
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
