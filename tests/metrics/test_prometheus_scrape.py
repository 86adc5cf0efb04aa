#!/usr/bin/python3
"""A real Prometheus server (Debian's prometheus) scrapes a running 4-peer cluster every
100 ms, and its HTTP API returns each peer's steps per second (docs/OPERATIONS.md,
"Metrics"). Everything on loopback, on ports the kernel hands out; every process is
stopped at the end, whatever happens."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse
import urllib.request

BIN = os.path.abspath(os.environ.get("HEARSAY_BIN_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin")))
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
NAMES = ["eu-0", "eu-1", "us-0", "us-1"]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "experiments"))
from hearsay_metrics import free_ports  # noqa: E402


def config_text(ports):
    peers = "\n".join(f'  peers {{ name: "{n}" site: "{n[:2]}" address: "127.0.0.1:{p}" }}' for n, p in zip(NAMES, ports))
    return f"""name: "metrics-test"
seed: 3
device: "cpu"
model {{ kind: MLP hidden: [32] }}
data {{ format: IDX }}
optim {{ optimizer: "sgd" lr: 0.05 momentum: 0.9 }}
train {{ batch_size: 32 epochs: 0 max_steps: 100000 eval_every_s: 1 eval_batch_size: 1000 emulated_step_s: 0.01 }}
log {{ every_steps: 20 }}
cluster {{
  id: "metrics-test"
  secret_env: "HEARSAY_SECRET"
  transport: "tcp"
{peers}
  gossip {{ algorithm: "adpsgd" topology: "random" }}
}}
"""


def get_json(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


class PrometheusScrapesACluster(unittest.TestCase):
    def setUp(self):
        if not os.path.exists(PROMETHEUS):
            self.fail(f"{PROMETHEUS} is missing: make deps installs Debian's prometheus")
        self.dir = tempfile.mkdtemp(prefix="hearsay-metrics-")
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + 10
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, cmd, name):
        with open(os.path.join(self.dir, name + ".out"), "w") as out:
            p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=self.dir, env=self.env)
        self.procs.append(p)
        return p

    def tail(self, name):
        with open(os.path.join(self.dir, name + ".out")) as f:
            return f.read()[-2000:]

    def test_prometheus_api_returns_each_peers_steps_per_second(self):
        ports = free_ports(len(NAMES) * 2 + 1)
        peer_ports, metric_ports, prom_port = ports[:4], ports[4:8], ports[8]
        cfg = os.path.join(self.dir, "cluster.textproto")
        with open(cfg, "w") as f:
            f.write(config_text(peer_ports))
        self.env = dict(os.environ, HEARSAY_SECRET="metrics-test-secret-0123456789", OPENBLAS_CORETYPE="Haswell",
                        OPENBLAS_NUM_THREADS="1")
        for name, mport in zip(NAMES, metric_ports):
            self.start([os.path.join(BIN, "hearsay-peer"), "--config", cfg, "--peer", name, "--quiet",
                        "--metrics", f"127.0.0.1:{mport}", "--log", os.path.join(self.dir, name + ".jsonl")], name)
        targets = ", ".join(f"'127.0.0.1:{p}'" for p in metric_ports)
        prom_cfg = os.path.join(self.dir, "prometheus.yml")
        with open(prom_cfg, "w") as f:
            f.write(f"global:\n  scrape_interval: 100ms\n  scrape_timeout: 100ms\n"
                    f"scrape_configs:\n  - job_name: hearsay\n    static_configs:\n      - targets: [{targets}]\n")
        self.start([PROMETHEUS, f"--config.file={prom_cfg}", f"--storage.tsdb.path={os.path.join(self.dir, 'tsdb')}",
                    f"--web.listen-address=127.0.0.1:{prom_port}"], "prometheus")
        api = f"http://127.0.0.1:{prom_port}/api/v1/query?"
        rates = {}
        deadline = time.time() + 90
        while time.time() < deadline:
            for p, name in zip(self.procs, NAMES + ["prometheus"]):
                self.assertIsNone(p.poll(), f"{name} exited early:\n{self.tail(name)}")
            time.sleep(1)
            try:
                # Join each series with hearsay_info to read the peer's name off it.
                q = "hearsay_steps_per_second * on(instance) group_left(peer) hearsay_info"
                answer = get_json(api + urllib.parse.urlencode({"query": q}))
            except OSError:
                continue  # Prometheus still starting
            self.assertEqual(answer["status"], "success", answer)
            rates = {r["metric"]["peer"]: float(r["value"][1]) for r in answer["data"]["result"]}
            if len(rates) == len(NAMES) and all(v > 0 for v in rates.values()):
                break
        self.assertEqual(sorted(rates), sorted(NAMES), f"series Prometheus holds: {rates}")
        for name, rate in rates.items():
            self.assertGreater(rate, 0, f"{name}'s steps/s")
        # Scraped every 100 ms or so: each peer's samples over the last 2 s (20 at 10 a
        # second; at least half of them, on a loaded machine), once 3 s have been scraped.
        time.sleep(3)
        answer = get_json(api + urllib.parse.urlencode({"query": "count_over_time(hearsay_steps_total[2s])"}))
        counts = [float(r["value"][1]) for r in answer["data"]["result"]]
        self.assertEqual(len(counts), len(NAMES))
        self.assertGreaterEqual(min(counts), 10, f"samples per peer in 2 s: {counts}")
        # The traffic families made it through Prometheus's parser too.
        answer = get_json(api + urllib.parse.urlencode({"query": "sum by (instance) (hearsay_link_sent_bytes_total)"}))
        self.assertEqual(len(answer["data"]["result"]), len(NAMES), answer)


if __name__ == "__main__":
    unittest.main()
