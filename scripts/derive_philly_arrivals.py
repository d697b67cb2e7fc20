"""Derive the compact Philly arrivals file shipped with the simulator.

Reads the flattened Philly trace (Pollux OSDI'21 artifact, 82,247 jobs) and keeps the jobs that
look like RL post-training jobs in size and length: at least 8 GPUs and 1 h to 72 h of run time.
That leaves about 1,100 jobs over 15 weeks, i.e. ~300 jobs per 580 h, the density of the
segment the RollMux paper replays (§7.5; its exact filter is not published). Writes
`arrival_s,duration_s,num_gpus,vc` sorted by arrival, times relative to the first kept job.

Usage: python scripts/derive_philly_arrivals.py shared/data/philly_jobs_pollux.csv \
           coordinator/sim/data/philly_arrivals.csv
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
from pathlib import Path

MIN_GPUS = 8
MIN_DURATION_S = 3600
MAX_DURATION_S = 72 * 3600


def derive(src: Path, dst: Path) -> int:
    rows = []
    with src.open(newline="") as f:
        for rec in csv.DictReader(f):
            gpus, duration = int(rec["num_gpus"]), float(rec["duration"])
            if gpus < MIN_GPUS or not MIN_DURATION_S <= duration <= MAX_DURATION_S:
                continue
            submit = dt.datetime.strptime(rec["timestamp"], "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.timezone.utc)
            rows.append((submit.timestamp(), duration, gpus, rec["cluster"][:8]))
    rows.sort()
    t0 = rows[0][0]
    with dst.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrival_s", "duration_s", "num_gpus", "vc"])
        for ts, duration, gpus, vc in rows:
            w.writerow([int(ts - t0), int(duration), gpus, vc])
    return len(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", type=Path, help="philly_jobs_pollux.csv")
    p.add_argument("dst", type=Path, help="output CSV")
    args = p.parse_args()
    print(f"wrote {derive(args.src, args.dst)} jobs to {args.dst}")


if __name__ == "__main__":
    main()
