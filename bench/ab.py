"""Compares this tree's benchmark driver with another build's, side by side in one run.

`python3 bench/ab.py --new BIN --base BIN --rounds N --out DIR -- DRIVER ARGS...` runs the two
latent-cache-bench binaries alternately N times with the same arguments (so a noisy moment on a
shared machine lands on both), then writes DIR/ab.md: per system, scenario and point, the median
over rounds of each build's median step time and their ratio (new / base; below 1 is faster).
`make bench-ab BASE=<git revision>` builds the base and calls this.
"""
import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def run(binary, args, out):
    subprocess.run([binary, *args, "--out", str(out)], check=True, stderr=subprocess.DEVNULL)
    return {(r["system"], r["scenario"], r["batch"], r["context"]): r["median_us"] for r in json.loads(out.read_text())}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--new", required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--base-name", default="base")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("driver_args", nargs=argparse.REMAINDER)
    a = parser.parse_args()
    args = [x for x in a.driver_args if x != "--"]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = {"new": [], "base": []}
    for i in range(a.rounds):
        # Alternate which build goes first, so neither always runs on a freshly settled machine.
        order = ["new", "base"] if i % 2 == 0 else ["base", "new"]
        for which in order:
            binary = a.new if which == "new" else a.base
            runs[which].append(run(binary, args, out / f"{which}{i}.json"))
            print(f"bench-ab: round {i + 1}/{a.rounds} {which} done", file=sys.stderr)
    keys = sorted(set(runs["new"][0]) & set(runs["base"][0]))
    lines = [
        f"# This tree against {a.base_name}, side by side in one run",
        "",
        f"Driver arguments: `{' '.join(args)}`; {a.rounds} rounds, the two builds alternating. "
        "Each cell is the median over rounds of that build's median step time (ms); ratio = this tree / base.",
        "",
        "| system | scenario | batch | context | this tree ms | base ms | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        new = statistics.median(r[key] for r in runs["new"] if key in r) / 1000
        base = statistics.median(r[key] for r in runs["base"] if key in r) / 1000
        system, scenario, batch, context = key
        lines.append(f"| {system} | {scenario} | {batch} | {context} | {new:.3f} | {base:.3f} | {new / base:.2f}x |")
    (out / "ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
