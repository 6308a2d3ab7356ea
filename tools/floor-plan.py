#!/usr/bin/env python3
"""Checks src/ against its floor plan (docs/design.md, "Where things live"):

- every core room imports only the rooms below it (ROOMS, bottom-up);
- no two files import each other, directly or around a longer circle;
- no source file passes 400 lines, and each opens with `//!` lines saying its job.

Imports are read from `use crate::...` / `crate::...::` paths and `super::` in the sources.
A parent module's `mod` lines are declarations, not imports, so a room's mod.rs may declare
its files while they import it.
"""
import os
import re
import sys

ROOMS = ["error", "layout", "mlx", "model", "kernels", "storage", "cache", "attention", "persist", "store", "transfer"]
# What each room may import besides itself (DESIGN: error at the bottom; attention and persist
# side by side on top).
ALLOWED = {
    "error": set(),
    "layout": {"error"},
    "mlx": {"error"},
    "model": {"error", "layout"},
    "kernels": {"error", "mlx", "model"},
    "storage": {"error", "layout", "mlx", "model", "kernels"},
    "cache": {"error", "layout", "mlx", "model", "kernels", "storage"},
    "attention": {"error", "layout", "mlx", "model", "kernels", "storage", "cache"},
    "persist": {"error", "layout", "mlx", "model", "kernels", "storage", "cache"},
    "store": {"error", "layout", "mlx", "model", "kernels", "storage", "cache", "persist"},
    "transfer": {"error", "layout", "mlx", "model", "kernels", "storage", "cache", "persist"},
}
MAX_LINES = 400


def module_of(path):
    """src/core/cache/rows.rs -> ['core', 'cache', 'rows']"""
    parts = os.path.relpath(path, "src")[:-3].split(os.sep)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return parts


def resolve(module, files):
    """The longest prefix of a module path that is a file of ours."""
    for n in range(len(module), 0, -1):
        if tuple(module[:n]) in files:
            return tuple(module[:n])
    return None


def strip_tests(text):
    # Unit tests (`#[cfg(test)] mod tests { ... }`) may import what they test from anywhere.
    i = text.find("#[cfg(test)]")
    return text if i < 0 else text[:i]


def main():
    files = {}
    for root, _, names in os.walk("src"):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(root, name)
                files[tuple(module_of(path))] = path
    problems = []
    edges = {m: set() for m in files}
    for module, path in files.items():
        text = open(path).read()
        lines = text.count("\n")
        if lines > MAX_LINES:
            problems.append(f"{path}: {lines} lines (at most {MAX_LINES})")
        if not text.startswith("//!"):
            problems.append(f"{path}: does not open with //! lines saying its job")
        body = strip_tests(text)
        targets = set()
        for m in re.finditer(r"(?<![\w$])crate::((?:\w+::)*\w+)", body):
            targets.add(tuple(m.group(1).split("::")))
        for m in re.finditer(r"\b((?:super::)+)((?:\w+::)*\w+)?", body):
            # `super` is the parent of this file's module, whether it is a mod.rs or not.
            base = list(module)[: len(module) - m.group(1).count("super")]
            rest = m.group(2).split("::") if m.group(2) else []
            targets.add(tuple(base + rest))
        for target in targets:
            dest = resolve(list(target), files)
            if dest is None or dest == module or not module:
                continue
            # A module importing its own parent (a room's mod.rs) is the room's own API, not a
            # circle: the parent declares its children and may re-export from them.
            if module[: len(dest)] == dest:
                continue
            edges[module].add(dest)
            if module[0] == "core" and dest[0] == "core" and len(module) > 1 and len(dest) > 1:
                src_room, dst_room = module[1], dest[1]
                if src_room != dst_room and dst_room not in ALLOWED.get(src_room, set()):
                    problems.append(f"{path}: room `{src_room}` imports `{'::'.join(dest)}` (room `{dst_room}`)")
            if module[0] == "core" and dest[0] == "ffi":
                problems.append(f"{path}: the core imports the C layer ({'::'.join(dest)})")
    # Circles: a depth-first search over file-level imports.
    state = {}
    stack = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                circle = stack[stack.index(d):] + [d]
                problems.append("import circle: " + " -> ".join("::".join(x) for x in circle))
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} floor-plan problem(s); see docs/design.md, \"Where things live\"")
        sys.exit(1)
    print(f"floor plan: {len(files)} files, rooms as planned, no import circles, none over {MAX_LINES} lines")


if __name__ == "__main__":
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    main()
