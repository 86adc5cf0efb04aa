#!/usr/bin/python3
"""A real hearsay-peer's /metrics (src/metrics/metrics_server.cpp) under hostile clients
(docs/OPERATIONS.md, "Metrics"): while 100 connections trickle a header byte a second and
another POSTs an endless chunked body (each reconnecting as soon as it is closed), a
scrape every second for 8 s answers within 2 s, no slow connection lives past the
deadline, and every chunked POST is answered 405 within 1 s; a duplicate Content-Length
is answered 400 within 1 s. One peer alone on loopback, its port from the kernel."""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, HERE)
from slow_clients import Attack, ask  # noqa: E402

BIN = os.path.abspath(os.environ.get("HEARSAY_BIN_DIR", os.path.join(HERE, "..", "..", "build", "bin")))
DEADLINE_S = 2.0  # kDeadline in metrics_server.cpp
SCRAPE_TIMEOUT_S = 2.0
CONFIG = """name: "metrics-bounds"
seed: 1
device: "cpu"
model { kind: MLP hidden: [16] }
data { format: SYNTHETIC synthetic_train: 1024 synthetic_test: 256 synthetic_dim: 8 num_classes: 4 }
optim { optimizer: "sgd" lr: 0.05 }
train { batch_size: 16 epochs: 0 max_steps: 100000000 eval_every_steps: 100000000 emulated_step_s: 0.02 }
log { every_steps: 100000 }
"""


class PeerMetricsBounds(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="hearsay-metrics-bounds-")
        cfg = os.path.join(self.dir, "alone.textproto")
        with open(cfg, "w") as f:
            f.write(CONFIG)
        self.err = os.path.join(self.dir, "peer.err")
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
        with open(self.err, "w") as err:
            self.peer = subprocess.Popen([os.path.join(BIN, "hearsay-peer"), "--config", cfg, "--quiet",
                                          "--metrics", "127.0.0.1:0"], stdout=subprocess.DEVNULL, stderr=err,
                                         cwd=self.dir, env=env)
        self.port = self.wait_for_port()

    def tearDown(self):
        if self.peer.poll() is None:
            self.peer.send_signal(signal.SIGTERM)
            try:
                self.peer.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.peer.kill()
                self.peer.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def stderr(self):
        with open(self.err) as f:
            return f.read()[-2000:]

    def wait_for_port(self):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = re.search(r"serves metrics at \S+ \(port (\d+)\)", self.stderr())
            if m:
                return int(m.group(1))
            self.assertIsNone(self.peer.poll(), f"hearsay-peer exited early:\n{self.stderr()}")
            time.sleep(0.05)
        self.fail(f"hearsay-peer never said its metrics port:\n{self.stderr()}")

    def test_scrapes_answer_under_slow_clients_and_an_endless_body_and_bad_requests_are_answered_at_once(self):
        attack = Attack(self.port, slow=100).start()
        took, failures = [], []
        try:
            time.sleep(0.5)  # every slow connection in
            for i in range(8):
                t0 = time.monotonic()
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=SCRAPE_TIMEOUT_S) as r:
                        self.assertIn("hearsay_steps_total ", r.read().decode())
                    took.append(time.monotonic() - t0)
                except OSError as e:
                    failures.append(f"scrape {i} after {time.monotonic() - t0:.2f} s: {e}")
                time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
            # Asked while the attack goes on: a second Content-Length makes the body's end
            # ambiguous, and is refused before any of it is read.
            dup = ask(self.port, b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 10\r\n\r\nab")
        finally:
            attack.stop()
        self.assertIsNone(self.peer.poll(), f"hearsay-peer exited:\n{self.stderr()}")
        self.assertEqual(failures, [], f"answered: {took}")
        self.assertLess(max(took), SCRAPE_TIMEOUT_S, took)
        # However steadily a slow client trickled, its connection was closed at the deadline.
        self.assertLess(max(attack.lifetimes), DEADLINE_S + 1.5, sorted(attack.lifetimes)[-5:])
        self.assertTrue(attack.post_answers, "the endless chunked POST was never answered")
        self.assertTrue(all(line.split()[1] == "405" for _, line in attack.post_answers), attack.post_answers[:3])
        self.assertLess(max(t for t, _ in attack.post_answers), 1.0)
        self.assertEqual(dup[0], 400, dup[2][:200])
        self.assertLess(dup[1], 1.0)
        # Alone again, each answered at once too.
        for request, want in [(b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n", 405),
                              (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nabc", 405),
                              (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
                              (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n", 400),
                              (b"HEAD /metrics HTTP/1.0\r\n\r\n", 200)]:
            status, first, answer = ask(self.port, request, timeout=3)
            self.assertEqual(status, want, request[:70])
            self.assertLess(first, 1.0, request[:70])


if __name__ == "__main__":
    unittest.main()
