#!/usr/bin/env python3
"""Plots the training-quality comparison (tools/quality/run.sh) as one hand-written SVG and
prints its summary.

Inputs: forge train's metrics.jsonl and torch_train.py's JSONL files (the same fields: "step",
"loss" per step, "val_loss" on evaluation steps; lines without "step" are skipped). The first
torch run (A) should read Forge's window order (--seed forge), the second (B) another order:
A vs B is the run-to-run noise, Forge vs A is what is measured against it.

The SVG: two panels, the whole run and its last 40%, train loss smoothed by a trailing mean of
--window steps (lines) and validation losses (markers), one colour per run.
Summary (stdout, one line each): the final validation losses; over the last --tail steps of the
smoothed train loss, mean |Forge - A| and mean |A - B| (the noise); the mean over the evaluation
points after step 0 of |Forge - A| and |A - B| of the validation loss; and whether Forge is
within the noise on each (mean |Forge - A| <= mean |A - B|).

usage: plot_svg.py --forge metrics.jsonl --torch A.jsonl [--torch B.jsonl] --out quality.svg
                   [--labels NAME ...] [--window 25] [--tail 200] [--title TEXT]
"""
import argparse
import json
import math
import sys

COLOURS = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"]
DASHES = ["", "", "6,3", "2,2"]


def read_run(path):
    train, val = {}, {}
    for n, line in enumerate(open(path), 1):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            sys.exit(f"plot_svg.py: {path}:{n}: not JSON")
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            continue
        if isinstance(rec.get("loss"), (int, float)) and math.isfinite(rec["loss"]):
            train[rec["step"]] = float(rec["loss"])
        if isinstance(rec.get("val_loss"), (int, float)) and math.isfinite(rec["val_loss"]):
            val[rec["step"]] = float(rec["val_loss"])
    if not train:
        sys.exit(f"plot_svg.py: {path}: no training losses")
    return train, val


def smooth(train, window):
    """Trailing mean over the last `window` logged steps: {step: mean}."""
    steps = sorted(train)
    out, acc, q = {}, 0.0, []
    for s in steps:
        q.append(train[s])
        acc += train[s]
        if len(q) > window:
            acc -= q.pop(0)
        out[s] = acc / len(q)
    return out


def mean_abs_diff(a, b, steps):
    common = [s for s in steps if s in a and s in b]
    if not common:
        return float("nan"), 0
    return sum(abs(a[s] - b[s]) for s in common) / len(common), len(common)


def nice_ticks(lo, hi, n=6):
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    t = math.ceil(lo / step) * step
    ticks = []
    while t <= hi + 1e-9 * step:
        ticks.append(round(t, 10))
        t += step
    return ticks


def fmt(v):
    return f"{v:g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.1e}"


def panel(x0, y0, w, h, runs, smoothed, labels, s_lo, s_hi, title):
    """One plot: axes, ticks, grid, the smoothed curves and the validation markers."""
    ys = [v for sm in smoothed for s, v in sm.items() if s_lo <= s <= s_hi]
    ys += [v for _, val in runs for s, v in val.items() if s_lo <= s <= s_hi]
    y_lo, y_hi = min(ys), max(ys)
    pad = 0.04 * (y_hi - y_lo or 1)
    y_lo, y_hi = y_lo - pad, y_hi + pad
    X = lambda s: x0 + (s - s_lo) / max(1, s_hi - s_lo) * w
    Y = lambda v: y0 + h - (v - y_lo) / (y_hi - y_lo) * h
    out = [f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#333"/>',
           f'<text x="{x0 + w / 2}" y="{y0 - 8}" text-anchor="middle" font-size="13">{title}</text>']
    for t in nice_ticks(s_lo, s_hi):
        out.append(f'<line x1="{X(t):.1f}" y1="{y0}" x2="{X(t):.1f}" y2="{y0 + h}" stroke="#eee"/>')
        out.append(f'<text x="{X(t):.1f}" y="{y0 + h + 15}" text-anchor="middle" '
                   f'font-size="11">{fmt(t)}</text>')
    for t in nice_ticks(y_lo, y_hi):
        out.append(f'<line x1="{x0}" y1="{Y(t):.1f}" x2="{x0 + w}" y2="{Y(t):.1f}" stroke="#eee"/>')
        out.append(f'<text x="{x0 - 5}" y="{Y(t) + 4:.1f}" text-anchor="end" '
                   f'font-size="11">{fmt(t)}</text>')
    out.append(f'<text x="{x0 + w / 2}" y="{y0 + h + 32}" text-anchor="middle" '
               f'font-size="12">step</text>')
    out.append(f'<text x="{x0 - 42}" y="{y0 + h / 2}" text-anchor="middle" font-size="12" '
               f'transform="rotate(-90 {x0 - 42} {y0 + h / 2})">loss</text>')
    # Drawn last first, so that Forge's curve lies on top; the first torch run (A, which reads
    # Forge's windows) wider beneath it, so both show where they coincide.
    for i in reversed(range(len(runs))):
        val, sm = runs[i][1], smoothed[i]
        width = 3 if i == 1 else 1.5
        pts = " ".join(f"{X(s):.1f},{Y(v):.2f}" for s, v in sorted(sm.items()) if s_lo <= s <= s_hi)
        dash = f' stroke-dasharray="{DASHES[i % 4]}"' if DASHES[i % 4] else ""
        out.append(f'<polyline points="{pts}" fill="none" stroke="{COLOURS[i % 4]}" '
                   f'stroke-width="{width}"{dash}/>')
        for s, v in sorted(val.items()):
            if s_lo <= s <= s_hi:
                out.append(f'<circle cx="{X(s):.1f}" cy="{Y(v):.2f}" r="3.5" fill="white" '
                           f'stroke="{COLOURS[i % 4]}" stroke-width="1.5"/>')
    return out


def write_svg(path, runs, smoothed, labels, title, window):
    W, H = 1000, 480
    last = max(max(list(t) + list(v)) for t, v in runs)
    body = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
            f'viewBox="0 0 {W} {H}" font-family="sans-serif">',
            f'<rect width="{W}" height="{H}" fill="white"/>',
            f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="15">{title}</text>']
    body += panel(70, 60, 400, 320, runs, smoothed, labels, 0, last, "whole run")
    body += panel(570, 60, 400, 320, runs, smoothed, labels, int(0.6 * last), last,
                  "last 40% of the steps")
    y = 420
    for i, label in enumerate(labels):
        x = 70 + 300 * (i % 3)
        yy = y + 22 * (i // 3)
        dash = f' stroke-dasharray="{DASHES[i % 4]}"' if DASHES[i % 4] else ""
        body.append(f'<line x1="{x}" y1="{yy}" x2="{x + 30}" y2="{yy}" stroke="{COLOURS[i % 4]}" '
                    f'stroke-width="{3 if i == 1 else 2}"{dash}/>')
        body.append(f'<circle cx="{x + 15}" cy="{yy}" r="3.5" fill="white" '
                    f'stroke="{COLOURS[i % 4]}" stroke-width="1.5"/>')
        body.append(f'<text x="{x + 38}" y="{yy + 4}" font-size="12">{label}</text>')
    body.append(f'<text x="70" y="{H - 8}" font-size="11" fill="#555">lines: train loss, '
                f'trailing mean of {window} steps; circles: validation loss</text>')
    body.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(body) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forge", required=True, help="forge train's metrics.jsonl")
    ap.add_argument("--torch", action="append", required=True,
                    help="torch_train.py JSONL: A (Forge's order) first, then B")
    ap.add_argument("--out", required=True, help="SVG to write")
    ap.add_argument("--labels", nargs="*", help="legend names, Forge's first")
    ap.add_argument("--window", type=int, default=25, help="train-loss smoothing, steps")
    ap.add_argument("--tail", type=int, default=200, help="steps compared at the end")
    ap.add_argument("--title", default="Forge vs PyTorch: the same initialisation and tokens")
    a = ap.parse_args()
    if a.window < 1 or a.tail < 1:
        sys.exit("plot_svg.py: --window and --tail must be >= 1")
    paths = [a.forge] + a.torch
    labels = a.labels or (["Forge"] + [f"PyTorch {'AB'[i] if i < 2 else i}"
                                       for i in range(len(a.torch))])
    if len(labels) != len(paths):
        sys.exit(f"plot_svg.py: {len(labels)} labels for {len(paths)} runs")
    runs = [read_run(p) for p in paths]
    smoothed = [smooth(t, a.window) for t, _ in runs]
    write_svg(a.out, runs, smoothed, labels, a.title, a.window)

    last = min(max(t) for t, _ in runs)  # the last step every run logged
    tail = [s for s in range(last - a.tail + 1, last + 1)]
    print(f"plot: {a.out} (train loss: trailing mean of {a.window} steps)")
    for label, (_, val) in zip(labels, runs):
        final = val[max(val)] if val else float("nan")
        print(f"final val loss {label}: {final:.4f}" + (f" (step {max(val)})" if val else ""))
    verdicts = []
    fa, n = mean_abs_diff(smoothed[0], smoothed[1], tail)
    print(f"train, last {n} steps, smoothed: mean |{labels[0]} - {labels[1]}| = {fa:.4f}")
    if len(runs) > 2:
        ab, _ = mean_abs_diff(smoothed[1], smoothed[2], tail)
        print(f"train, last {n} steps, smoothed: mean |{labels[1]} - {labels[2]}| = {ab:.4f} "
              f"(run-to-run noise)")
        verdicts.append(("train", fa, ab))
        vsteps = sorted(s for s in runs[0][1] if s > 0)
        vf, m = mean_abs_diff(runs[0][1], runs[1][1], vsteps)
        vab, _ = mean_abs_diff(runs[1][1], runs[2][1], vsteps)
        print(f"val, {m} evaluations after step 0: mean |{labels[0]} - {labels[1]}| = {vf:.4f}, "
              f"mean |{labels[1]} - {labels[2]}| = {vab:.4f} (noise)")
        verdicts.append(("val", vf, vab))
    for what, d, noise in verdicts:
        ok = d <= noise
        print(f"{what}: {labels[0]} is {'WITHIN' if ok else 'OUTSIDE'} run-to-run noise "
              f"({d:.4f} {'<=' if ok else '>'} {noise:.4f})")


if __name__ == "__main__":
    main()
