#!/usr/bin/python3
"""A simulated experiment beside the real one (docs/SIMULATION.md, "Validation"): for each
sweep point, the mean and spread over its seeds of the time to target and the bytes to
target in both, their ratio (the time also counted from when the last peer began training:
a real peer starts after loading and admission, a simulated one at 0), the steps all peers had taken when the run stopped (at its
target, or its time limit: the pace without the clock), and whether the simulated mean is
within 15% of the real mean or inside the real seeds' range; then whether the points rank
the same by time.

  experiments/hearsay_compare.py runs/quickstart-REAL runs/quickstart-SIMULATED [--markdown]
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hearsay_figures  # noqa: E402
import hearsay_logs  # noqa: E402


def groups(root):
    """{point name: [run summaries]} of a hearsay-run output directory, in sweep order."""
    return {key: [hearsay_logs.run_summary(d, p.get("target_test_acc") or 0) for d, p in runs]
            for key, runs in hearsay_logs.sweep_runs(root).items()}


def agrees(real, sim):
    if real is None or sim is None:
        return real is None and sim is None
    return abs(sim["mean"] - real["mean"]) <= 0.15 * real["mean"] or real["lo"] <= sim["mean"] <= real["hi"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("real")
    ap.add_argument("simulated")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    real, sim = groups(args.real), groups(args.simulated)
    rows = [("point", "time to target, real s", "simulated s", "sim / real", "from the last start, real s", "simulated s",
             "sim / real", "MB to target, real", "simulated MB", "sim / real", "steps at the stop, real", "simulated",
             "within 15% or the spread")]
    order_real, order_sim = [], []
    for key in real:
        if key not in sim:
            continue
        over = lambda runs, field: hearsay_figures.over_seeds([r.get(field) for r in runs])
        after = "time_to_target_after_start_s"
        tr, ts = over(real[key], "time_to_target_s"), over(sim[key], "time_to_target_s")
        ar, as_ = over(real[key], after), over(sim[key], after)
        br, bs = over(real[key], "bytes_to_target_total"), over(sim[key], "bytes_to_target_total")
        ratio = lambda a, b: f"{b['mean'] / a['mean']:.2f}" if a and b and a["mean"] > 0 else "-"
        ok = ("time " + ("yes" if agrees(tr, ts) else "NO") + ", from the last start " + ("yes" if agrees(ar, as_) else "NO") +
              ", bytes " + ("yes" if agrees(br, bs) else "NO"))
        seeds = lambda runs, field, scale=1.0, fmt="{:.1f}": hearsay_figures.mean_sd([r[field] for r in runs], scale, fmt)
        rows.append((key, seeds(real[key], "time_to_target_s"), seeds(sim[key], "time_to_target_s"), ratio(tr, ts),
                     seeds(real[key], after), seeds(sim[key], after), ratio(ar, as_),
                     seeds(real[key], "bytes_to_target_total", 1e-6), seeds(sim[key], "bytes_to_target_total", 1e-6),
                     ratio(br, bs), seeds(real[key], "steps_total", 1, "{:.0f}"), seeds(sim[key], "steps_total", 1, "{:.0f}"), ok))
        order_real.append((tr["mean"] if tr else float("inf"), key))
        order_sim.append((ts["mean"] if ts else float("inf"), key))
    hearsay_logs.print_table(rows, args.markdown)
    same = [k for _, k in sorted(order_real)] == [k for _, k in sorted(order_sim)]
    print(f"\nranking by time to target: {'the same' if same else 'DIFFERENT'}"
          f" (real: {', '.join(k for _, k in sorted(order_real))}; simulated: {', '.join(k for _, k in sorted(order_sim))})")


if __name__ == "__main__":
    main()
