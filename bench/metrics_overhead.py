#!/usr/bin/python3
"""What being scraped costs a peer (issue 24, "Live metrics"): two peers of the same config
train side by side, one with --metrics scraped every 100 ms (one kept-alive HTTP connection,
as Prometheus keeps one), the other without; the roles swap every round, so that neither
core nor start order favours one. Each peer trains alone (no cluster), single-threaded
OpenBLAS, a fixed number of steps; its step rate is read from its log's end event
(steps / train_s). One JSON line: the median step rate of each side, their ratio, and the
scrapes' count, size and latency.

    bench/metrics_overhead.py                     # single-mlp, 2,000 steps, 3 rounds
    bench/metrics_overhead.py --steps 10000 --rounds 6   # the figure in docs/BENCHMARKS.md
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "experiments"))
from hearsay_metrics import free_ports  # noqa: E402


def end_event(log_path):
    with open(log_path, encoding="utf-8") as f:
        for line in f:
            e = json.loads(line)
            if e.get("event") == "end":
                return e
    raise SystemExit(f"metrics_overhead: no end event in {log_path}")


class Scraper(threading.Thread):
    """GET /metrics every `every_s` on one connection until stopped; records latencies."""

    def __init__(self, port, every_s):
        super().__init__(daemon=True)
        self.port, self.every_s = port, every_s
        self.latencies, self.sizes, self.failures = [], [], 0
        self.done = threading.Event()

    def run(self):
        conn = None
        while not self.done.is_set():
            t0 = time.perf_counter()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/metrics")
                body = conn.getresponse().read()
                self.latencies.append(time.perf_counter() - t0)
                self.sizes.append(len(body))
            except OSError:
                self.failures += 1  # the peer not up yet, or gone
                conn = None
            self.done.wait(max(0.0, self.every_s - (time.perf_counter() - t0)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "single-mlp.textproto"))
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--every-s", type=float, default=0.1, help="seconds between scrapes")
    ap.add_argument("--peer-bin", default=os.path.join(ROOT, "build", "bin", "hearsay-peer"))
    args = ap.parse_args()
    env = dict(os.environ, OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"), OPENBLAS_NUM_THREADS="1")
    work = tempfile.mkdtemp(prefix="hearsay-metrics-bench-")
    scraped, plain, latencies, sizes, scrapes = [], [], [], [], 0
    for r in range(args.rounds):
        port = free_ports(1)[0]
        runs = []
        # Round r: the scraped peer starts first in even rounds, second in odd ones.
        for role in (["scraped", "plain"] if r % 2 == 0 else ["plain", "scraped"]):
            log = os.path.join(work, f"{role}-{r}.jsonl")
            cmd = [args.peer_bin, "--config", args.config, "--quiet", "--log", log,
                   "--set", f"train {{ epochs: 0 max_steps: {args.steps} }}"]
            if role == "scraped":
                cmd += ["--metrics", f"127.0.0.1:{port}"]
            runs.append((role, log, subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)))
        scraper = Scraper(port, args.every_s)
        scraper.start()
        for role, log, p in runs:
            _, err = p.communicate()
            if p.returncode != 0:
                raise SystemExit(f"metrics_overhead: the {role} peer failed ({p.returncode}):\n{err[-2000:]}")
        scraper.done.set()
        scraper.join()
        for role, log, _ in runs:
            e = end_event(log)
            rate = e["steps"] / e["train_s"]
            (scraped if role == "scraped" else plain).append(rate)
        latencies += scraper.latencies
        sizes += scraper.sizes
        scrapes += len(scraper.latencies)
    print(json.dumps({
        "bench": "metrics_overhead",
        "config": os.path.relpath(args.config, ROOT),
        "steps": args.steps,
        "rounds": args.rounds,
        "scrape_every_s": args.every_s,
        "steps_per_s_scraped": [round(x, 2) for x in scraped],
        "steps_per_s_plain": [round(x, 2) for x in plain],
        "median_scraped": round(statistics.median(scraped), 2),
        "median_plain": round(statistics.median(plain), 2),
        "ratio_scraped_over_plain": round(statistics.median(scraped) / statistics.median(plain), 4),
        "per_round_ratio": [round(s / p, 4) for s, p in zip(scraped, plain)],
        "median_per_round_ratio": round(statistics.median(s / p for s, p in zip(scraped, plain)), 4),
        "scrapes": scrapes,
        "scrape_bytes_median": int(statistics.median(sizes)) if sizes else 0,
        "scrape_latency_ms_median": round(1000 * statistics.median(latencies), 3) if latencies else None,
    }))


if __name__ == "__main__":
    main()
