#!/usr/bin/env python3
"""bash32-lint.py: the shell that `make test` runs on a Mac is /bin/bash 3.2, so every script
and Makefile recipe it runs must keep to what 3.2 has. This finds what it lacks (our machines
run bash 5, so a script that works here proves nothing about 3.2):

- `"${a[@]}"` of an array that may be empty: bash < 4.4 calls it unbound under `set -u`. Write
  `${a[@]+"${a[@]}"}`, or end the line with `# bash32: non-empty` when the array never is.
- associative arrays, namerefs, `mapfile`/`readarray`, case changes (`${x,,}`, `${x^^}`),
  `&>>`, `|&`, `;;&`, `;&`, `coproc`, `wait -n`, `[[ -v`, negative subscripts, `${x@Q}`,
  brace ranges with a step.

Usage: bash32-lint.py FILE... (Makefiles: only recipe lines, with `$$` read as `$`).
"""
import re
import sys

RULES = [
    (re.compile(r'(?<!\+)"\$\{[A-Za-z_][A-Za-z0-9_]*\[@\][^}]*\}"'), 'array expansion that fails under set -u when empty'),
    (re.compile(r'\b(declare|local|typeset)\s+-[a-zA-Z]*[An]'), 'associative array or nameref (bash 4)'),
    (re.compile(r'\b(mapfile|readarray|coproc)\b'), 'bash 4 builtin'),
    (re.compile(r'\$\{[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?(,,|\^\^|,|\^)\}'), 'case change (bash 4)'),
    (re.compile(r'&>>|\|&'), 'bash 4 redirection'),
    (re.compile(r';;&|;&'), 'bash 4 case fall-through'),
    (re.compile(r'\bwait\s+-n\b'), 'wait -n (bash 4.3)'),
    (re.compile(r'\[\[\s+-v\b|\btest\s+-v\b'), '-v test (bash 4.2)'),
    (re.compile(r'\$\{[A-Za-z_][A-Za-z0-9_]*\[-[0-9]+\]\}'), 'negative subscript (bash 4.3)'),
    (re.compile(r'\$\{[^}]*@[QEPAaKk]\}'), 'parameter transformation (bash 4.4)'),
    (re.compile(r'\{[0-9]+\.\.[0-9]+\.\.[0-9]+\}'), 'brace range with a step (bash 4)'),
]


def lines_of(path):
    text = open(path, encoding='utf-8').read().split('\n')
    make = path.endswith(('Makefile', '.mk'))
    for number, line in enumerate(text, 1):
        if make:
            if not line.startswith('\t'):
                continue
            line = line.replace('$$', '$')
        if line.lstrip().startswith('#'):
            continue
        yield number, line


def main(paths):
    problems = []
    for path in paths:
        for number, line in lines_of(path):
            if line.rstrip().endswith('# bash32: non-empty'):
                line = line[: line.rindex('#')]
            for pattern, why in RULES:
                if pattern.search(line):
                    problems.append(f'{path}:{number}: {why}: {line.strip()}')
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f'bash32-lint: {len(problems)} construct(s) macOS /bin/bash 3.2 lacks', file=sys.stderr)
        return 1
    print(f'bash32-lint: {len(paths)} files keep to bash 3.2')
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
