"""Writes the README's example programs to files so `make test` can compile and run them.

`python3 tools/readme-examples.py README.md OUT_DIR`: every fenced code block preceded by a line
`<!-- make test: NAME -->` is written to OUT_DIR/NAME; the names are printed, one per line.
Fails when the README has no such block (an example that silently stopped being tested).
"""
import re
import sys
from pathlib import Path


def main():
    readme, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    pattern = re.compile(r"<!-- make test: ([\w.-]+) -->\n```\w*\n(.*?)```", re.S)
    found = pattern.findall(readme.read_text())
    if not found:
        sys.exit(f"{readme}: no '<!-- make test: NAME -->' example blocks")
    for name, code in found:
        (out / name).write_text(code)
        print(name)


if __name__ == "__main__":
    main()
