"""Speed of a study curve's bootstrap band: :func:`gae_core.insight.stats.curve_band` against the
per-point loop it replaces, side by side in this process.

    python benchmarks/bench_stats.py [--seeds 10] [--points 200] [--repeats 5] [--json]

The compare page draws one band per group and curve: ``curve_band`` over ``[seeds, points]``
with the default 2,000 resamples. Points where every seed has a value are bootstrapped in one
vectorised ``scipy.stats.bootstrap`` call; the baseline calls ``bootstrap_ci`` once per point,
which gives the same intervals (``tests/test_stats.py`` checks that they agree). Prints the
best of ``--repeats`` timings of each after one warm-up call, the ratio loop / vectorised and
PASS/FAIL against the target: the vectorised call exists for speed, so it must not be slower
than the loop (ratio ≥ 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gae_core.insight import stats

TARGET_RATIO = 1.0


def best_of(repeats: int, call) -> float:
    call()  # warm-up: scipy's first bootstrap imports and allocates
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON line at the end")
    args = parser.parse_args()
    curves = np.random.default_rng(0).normal(size=(args.seeds, args.points))

    def loop() -> list[tuple[float, float, float]]:
        return [stats.bootstrap_ci(curves[:, j], "iqm") for j in range(args.points)]

    band = stats.curve_band(curves, "iqm")
    same = np.allclose(band[["center", "ci_low", "ci_high"]].to_numpy(), loop(), rtol=1e-12)
    vectorised = best_of(args.repeats, lambda: stats.curve_band(curves, "iqm"))
    per_point = best_of(args.repeats, loop)
    ratio = per_point / vectorised
    verdict = "PASS" if ratio >= TARGET_RATIO and same else "FAIL"
    print(f"curve_band, {args.seeds} seeds x {args.points} points x {stats.RESAMPLES} resamples")
    print(f"  vectorised        {vectorised:.4f} s")
    print(f"  per-point loop    {per_point:.4f} s")
    print(f"  loop / vectorised {ratio:.4f}x (target >= {TARGET_RATIO:g}x), same intervals: "
          f"{same}  {verdict}")  # fmt: skip
    if args.json:
        print(json.dumps({"seeds": args.seeds, "points": args.points, "vectorised_s": vectorised,
                          "per_point_s": per_point, "ratio": ratio, "same": bool(same),
                          "verdict": verdict}))  # fmt: skip


if __name__ == "__main__":
    main()
