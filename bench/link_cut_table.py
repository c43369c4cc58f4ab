"""The table of the two-sided link-cut benchmarks (bench/pipe/link_cut.py,
bench/inference/link_cut.py): per liveness setting, how long after the cut the client and
the server raised (median and max of the trials), and what was raised."""
import argparse
import statistics


def run(trial, default_settings="default,2"):
    """Parses --trials and --settings, runs `trial(setting)` -> (client s, server s, raised)
    that many times per setting (once for 0: liveness off), and prints the table."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--settings", default=default_settings)
    a = ap.parse_args()
    print(f"{'liveness_timeout':>16} {'client median':>14} {'client max':>11} {'server median':>14} "
          f"{'server max':>11}  raised")
    for setting in a.settings.split(","):
        runs = [trial(setting) for _ in range(a.trials if setting != "0" else 1)]
        c = [r[0] for r in runs]
        s = [r[1] for r in runs]
        print(f"{setting:>16} {statistics.median(c):>13.2f}s {max(c):>10.2f}s "
              f"{statistics.median(s):>13.2f}s {max(s):>10.2f}s  {sorted({r[2] for r in runs})}",
              flush=True)
