#!/usr/bin/python3
"""hearsay-run's cluster /metrics (experiments/hearsay_metrics.py) under hostile clients
(docs/OPERATIONS.md, "Metrics"): 1,000 idle connections leave its thread count bounded;
a scrape every second answers within its timeout while 100 clients trickle a byte a
second and one sends an endless chunked body; a request with a body is answered at once;
and hearsay_peer_up tells a starved peer endpoint from a dead one. No binaries: the
server alone, with stand-ins for the peers."""
import http.server
import os
import re
import resource
import socket
import sys
import threading
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.realpath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "experiments"))
sys.path.insert(0, HERE)
import hearsay_metrics  # noqa: E402
from slow_clients import Attack, ask  # noqa: E402

SCRAPE_TIMEOUT_S = 2.0


def scrape(port):
    """(seconds, body) of one GET /metrics within SCRAPE_TIMEOUT_S; raises if it does not answer."""
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT_S) as r:
        return time.monotonic() - t0, r.read().decode()


class ClusterMetricsBounds(unittest.TestCase):
    def setUp(self):
        self.server = hearsay_metrics.ClusterMetrics("127.0.0.1:0")
        self.server.set_peers({})
        self.port = self.server.port

    def tearDown(self):
        self.server.close()

    def test_a_thousand_idle_connections_leave_the_thread_count_bounded(self):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < 2600:  # 1,000 here, up to MAX_HANDLERS in the server, the rest of the process
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
        before = threading.active_count()
        bound = before + hearsay_metrics.MAX_HANDLERS + 4
        idle, most = [], before
        try:
            for _ in range(1000):
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", self.port))
                idle.append(s)
                most = max(most, threading.active_count())
            # Watched until the read deadline has passed: the idle connections are then shut,
            # their threads gone, and a real scrape is served.
            t_end = time.monotonic() + hearsay_metrics.READ_DEADLINE_S + 1.0
            while time.monotonic() < t_end:
                most = max(most, threading.active_count())
                time.sleep(0.01)
            self.assertLessEqual(most, bound, f"threads with 1,000 idle connections (from {before})")
            took, body = scrape(self.port)
            self.assertIn("# TYPE hearsay_peer_up gauge", body)
            # Connections accepted later (from the listen queue) each wait out their own
            # deadline: on a loaded machine the last handlers end some seconds after the
            # first ones. Every one ends, none outlives its deadline by much.
            drained = time.monotonic() + 1000 / hearsay_metrics.MAX_HANDLERS * (hearsay_metrics.READ_DEADLINE_S + 1) + 5
            while threading.active_count() > before + 2 and time.monotonic() < drained:
                time.sleep(0.05)
            self.assertLessEqual(threading.active_count(), before + 2, "handler threads left after every deadline passed")
        finally:
            for s in idle:
                s.close()

    def test_a_scrape_every_second_answers_while_slow_clients_trickle_and_a_body_never_ends(self):
        attack = Attack(self.port, slow=100).start()
        took = []
        try:
            time.sleep(0.5)  # every slow connection in
            for _ in range(6):
                t0 = time.monotonic()
                took.append(scrape(self.port)[0])
                time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
        finally:
            attack.stop()
        self.assertEqual(len(took), 6)
        self.assertLess(max(took), SCRAPE_TIMEOUT_S, took)
        # No slow client kept its connection past the deadline, however steadily it trickled.
        self.assertLess(max(attack.lifetimes), hearsay_metrics.READ_DEADLINE_S + 1.0)
        self.assertTrue(attack.post_answers, "the endless chunked POST was never answered")
        self.assertTrue(all(line.split()[1] == "405" for _, line in attack.post_answers), attack.post_answers[:3])
        self.assertLess(max(t for t, _ in attack.post_answers), 1.0)

    def test_a_request_with_a_body_or_two_lengths_is_answered_at_once(self):
        cases = [
            (b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nabcde\r\n", 405),
            (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nabc", 405),
            (b"PUT /metrics HTTP/1.0\r\n\r\n", 405),
            (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 10\r\n\r\nab", 400),
            (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
            (b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n", 400),
            (b"GET /other HTTP/1.0\r\n\r\n", 404),
            (b"GET /metrics HTTP/1.0\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", 431),
            (b"HEAD /metrics HTTP/1.0\r\n\r\n", 200),
        ]
        for request, want in cases:
            status, first, answer = ask(self.port, request, timeout=3)
            self.assertEqual(status, want, request[:60])
            self.assertLess(first, 1.0, request[:60])
        self.assertIn(b"Allow: GET, HEAD", ask(self.port, cases[0][0])[2])

    def test_peer_up_tells_a_starved_endpoint_from_a_dead_one(self):
        # "starved" takes connections into its backlog and never answers, as a peer whose
        # endpoint is busy would; "dead" has nothing listening; "fine" answers.
        starved = socket.socket()
        starved.bind(("127.0.0.1", 0))
        starved.listen(16)
        dead = hearsay_metrics.free_ports(1)[0]
        fine = http.server.HTTPServer(("127.0.0.1", 0), Fine)
        threading.Thread(target=fine.serve_forever, daemon=True).start()
        try:
            self.server.set_peers({"starved": starved.getsockname()[1], "dead": dead, "fine": fine.server_address[1]})
            _, body = scrape_slowly(self.port)
        finally:
            fine.shutdown()
            fine.server_close()
            starved.close()
        values = {(m.group(1), m.group(2)): m.group(3)
                  for m in re.finditer(r'^(hearsay_peer_up|hearsay_peer_scrape_ok)\{peer="(\w+)"\} (\d)$', body, re.M)}
        self.assertEqual(values, {("hearsay_peer_up", "starved"): "1", ("hearsay_peer_scrape_ok", "starved"): "0",
                                  ("hearsay_peer_up", "dead"): "0", ("hearsay_peer_scrape_ok", "dead"): "0",
                                  ("hearsay_peer_up", "fine"): "1", ("hearsay_peer_scrape_ok", "fine"): "1"}, body)
        self.assertIn('hearsay_steps_total{peer="fine"} 7\n', body)


class Fine(http.server.BaseHTTPRequestHandler):
    """A peer's endpoint that answers."""

    def do_GET(self):
        body = b"# TYPE hearsay_steps_total counter\nhearsay_steps_total 7\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def scrape_slowly(port):
    """A scrape that waits out a peer's two tries."""
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=4 * hearsay_metrics.PEER_TIMEOUT_S + 2) as r:
        return time.monotonic() - t0, r.read().decode()


if __name__ == "__main__":
    unittest.main()
