"""hearsay-run --metrics HOST:PORT: one /metrics for the whole cluster it runs (docs/OPERATIONS.md).

Each peer process serves its own /metrics (hearsay-peer --metrics, on a loopback port
picked here); this server answers a scrape by scraping every peer of the run in progress
and merging their families, each sample labelled with its peer, plus
hearsay_peer_up{peer} (1 when the peer answered) as Prometheus's own `up` is for targets.
The HTTP side is Python's http.server."""
import concurrent.futures
import http.server
import re
import socket
import threading
import urllib.request

PEER_TIMEOUT_S = 1.0


def free_ports(n):
    """n ports of 127.0.0.1 free now (bound together, so they differ, then released)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def with_peer_label(sample, peer):
    """A sample line with peer="..." first among its labels (left as it is if it has one)."""
    i = 0
    while i < len(sample) and sample[i] not in "{ ":
        i += 1
    name, rest = sample[:i], sample[i:]
    label = 'peer="' + peer.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if not rest.startswith("{"):
        return f"{name}{{{label}}}{rest}"
    j, quoted = 1, False  # the closing brace, outside the label values' quotes
    while j < len(rest) and (quoted or rest[j] != "}"):
        if quoted and rest[j] == "\\":
            j += 1
        elif rest[j] == '"':
            quoted = not quoted
        j += 1
    labels = rest[1:j]
    if re.search(r'(^|,)peer="', labels):
        return sample
    return f"{name}{{{label}{',' if labels else ''}{labels}{rest[j:]}"


def merge_expositions(texts):
    """{peer: exposition text} -> one exposition: each family's HELP and TYPE once, then every
    peer's samples of it, labelled with the peer."""
    families = {}  # name -> [help line, type line, samples]; in order of first appearance
    for peer, text in texts.items():
        current = None
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                name = line.split(" ", 3)[2]
                fam = families.setdefault(name, [None, None, []])
                slot = 0 if line.startswith("# HELP ") else 1
                fam[slot] = fam[slot] or line
                current = fam
            elif line and not line.startswith("#"):
                if current is None:
                    current = families.setdefault(line.split("{", 1)[0].split(" ", 1)[0], [None, None, []])
                current[2].append(with_peer_label(line, peer))
    out = []
    for help_line, type_line, samples in families.values():
        out += [x for x in (help_line, type_line) if x] + samples
    return "\n".join(out) + "\n" if out else ""


class ClusterMetrics:
    """Serves the merged /metrics of the peers set with set_peers() at `address` (HOST:PORT)."""

    def __init__(self, address):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--metrics '{address}': use HOST:PORT")
        self._lock = threading.Lock()
        self._peers = {}  # name -> port of its own /metrics
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != "/metrics":
                    self.send_error(404, "the metrics are at /metrics")
                    return
                body = owner.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass  # scrapes are not news

        try:
            self._server = http.server.ThreadingHTTPServer((host.strip("[]"), int(port)), Handler)
        except OSError as e:
            raise ValueError(f"--metrics '{address}': cannot serve there ({e.strerror})") from e
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def set_peers(self, ports):
        with self._lock:
            self._peers = dict(ports)

    def render(self):
        with self._lock:
            peers = dict(self._peers)

        def scrape(port):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=PEER_TIMEOUT_S) as r:
                    return r.read().decode()
            except OSError:
                return None  # not up yet, or gone

        # All at once, so that a scrape takes one peer's timeout at most, not one each.
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(peers)))) as pool:
            answers = dict(zip(peers, pool.map(scrape, peers.values())))
        texts = {name: text for name, text in answers.items() if text is not None}
        up = {name: int(text is not None) for name, text in answers.items()}
        head = ["# HELP hearsay_peer_up Whether the peer answered this scrape (1) or not (0).",
                "# TYPE hearsay_peer_up gauge"]
        head += [f'hearsay_peer_up{{peer="{name}"}} {v}' for name, v in up.items()]
        return "\n".join(head) + "\n" + merge_expositions(texts)

    def close(self):
        self._server.shutdown()
        self._server.server_close()
