#!/usr/bin/python3
"""make test-hosts: peers on separate hosts, with real addresses and kernel-shaped links
(issue 24; docs/OPERATIONS.md, "Sites as hosts").

Each site is a Linux network namespace with an address of its own on a bridge in a WAN
namespace; each site's link to the bridge is shaped in the kernel by tbf, both ways (its
uplink and downlink at --mbps). The kernel has no netem here, so the WAN's latency is
hearsay's own emulation (the config's site links, at a bandwidth far above the tbf's, so
that the kernel is the bottleneck) or left out (--latency-ms 0). One hearsay-peer per host
and port runs inside its site's namespace with the config's real addresses. Everything
this script makes is named with its process id and removed at the end, whatever happens.

    tests/hosts/test_hosts.py                       # 3 sites x 2 peers, 50 Mbit/s, to 85%
    tests/hosts/test_hosts.py --algorithm allreduce --sites 2 --peers-per-site 2 --json
    tests/hosts/test_hosts.py --emulated ...        # the same run on loopback, the WAN emulated
                                                    # by hearsay (its shared pipe at --mbps)

Before training, every peer runs `hearsay-peer --check` at once (the preflight an operator
runs): the first site's first peer measures its links with 4 MiB of probes, the others
their round trips only, and every check must pass; across the tbf the first peer must
measure the shaped rate (within 60-105% of --mbps), inside its site far more.

Exit 0: the preflight passed and the peers' mean test accuracy reached the target; 1: it
did not, or a peer failed;
77: this machine cannot make network namespaces (not root, no CAP_NET_ADMIN): skipped.
"""
import argparse
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: signal_cleanup
import hearsay_logs  # noqa: E402
import signal_cleanup  # noqa: E402

SITE_NAMES = ["eu", "us", "ap", "sa"]
SKIP = 77


def sh(*cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


class Sites:
    """The namespaces, bridge, veth pairs and qdiscs of one run; close() removes them all."""

    def __init__(self, n_sites, mbps, tag):
        self.wan = f"hs{tag}-wan"
        self.sites = [f"hs{tag}-{SITE_NAMES[i]}" for i in range(n_sites)]
        self.addresses = [f"10.77.{tag % 200}.{i + 1}" for i in range(n_sites)]
        self.made = []
        try:
            self._make(mbps)
        except Exception:
            self.close()
            raise

    def _make(self, mbps):
        sh("ip", "netns", "add", self.wan)
        self.made.append(self.wan)
        sh("ip", "-n", self.wan, "link", "set", "lo", "up")
        sh("ip", "-n", self.wan, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.wan, "link", "set", "br0", "up")
        # tbf: rate, a burst of 64 KB (a few frames at line rate), and at most 100 ms queued.
        shape = ["tbf", "rate", f"{mbps}mbit", "burst", "64kb", "latency", "100ms"]
        for i, (ns, addr) in enumerate(zip(self.sites, self.addresses)):
            sh("ip", "netns", "add", ns)
            self.made.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", self.wan, "link", "add", f"s{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "-n", self.wan, "link", "set", f"s{i}", "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("tc", "-n", ns, "qdisc", "add", "dev", "eth0", "root", *shape)             # the site's uplink
            sh("tc", "-n", self.wan, "qdisc", "add", "dev", f"s{i}", "root", *shape)      # its downlink

    def close(self):
        for ns in reversed(self.made):
            sh("ip", "netns", "del", ns, check=False)
        self.made = []


def can_make_namespaces():
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return False
    probe = f"hsprobe{os.getpid()}"
    ok = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if ok:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return ok


class Loopback:
    """--emulated: every peer on 127.0.0.1 (ports apart), nothing made in the kernel."""

    def __init__(self, n_sites):
        self.sites = [None] * n_sites
        self.addresses = ["127.0.0.1"] * n_sites

    def close(self):
        pass


def config_text(args, sites):
    peers, links = [], []
    for s, (ns, addr) in enumerate(zip(sites.sites, sites.addresses)):
        for k in range(args.peers_per_site):
            slow = ' slowdown: 4' if s == 1 and k == args.peers_per_site - 1 and args.slow_peer else ""
            port = 17101 + s * args.peers_per_site + k
            peers.append(f'  peers {{ name: "{SITE_NAMES[s]}-{k}" site: "{SITE_NAMES[s]}" address: "{addr}:{port}"{slow} }}')
    names = SITE_NAMES[:args.sites]
    # Kernel-shaped: latency only, the emulated pipe's bandwidth far above the tbf's.
    # Emulated: hearsay's shared pipe between each pair of sites at --mbps, and the LAN.
    wan_mbps = args.mbps if args.emulated else 100000
    lan = '  site_links {{ site_a: "{0}" site_b: "{0}" link {{ latency_ms: 0.5 bandwidth_mbps: {1} }} }}'
    if args.latency_ms > 0 or args.emulated:
        for i, a in enumerate(names):
            links.append(lan.format(a, 100000))  # a site's peers share a host (namespace): its LAN unshaped
            for b in names[i + 1:]:
                links.append(f'  site_links {{ site_a: "{a}" site_b: "{b}" link {{ latency_ms: {args.latency_ms} bandwidth_mbps: {wan_mbps:g} }} }}')
    gossip = {"adpsgd": 'gossip { algorithm: "adpsgd" topology: "random" }',
              "allreduce": 'gossip { algorithm: "allreduce" topology: "ring" }'}[args.algorithm]  # fp32: the WAN's load
    return f"""name: "hosts"
seed: {args.seed}
device: "cpu"
model {{ kind: MLP hidden: [256, 256] }}
data {{ format: IDX }}
optim {{ optimizer: "sgd" lr: 0.05 momentum: 0.9 nesterov: true }}
train {{ batch_size: 64 epochs: {args.epochs} eval_every_s: 1 target_test_acc: {args.target} emulated_step_s: {args.step_ms / 1000} }}
log {{ every_steps: 50 }}
cluster {{
  id: "hosts"
  secret_env: "HEARSAY_SECRET"
  transport: "tcp"
  connect_timeout_s: 60
{chr(10).join(peers)}
  {gossip}
{chr(10).join(links)}
}}
"""


def preflight(args, sites, cfg, env, peer_bin, out_dir):
    """Every peer's --check at once; returns the first peer's measured links and the failures."""
    procs = []
    for s, ns in enumerate(sites.sites):
        for k in range(args.peers_per_site):
            name = f"{SITE_NAMES[s]}-{k}"
            measure = s == 0 and k == 0
            cmd = [peer_bin, "--config", cfg, "--peer", name, "--check", "--check-bytes", str(4 << 20 if measure else 0)]
            if ns is not None:
                cmd = ["ip", "netns", "exec", ns] + cmd
            out = open(os.path.join(out_dir, name + ".check"), "w")
            procs.append((name, subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT), out))
    start = time.monotonic()
    failures = {}
    for name, p, out in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        out.close()
        if p.returncode != 0:
            with open(out.name) as f:
                failures[name] = f.read()[-2000:]
    took = time.monotonic() - start
    first = f"{SITE_NAMES[0]}-0"
    links = {}
    with open(os.path.join(out_dir, first + ".check")) as f:
        for line in f:
            m = re.match(r"\s+ok\s+(\S+)\s.*rtt ([0-9.]+) ms, ([0-9.]+) Mbit/s", line)
            if m:
                links[m.group(1)] = {"rtt_ms": float(m.group(2)), "mbit_per_s": float(m.group(3))}
    for name in (f"{SITE_NAMES[s]}-{k}" for s in range(args.sites) for k in range(args.peers_per_site)):
        if name == first:
            continue
        got = links.get(name)
        if got is None:
            failures.setdefault(first, f"no measured link to {name}")
            continue
        across = not name.startswith(SITE_NAMES[0] + "-")
        if not args.emulated and across and not 0.6 * args.mbps <= got["mbit_per_s"] <= 1.05 * args.mbps:
            failures.setdefault(first, f"measured {got['mbit_per_s']} Mbit/s to {name} across a {args.mbps:g} Mbit/s tbf")
    return {"check_s": round(took, 1), "links_of_" + first: links}, failures


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sites", type=int, default=3)
    ap.add_argument("--peers-per-site", type=int, default=2)
    ap.add_argument("--mbps", type=float, default=50, help="each site's uplink and downlink (tbf)")
    ap.add_argument("--latency-ms", type=float, default=40, help="emulated one-way WAN latency (0: none)")
    ap.add_argument("--algorithm", choices=["adpsgd", "allreduce"], default="adpsgd")
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=8, help="passes over each peer's shard")
    ap.add_argument("--step-ms", type=float, default=10, help="each step's emulated compute (a GPU's), ms")
    ap.add_argument("--slow-peer", action="store_true", help="the second site's last peer is a 4x slower GPU")
    ap.add_argument("--max-s", type=float, default=240, help="stop the peers after this long")
    ap.add_argument("--bin", default=os.environ.get("HEARSAY_BIN_DIR", os.path.join(ROOT, "build", "bin")))
    ap.add_argument("--keep", help="write the run's logs into this directory (default: a temporary one, removed)")
    ap.add_argument("--json", action="store_true", help="print the run's summary as one JSON line")
    ap.add_argument("--emulated", action="store_true",
                    help="no namespaces: the same peers on loopback, the WAN as hearsay's emulated shared pipe")
    args = ap.parse_args()
    if not 1 <= args.sites <= len(SITE_NAMES) or args.peers_per_site < 1 or args.sites * args.peers_per_site < 2:
        ap.error("--sites 1-4 and --peers-per-site >= 1, two peers at least")
    if not args.emulated and not can_make_namespaces():
        print("test-hosts: SKIPPED: this machine cannot make network namespaces (needs root and CAP_NET_ADMIN)")
        return SKIP
    out_dir = args.keep or tempfile.mkdtemp(prefix="hearsay-hosts-")
    os.makedirs(out_dir, exist_ok=True)
    tag = os.getpid() % 10000
    sites = Loopback(args.sites) if args.emulated else Sites(args.sites, args.mbps, tag)
    procs = []
    try:
        cfg = os.path.join(out_dir, "hosts.textproto")
        with open(cfg, "w") as f:
            f.write(config_text(args, sites))
        env = dict(os.environ, HEARSAY_SECRET=secrets.token_hex(16), OPENBLAS_CORETYPE=os.environ.get("OPENBLAS_CORETYPE", "Haswell"),
                   OPENBLAS_NUM_THREADS="1", HEARSAY_RUN_ID=f"hosts:{os.getpid()}:{out_dir}")  # one scope of shared pipes
        peer_bin = os.path.abspath(os.path.join(args.bin, "hearsay-peer"))
        checked, check_failures = preflight(args, sites, cfg, env, peer_bin, out_dir)
        for name, text in check_failures.items():
            print(f"test-hosts: the preflight (--check) of {name} failed:\n{text}", file=sys.stderr)
        if check_failures:
            return 1
        for s, ns in enumerate(sites.sites):
            for k in range(args.peers_per_site):
                name = f"{SITE_NAMES[s]}-{k}"
                with open(os.path.join(out_dir, name + ".err"), "w") as err:
                    cmd = [peer_bin, "--config", cfg, "--peer", name, "--quiet", "--log", os.path.join(out_dir, name + ".jsonl")]
                    if ns is not None:
                        cmd = ["ip", "netns", "exec", ns] + cmd
                    procs.append((name, subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)))
        start = time.monotonic()
        while time.monotonic() - start < args.max_s and any(p.poll() is None for _, p in procs):
            time.sleep(0.5)
        for _, p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for _, p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        wall_s = time.monotonic() - start
        # A peer our SIGTERM stopped exits 143 itself (128 + SIGTERM, its stop checkpoint written).
        failed = {name: p.returncode for name, p in procs if p.returncode not in (0, 128 + signal.SIGTERM, -signal.SIGTERM)}
        summary = hearsay_logs.run_summary(out_dir, args.target)
        site_of = {f"{SITE_NAMES[s]}-{k}": SITE_NAMES[s] for s in range(args.sites) for k in range(args.peers_per_site)}
        wan = hearsay_logs.wan_bytes_per_site(out_dir, site_of)
        ends = [e for name in site_of for e in hearsay_logs.read_log(os.path.join(out_dir, name + ".jsonl"), warn=False)[1]
                if e.get("event") == "end"]
        train_s = max((e.get("t") or 0) for e in ends) if ends else 0
        result = {
            "bench": "hosts", "sites": args.sites, "peers_per_site": args.peers_per_site, "algorithm": args.algorithm,
            "wan": "emulated" if args.emulated else "kernel tbf", "mbps": args.mbps, "latency_ms": args.latency_ms,
            "seed": args.seed,
            "addresses": sites.addresses, "wall_s": round(wall_s, 1),
            "time_to_target_s": summary.get("time_to_target_s"), "final_test_acc": summary.get("final_test_acc"),
            "bytes_sent_total": summary.get("bytes_sent_total"), "steps_total": summary.get("steps_total"),
            "wan_bytes_per_site": wan,
            # Per site, its WAN bytes over the run (the last peer's end): the uplink's use.
            "wan_mbit_per_s_per_site": {k: round(8 * v / train_s / 1e6, 2) for k, v in wan.items()} if train_s else None,
            "s_per_step": round(train_s / (max(e.get("steps", 0) for e in ends) or 1), 4) if ends else None,
            "failed_peers": failed,
            "preflight": checked,
        }
        if args.json:
            print(json.dumps(result))
        else:
            print(f"test-hosts: {args.sites} sites x {args.peers_per_site} peers at {', '.join(sites.addresses)}, "
                  f"{'emulated' if args.emulated else 'tbf'} {args.mbps:g} Mbit/s each way, {args.algorithm}: "
                  f"time to {100 * args.target:.0f}% "
                  f"{result['time_to_target_s']} s, final mean accuracy {result['final_test_acc']}, "
                  f"{wall_s:.0f} s; preflight {checked['check_s']} s, links measured from {SITE_NAMES[0]}-0: "
                  + ", ".join(f"{k} {v['mbit_per_s']:g} Mbit/s" for k, v in checked[f"links_of_{SITE_NAMES[0]}-0"].items()))
        for name, code in failed.items():
            with open(os.path.join(out_dir, name + ".err")) as f:
                print(f"test-hosts: peer {name} failed ({code}):\n{f.read()[-2000:]}", file=sys.stderr)
        return 0 if not failed and result["time_to_target_s"] is not None else 1
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
        sites.close()
        if not args.keep:
            shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    signal_cleanup.run(main)
