#!/usr/bin/python3
"""Writes configs/scale-{16,64,256,1024}.textproto, scale-256-faults and sites-16x8: the
simulator's scale configs (docs/SIMULATION.md, "Scale"). Run from the repository root after
changing the geography:

    tools/make_scale_configs.py            # writes the configs
    tools/make_scale_configs.py --check    # exit 1 when a config differs from what it would write

The geography: 16 sites in real cloud regions. The one-way latency between two sites is
the great-circle distance over light's speed in fibre (200 km/ms) times 1.5 for the
detour of real routes, kept within [20, 150] ms; the WAN bandwidth is 200 Mbit/s within a
continent, 100 Mbit/s between two of the big three (North America, Europe, Asia) and 50
Mbit/s to or from the rest (South America, Africa, the Middle East, Oceania, India). Each
site reaches the WAN through a 1 Gbit/s uplink and downlink, shared by all its peers.
The GPU mix: in every site, half the peers at full speed (slowdown 1, an H100), three in
ten at 2x (an A100), two in ten at 3.5x (a T4).
"""
import math
import os
import sys

SITES = [  # name, latitude, longitude, continent
    ("us-east", 38.9, -77.0, "na"), ("us-west", 45.6, -121.2, "na"), ("us-central", 41.3, -95.9, "na"),
    ("ca-central", 45.5, -73.6, "na"), ("br-south", -23.5, -46.6, "sa"), ("eu-west", 53.3, -6.3, "eu"),
    ("eu-central", 50.1, 8.7, "eu"), ("eu-north", 59.3, 18.1, "eu"), ("uk-south", 51.5, -0.1, "eu"),
    ("af-south", -33.9, 18.4, "af"), ("me-central", 25.3, 55.3, "me"), ("in-west", 19.1, 72.9, "in"),
    ("ap-southeast", 1.35, 103.8, "as"), ("ap-northeast", 35.7, 139.7, "as"), ("ap-east", 22.3, 114.2, "as"),
    ("au-east", -33.9, 151.2, "oc"),
]
BIG = {"na", "eu", "as"}
SIZES = [16, 64, 256, 1024]
HERE = os.path.dirname(os.path.realpath(__file__))
OUT = os.path.join(HERE, "..", "configs")


def distance_km(a, b):
    la1, lo1, la2, lo2 = map(math.radians, (a[1], a[2], b[1], b[2]))
    h = math.sin((la2 - la1) / 2) ** 2 + math.cos(la1) * math.cos(la2) * math.sin((lo2 - lo1) / 2) ** 2
    return 2 * 6371 * math.asin(math.sqrt(h))


def latency_ms(a, b):
    return round(min(150.0, max(20.0, 1.5 * distance_km(a, b) / 200.0)), 1)


def bandwidth_mbps(a, b):
    if a[3] == b[3]:
        return 200
    return 100 if a[3] in BIG and b[3] in BIG else 50


def slowdown(k, per_site):
    """The GPU of a site's k-th peer: half H100 (1), three in ten A100 (2), two in ten T4 (3.5);
    with one peer a site, the sites themselves take turns."""
    frac = (k + 0.5) / per_site
    return 1 if frac < 0.5 else 2 if frac < 0.8 else 3.5


def config(n):
    per_site = n // len(SITES)
    lines = [f"# Scale, {n} peers in 16 sites (tools/make_scale_configs.py writes this file; edit the tool).",
             "# Runs on the simulator only (its site uplinks and GPU spread):",
             f"#   build/bin/hearsay-run --simulate configs/scale-{n}.textproto",
             "# Model: an MLP with one hidden layer of 64 (50,890 parameters, 200 KB): small enough that",
             "# 1,024 copies with their optimizer state and buffers fit in memory, large enough that its",
             "# gossip loads the WAN. Every step is a 20 ms GPU step times the peer's slowdown (half the",
             "# peers 1x, three in ten 2x, two in ten 3.5x), spread +-10%. Contenders: adpsgd (random",
             "# peer), gossip_grad (random 4-regular graph), both in fp16 and sending every 8th step (a",
             "# site's 1 Gbit/s uplink gives each of 64 peers 2 MB/s: an fp16 model every 2 steps each way,",
             "# less what crosses the 50-200 Mbit/s WAN), allreduce (hierarchical, PowerSGD rank 4",
             "# with error feedback; lr 0.1 for the mean gradient, unscaled: the best of 0.05, 0.1, 0.2",
             "# and 0.4 at 16 peers, where linear scaling's 16 x 0.05 stalls at 10%), diloco (site",
             "# replicas with equal shares, as measured before the split existed; 20 inner steps). 16 peers are scored on the",
             "# full test set every 2 virtual seconds (the first of each site), with the mean model.",
             "# Sites (one-way WAN latency from us-east, ms):",
             "#   " + ", ".join(f"{s[0]} {latency_ms(SITES[0], s) if s != SITES[0] else 0}" for s in SITES),
             f'name: "scale-{n}"',
             "seed: 1",
             'device: "cpu"',
             "model { kind: MLP hidden: [64] }",
             "data { format: IDX }",
             'optim { optimizer: "sgd" lr: 0.05 momentum: 0.9 nesterov: true }',
             "train { batch_size: 32 epochs: 100000 max_steps: 1500 eval_every_s: 2 eval_batch_size: 1000"
             " target_test_acc: 0.8 emulated_step_s: 0.02 }",
             "log { every_steps: 100 }",
             "cluster {",
             f'  id: "scale-{n}"',
             '  secret_env: "HEARSAY_SECRET"',
             '  gossip { algorithm: "adpsgd" topology: "random" gossip_every: 8 codec { name: "fp16" model_codec: "fp16" } }']
    port = 20000
    for s, site in enumerate(SITES):
        for k in range(per_site):
            sd = slowdown(k, per_site) if per_site > 1 else [1, 2, 3.5][s % 3]
            extra = f" slowdown: {sd}" if sd != 1 else ""
            lines.append(f'  peers {{ name: "{site[0]}-{k}" site: "{site[0]}" address: "10.{s}.{k // 250}.{k % 250 + 1}:{port}"{extra} }}')
    for i, a in enumerate(SITES):
        lines.append(f'  site_links {{ site_a: "{a[0]}" site_b: "{a[0]}" link {{ latency_ms: 0.5 bandwidth_mbps: 10000 }} }}')
        for b in SITES[i + 1:]:
            lines.append(f'  site_links {{ site_a: "{a[0]}" site_b: "{b[0]}" link {{ latency_ms: {latency_ms(a, b)} '
                         f'bandwidth_mbps: {bandwidth_mbps(a, b)} }} }}')
    lines.append("}")
    lines += ["experiment {",
              "  simulate: true",
              "  sweep {",
              '    field: "cluster.gossip.algorithm"',
              '    name: "contender"',
              '    values: ["adpsgd", "gossip_grad", "allreduce", "diloco"]',
              "    also_set: [",
              '      "",',
              '      "cluster { gossip { topology: \\"random_regular\\" degree: 4 } }",',
              '      "cluster { gossip { topology: \\"ring\\" codec { name: \\"powersgd\\" } [hearsay.algorithms.allreduce] { sync_lr_scaling: \\"none\\" } } } optim { lr: 0.1 }",',
              '      "cluster { site_replicas: true site_split: \\"equal\\" gossip { topology: \\"ring\\" [hearsay.algorithms.diloco] { local_steps: 20 } } }"',
              "    ]",
              "  }",
              "  stop_at_target: true",
              "  simulation {",
              # 1,024 peers run at about 25 wall seconds per virtual second on 2 cores: 30
              # virtual seconds keep a run within 15 minutes.
              f"    max_virtual_s: {30 if n >= 1024 else 300}",
              "    eval_peers: 16",
              "    step_jitter: 0.1"]
    if n >= 1024:
        # A 100 us time quantum (SimGrid's default 10 us): ~4,000 flows in flight through
        # the 16 site uplinks re-solve the max-min shares at every flow's end, and taking
        # the ends 0.1 ms apart together is what keeps gossip_grad within 15 minutes. The
        # 0.5 ms LAN hops stay resolved (a quantum under half a latency), and at 256 peers
        # every contender's figures at 100 us are those at 10 us (docs/SIMULATION.md,
        # "The time quantum").
        lines.append("    time_precision_s: 0.0001")
    for site in SITES:
        lines.append(f'    sites {{ site: "{site[0]}" uplink_mbps: 1000 downlink_mbps: 1000 }}')
    lines += ["  }", "}", ""]
    return "\n".join(lines)


def faults_config():
    """scale-256 with faults: eu-west's uplink and downlink down for 60 virtual seconds, and
    5% of the peers (13) crashed at times spread over [2 s, 12 s), each back 10 s later from
    its checkpoint (every 100 steps); adpsgd alone. The faults strike before the cluster
    reaches its target (about 10 s without them), and the run goes on to 90 virtual s
    instead of stopping there, so that the site's return and every restart are in it."""
    text = config(256).replace('name: "scale-256"', 'name: "scale-256-faults"').replace('id: "scale-256"', 'id: "scale-256-faults"')
    head = ["# scale-256 with faults (tools/make_scale_configs.py writes this file): the site eu-west",
            "# cut off for 60 virtual seconds (its uplink and downlink down from 5 s to 65 s), and 5% of",
            "# the peers (13, chosen by the seed) killed at times spread over [2 s, 12 s), each restarted",
            "# 10 s later from its last checkpoint (every 100 steps). adpsgd only. The faults strike",
            "# before the target (about 10 s without them); the run does not stop there but goes on to",
            "# 90 virtual s (5,000 steps at most) so that the site's return and every restart are in it.",
            "#   build/bin/hearsay-run --simulate configs/scale-256-faults.textproto"]
    body = text.split("\n")
    body = [line for line in body if not line.startswith("#")]
    out, skip = [], False
    for line in body:
        if line.startswith("  sweep {"):
            skip = True
        if not skip:
            out.append(line)
        if skip and line == "  }":
            skip = False
    text = "\n".join(head + out)
    text = text.replace("log { every_steps: 100 }", "log { every_steps: 100 }\ncheckpoint { every_steps: 100 }")
    text = text.replace("max_steps: 1500", "max_steps: 5000")
    text = text.replace("  stop_at_target: true", "  stop_at_target: false")
    text = text.replace("    max_virtual_s: 300", "    max_virtual_s: 90")
    text = text.replace("    step_jitter: 0.1", "    step_jitter: 0.1\n"
                        '    faults { kind: SITE_DOWN site: "eu-west" at_s: 5 for_s: 60 }\n'
                        "    faults { kind: PEER_CRASH fraction: 0.05 at_s: 2 spread_s: 10 for_s: 10 }")
    return text


def sites_config():
    """16 sites x 8 peers (issue 23's table in the simulator): per-GPU gossip against site
    replicas (each site one data-parallel replica, its batch split by speed, its leader
    gossiping for it), adpsgd and gossip_grad, on scale-128's geography and GPU mix; the
    same config, codecs, rates and gossip period on both sides of the comparison."""
    text = config(128).replace('name: "scale-128"', 'name: "sites-16x8"').replace('id: "scale-128"', 'id: "sites-16x8"')
    head = ["# 16 sites x 8 peers (tools/make_scale_configs.py writes this file): each GPU a peer against",
            "# site replicas (cluster.site_replicas: a site's 8 GPUs average their gradients over its 10",
            "# Gbit/s LAN every step, the batch split by their speeds, and only its leader gossips across",
            "# the WAN), for adpsgd and gossip_grad; scale-128's geography, GPU mix, codecs and rates.",
            "#   build/bin/hearsay-run --simulate configs/sites-16x8.textproto"]
    body = [line for line in text.split("\n") if not line.startswith("#")]
    out, skip = [], False
    for line in body:
        if line.startswith("  sweep {"):
            skip = True
            out += ["  sweep {",
                    '    field: "cluster.gossip.algorithm"',
                    '    values: ["adpsgd", "gossip_grad"]',
                    '    also_set: ["", "cluster { gossip { topology: \\"random_regular\\" degree: 4 } }"]',
                    "  }",
                    "  sweep {",
                    '    field: "cluster.site_replicas"',
                    '    values: ["false", "true"]',
                    "  }"]
        if not skip:
            out.append(line)
        if skip and line == "  }":
            skip = False
    return "\n".join(head + out)


def main():
    check = "--check" in sys.argv[1:]
    stale = []
    for n in SIZES + ["256-faults", "sites-16x8"]:
        path = os.path.join(OUT, "sites-16x8.textproto" if n == "sites-16x8" else f"scale-{n}.textproto")
        text = faults_config() if n == "256-faults" else sites_config() if n == "sites-16x8" else config(n)
        if check:
            if not os.path.exists(path) or open(path, encoding="utf-8").read() != text:
                stale.append(path)
            continue
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    if stale:
        print("tools/make_scale_configs.py: out of date (run it): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
