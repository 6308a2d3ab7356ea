"""The whole decode step's part of the benchmark report (`latent-cache-bench --model-step` and
bench/mlx_lm_model_step.py): per storage mode, each system's step single and pipelined, our
sparse step against the others, the bandwidth floor; the issue's goals at 1 x 128K in bfloat16;
and model_step.png (ms per step against context, batch 1, bfloat16). Used by report.py."""

DENSE, SPARSE = "model step, dense", "model step, sparse (DSA)"
EARLIER = "model step, sparse (DSA), gathered, argpartition top-k (earlier path)"
MLX_DENSE, MLX_PRESET = "mlx-lm dense", "mlx-lm sparse (DSA)"
MLX_EVERY = "mlx-lm sparse (DSA, indexer on every layer)"
SYSTEMS = [DENSE, SPARSE, EARLIER, MLX_DENSE, MLX_PRESET, MLX_EVERY]
# MLX's own floor for the sparse step's count of operations (bench/src/ops_floor.rs).
FLOOR = "MLX floor, "
# The H200's memory bandwidth, for the floor (bytes read / bandwidth); on other devices the
# floor is shown against it too and says only how far the step is from reading its bytes there.
BANDWIDTH = 4.8e12


def split(records):
    """The model step's timed records (they carry "timing") and the rest."""
    steps = [r for r in records if "timing" in r]
    return steps, [r for r in records if "timing" not in r]


def _index(steps):
    return {(r["system"], r["mode"], r["timing"], r["batch"], r["context"]): r for r in steps}


def _ms(r):
    return r["median_us"] / 1000 if r else None


def goals(steps):
    """The issue's goals for the whole step, at 1 x 128K in bfloat16 (16K for the last)."""
    by = _index(steps)
    out = []

    def at(system, timing, context):
        return _ms(by.get((system, "bf16", timing, 1, context)))

    def check(name, values, ok, detail):
        met = None if any(v is None for v in values) else ok(*values)
        out.append({"goal": name, "met": met, "detail": detail(*values) if met is not None else "not measured"})

    big = 131072
    for timing in ("single", "pipelined"):
        check(f"whole sparse step at least 10x faster than mlx-lm's as it runs GLM-5 (1 x 128K, bf16, {timing})",
              [at(SPARSE, timing, big), at(MLX_EVERY, timing, big)], lambda s, m: m / s >= 10,
              lambda s, m: f"{m / s:.1f}x ({s:.2f} against {m:.2f} ms)")
        check(f"whole sparse step at least 3x faster than our dense step (1 x 128K, bf16, {timing})",
              [at(SPARSE, timing, big), at(DENSE, timing, big)], lambda s, d: d / s >= 3,
              lambda s, d: f"{d / s:.2f}x ({s:.2f} against {d:.2f} ms)")
    floor = next((r["bytes_read"] / BANDWIDTH * 1e3 for r in steps
                  if (r["system"], r["mode"], r["batch"], r["context"]) == (SPARSE, "bf16", 1, big)), None)
    check("whole sparse step within 5x of its bandwidth floor (1 x 128K, bf16, pipelined)",
          [at(SPARSE, "pipelined", big), floor], lambda s, f: s <= 5 * f,
          lambda s, f: f"{s / f:.0f}x ({s:.2f} ms against {f:.3f} ms at 4.8 TB/s)")
    check("whole sparse step no slower than dense at 16K (1 x 16K, bf16, single)",
          [at(SPARSE, "single", 16384), at(DENSE, "single", 16384)], lambda s, d: s <= d,
          lambda s, d: f"sparse {s:.2f} against dense {d:.2f} ms")
    return out


def section(steps, ops):
    """Markdown lines under the report's "The whole decode step" heading: a table per storage
    mode, the peaks, then the operation counts."""
    if not steps and not ops:
        return []
    by = _index(steps)
    md = ["",
          "78 layers' appends and attention as one graph per step; sparse runs DSA on GLM-5.2's 21 "
          "indexer layers. ms single / pipelined (median); ratios are the other system's time over our "
          "sparse step's, from this run; the floor is the bytes the sparse step reads at 4.8 TB/s.", ""]
    for mode in sorted({r["mode"] for r in steps}, key=lambda m: (m != "bf16", m)):
        present = [s for s in SYSTEMS if any(r["system"] == s and r["mode"] == mode for r in steps)]
        points = sorted({(r["batch"], r["context"]) for r in steps if r["mode"] == mode})
        md += [f"### {mode}", "",
               "| batch x context | " + " | ".join(present) + " | " +
               " | ".join(f"{s} / sparse" for s in present if s != SPARSE) + " | floor (sparse / floor) |",
               "|---|" + "---|" * (2 * len(present))]
        for batch, context in points:
            def cell(s):
                one, two = (_ms(by.get((s, mode, t, batch, context))) for t in ("single", "pipelined"))
                return f"{one:.2f} / {two:.2f}" if one and two else "-"

            ours = _ms(by.get((SPARSE, mode, "single", batch, context)))
            ratios = []
            for s in present:
                if s == SPARSE:
                    continue
                other = _ms(by.get((s, mode, "single", batch, context)))
                ratios.append(f"{other / ours:.2f}x" if other and ours else "-")
            r = by.get((SPARSE, mode, "single", batch, context))
            floor = r["bytes_read"] / BANDWIDTH * 1e3 if r else None
            floor_cell = f"{floor:.3f} ms ({ours / floor:.0f}x)" if floor and ours else "-"
            md.append(f"| {batch} x {context // 1024}K | " + " | ".join(cell(s) for s in present) + " | " +
                      " | ".join(ratios) + f" | {floor_cell} |")
        md.append("")
    peaks = [r for r in steps if r.get("peak_bytes_above_start") is not None and r["timing"] in ("single", "pipelined")]
    if peaks:
        md += ["### Peak memory above the start", "",
               "MLX's peak memory above the step loop's start (MB), single and pipelined: a pipelined loop "
               "whose appends copied the buffers the step in flight reads would show here.", "",
               "| system | mode | batch x context | single ms (peak MB) | pipelined ms (peak MB) | pipelined / single |",
               "|---|---|---|---|---|---|"]
        for s in SYSTEMS:
            for mode in sorted({r["mode"] for r in peaks}, key=lambda m: (m != "bf16", m)):
                for batch, context in sorted({(r["batch"], r["context"]) for r in peaks if r["system"] == s and r["mode"] == mode}):
                    one, two = (by.get((s, mode, t, batch, context)) for t in ("single", "pipelined"))
                    if not (one and two):
                        continue
                    cells = [f"{r['median_us'] / 1000:.2f} ({r['peak_bytes_above_start'] / 1e6:.1f})"
                             if r.get("peak_bytes_above_start") is not None else f"{r['median_us'] / 1000:.2f}" for r in (one, two)]
                    md.append(f"| {s} | {mode} | {batch} x {context // 1024}K | {cells[0]} | {cells[1]} | "
                              f"{two['median_us'] / one['median_us']:.2f}x |")
        md.append("")
    if ops:
        md += ["### MLX operations per step (batch 1)", "",
               "| system | mode | step | indexer layer (2) | next layer (3) |", "|---|---|---|---|---|"]
        seen = set()
        for r in ops:
            key = (r["system"], r["mode"])
            if key not in seen:
                seen.add(key)
                md.append(f"| {r['system']} | {r['mode']} | {r['ops']} | {r['ops_layer_2']} | {r['ops_layer_3']} |")
        md.append("")
    floors = [r for r in steps if r["system"].startswith(FLOOR)]
    if floors:
        md += ["### MLX's own floor for the sparse step's operations", "",
               "A plain graph of as many MLX operations as the sparse step builds (as many slice updates, each "
               "writing one position of a small buffer in place, and products of a few elements for the rest), "
               "with next to no device work: about what MLX itself charges for that many operations on this "
               "machine (ms, median), whatever the step's kernels do.", "",
               "| mode | batch x context | operations | floor single / pipelined | sparse step single / pipelined | "
               "floor / step (single) |", "|---|---|---|---|---|---|"]
        for mode, batch, context, count in sorted({(r["mode"], r["batch"], r["context"], r["ops"]) for r in floors}):
            f1, f2 = (_ms(by.get((floor_system(count), mode, t, batch, context))) for t in ("single", "pipelined"))
            s1, s2 = (_ms(by.get((SPARSE, mode, t, batch, context))) for t in ("single", "pipelined"))
            step = f"{s1:.2f} / {s2:.2f}" if s1 and s2 else "-"
            share = f"{f1 / s1:.0%}" if f1 and s1 else "-"
            md.append(f"| {mode} | {batch} x {context // 1024}K | {count} | {f1:.2f} / {f2:.2f} | {step} | {share} |")
        md.append("")
    return md


def floor_system(count):
    """The floor's records' system for a step of `count` operations."""
    return f"{FLOOR}{count} operations"


def plot(steps, path, title):
    """ms per step (single) against context, batch 1, bfloat16: every system present."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for s in SYSTEMS:
        pts = sorted((r["context"], r["median_us"] / 1000) for r in steps
                     if r["system"] == s and r["mode"] == "bf16" and r["timing"] == "single" and r["batch"] == 1)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=s)
    finish(fig, ax, "ms per decode step (78 layers, appends and attention, one graph)", title, path)


def finish(fig, ax, ylabel, title, path):
    """A step-time plot's axes (log context against log ms), labels and file, as report.py's."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("stored positions per row (context)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
