#!/usr/bin/env python3
"""Diff two train_timeline CSVs (dev/train_timeline.cpp --csv): the rows whose time per step
differs most, B minus A in µs, with calls per step on both sides.

    python3 dev/timeline_diff.py plain.csv qwen3.csv [--top 30]

A row missing on one side counts as 0 there. The last lines give the step span and the total
kernel time of both runs, so the listed differences can be set against the whole."""
import argparse
import csv
import sys


def load(path):
    rows = {}
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            need = {"kind", "name", "calls_per_step", "us_per_step"}
            if reader.fieldnames is None or not need <= set(reader.fieldnames):
                sys.exit(f"timeline_diff: {path}: not a train_timeline CSV (columns {sorted(need)} expected)")
            for r in reader:
                rows[(r["kind"], r["name"])] = (float(r["calls_per_step"]), float(r["us_per_step"]))
    except (OSError, ValueError) as e:
        sys.exit(f"timeline_diff: {path}: {e}")
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="baseline CSV (e.g. plain Llama)")
    p.add_argument("b", help="CSV to compare (e.g. qwen3)")
    p.add_argument("--top", type=int, default=30, help="rows to print (default 30)")
    args = p.parse_args()
    a, b = load(args.a), load(args.b)
    span = ("step", "span")
    keys = (set(a) | set(b)) - {span}
    diffs = []
    for k in keys:
        ca, ua = a.get(k, (0.0, 0.0))
        cb, ub = b.get(k, (0.0, 0.0))
        diffs.append((ub - ua, k, ca, ua, cb, ub))
    diffs.sort(key=lambda d: -abs(d[0]))
    width = max([len(d[1][1]) for d in diffs[: args.top]] + [4])
    print(f"{'kind':<7} {'name':<{width}} {'calls A':>8} {'µs A':>10} {'calls B':>8} {'µs B':>10} {'B-A µs':>10}")
    for d, (kind, name), ca, ua, cb, ub in diffs[: args.top]:
        print(f"{kind:<7} {name:<{width}} {ca:>8g} {ua:>10.1f} {cb:>8g} {ub:>10.1f} {d:>+10.1f}")
    rest = sum(d[0] for d in diffs[args.top :])
    if len(diffs) > args.top:
        print(f"{'':<7} {f'other ({len(diffs) - args.top} rows)':<{width}} {'':>8} {'':>10} {'':>8} {'':>10} {rest:>+10.1f}")

    def kernel_total(rows):
        return sum(u for (kind, _), (_, u) in rows.items() if kind == "kernel")

    ka, kb = kernel_total(a), kernel_total(b)
    print(f"\nkernel time per step: A {ka:.1f} µs, B {kb:.1f} µs, B-A {kb - ka:+.1f} µs")
    if span in a and span in b:
        sa, sb = a[span][1], b[span][1]
        print(f"step span: A {sa:.1f} µs, B {sb:.1f} µs, B-A {sb - sa:+.1f} µs ({100 * (sb / sa - 1):+.2f}%)")


if __name__ == "__main__":
    main()
