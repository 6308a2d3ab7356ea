"""Compares this tree's benchmark driver with another build's, side by side in one run.

`python3 bench/ab.py --new BIN --base BIN --rounds N --out DIR -- DRIVER ARGS...` runs the two
latent-cache-bench binaries alternately N times with the same arguments (so a noisy moment on a
shared machine lands on both), then writes DIR/ab.md: per system, scenario and point, each build's
best and median (over rounds) of its median step time, and the ratio of the bests (new / base;
below 1 is faster). The best is the headline because timing on shared machines is bimodal:
whole runs land 1.5-2x slow at random (seen on the 2-core build machines), and the best of
several alternating runs compares the builds on the same footing; the medians show the spread.
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
        "Each build's step time per round is its driver's median; cells give the best and the median over rounds (ms). "
        "Ratio = this tree's best / base's best.",
        "",
        "| system | scenario | batch | context | this tree best (median) | base best (median) | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        new = [r[key] / 1000 for r in runs["new"] if key in r]
        base = [r[key] / 1000 for r in runs["base"] if key in r]
        system, scenario, batch, context = key
        lines.append(
            f"| {system} | {scenario} | {batch} | {context} | {min(new):.3f} ({statistics.median(new):.3f}) "
            f"| {min(base):.3f} ({statistics.median(base):.3f}) | {min(new) / min(base):.2f}x |"
        )
    (out / "ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
