#!/usr/bin/env python3
"""Summarizes one kernel's SASS-level profile from Nsight Compute's source page.

Input: the CSV that `ncu --import REPORT --page source --csv --print-source sass > FILE` writes
(a block of rows per profiled kernel, each starting with a "Kernel Name" line). Output:
  - the instructions holding the most warp-stall samples, with their top stall reasons;
  - per opcode: instructions executed (divided by --per, e.g. warps x chunks) and samples;
  - for each --region A:B (instruction indices, as the first list prints them): samples, executed
    instructions and the stall reasons, to compare the roles of a warp-specialized kernel.

  tools/ncu-sass-profile.py FILE [--kernel N] [--top K] [--per D] [--region A:B ...]
"""
import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def kernels(path):
    """Yields (kernel name, rows) per kernel block of the CSV."""
    name, header, rows = None, None, []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if row and row[0] == "Kernel Name":
                if rows:
                    yield name, rows
                name, header, rows = row[1] if len(row) > 1 else "?", None, []
            elif row and row[0] == "Address":
                header = row
            elif header and len(row) == len(header):
                rows.append(dict(zip(header, row)))
    if rows:
        yield name, rows


def number(text):
    try:
        return int(text)
    except ValueError:
        return 0


def opcode(sass):
    words = sass.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def stall_counts(rows, stalls):
    counts = collections.Counter()
    for r in rows:
        for s in stalls:
            counts[s[len("stall_"):]] += number(r[s])
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--kernel", type=int, default=0, help="which profiled kernel (0 = first)")
    ap.add_argument("--top", type=int, default=25, help="instructions to list")
    ap.add_argument("--per", type=float, default=1.0, help="divide executed counts by this")
    ap.add_argument("--region", action="append", default=[], help="A:B instruction index range")
    args = ap.parse_args()

    blocks = list(kernels(args.csv))
    if not blocks:
        sys.exit(f"{args.csv}: no kernel rows (was it written with --page source --csv?)")
    if args.kernel >= len(blocks):
        sys.exit(f"{args.csv}: {len(blocks)} kernels, no kernel {args.kernel}")
    name, rows = blocks[args.kernel]
    stalls = [h for h in rows[0] if h.startswith("stall_") and "Not Issued" not in h]
    total = sum(number(r[SAMPLES]) for r in rows) or 1
    print(f"{name}\n{len(rows)} instructions, {total} samples\n")

    print("the instructions with the most samples, in code order (index, samples, share, executed, SASS, top stalls)")
    ranked = sorted(range(len(rows)), key=lambda i: -number(rows[i][SAMPLES]))[: args.top]
    for i in sorted(ranked):
        r = rows[i]
        top = stall_counts([r], stalls).most_common(2)
        print(f"{i:6d} {number(r[SAMPLES]):7d} {100 * number(r[SAMPLES]) / total:5.1f}% {number(r[EXECUTED]):10d}  "
              f"{r['Source'].strip()[:56]:56s} {top}")

    print(f"\nper opcode (executed / {args.per:g}, samples)")
    executed, samples = collections.Counter(), collections.Counter()
    for r in rows:
        op = opcode(r["Source"].strip())
        executed[op] += number(r[EXECUTED])
        samples[op] += number(r[SAMPLES])
    for op, n in executed.most_common(20):
        print(f"  {op:10s} {n / args.per:12.1f} {samples[op]:7d}")

    for spec in args.region:
        a, b = (int(x) for x in spec.split(":"))
        part = rows[a:b]
        s = sum(number(r[SAMPLES]) for r in part)
        e = sum(number(r[EXECUTED]) for r in part)
        print(f"\nregion {a}:{b}: {s} samples ({100 * s / total:.1f}%), {e / args.per:.1f} executed / {args.per:g}")
        print("  " + ", ".join(f"{k} {v}" for k, v in stall_counts(part, stalls).most_common(8)))


if __name__ == "__main__":
    main()
