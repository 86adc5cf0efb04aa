#!/usr/bin/python3
"""hearsay-run: runs an experiment config, every peer as its own process on this machine.

    hearsay-run CONFIG [--set FRAGMENT]... [--out-dir DIR] [--plain] [--print-commands]

The config (docs/CONFIG.md) names the cluster, its emulated links and the experiment:
repeats, a sweep grid, when to stop. hearsay-peer checks every run of it first (exit 2
with FILE:LINE:COLUMN on a bad config, before anything starts). Each run writes, under
runs/NAME-TIMESTAMP/ (never overwritten): the resolved config, each peer's JSON Lines log
and stderr, and summary.json; a sweep or repeats add one directory per run and a
`points` list in the top-level summary.json.

--print-commands prints the command line of each peer for a real multi-site launch.
At the end (of a sweep: of all its runs) it writes the report, index.html with the figures
beside it (hearsay-plot draws it again). Ctrl-C or SIGTERM stops every peer, lets them
flush their logs, and still writes the summary and the report. Exit status: 0 done, 1 a
peer failed, 2 bad input, 130 interrupted.
"""
import argparse
import datetime
import json
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import sysconfig
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import hearsay_figures  # noqa: E402
import hearsay_logs  # noqa: E402
import hearsay_metrics  # noqa: E402

HERE = os.path.dirname(os.path.realpath(__file__))


def site_of(plan):
    """{peer: site} of a plan's cluster."""
    return {peer["name"]: peer["site"] for peer in plan["peers"]}


def default_peer_bin():
    # Installed beside hearsay-peer in build/bin, or run from experiments/ in the source tree.
    for candidate in (os.path.join(HERE, "hearsay-peer"), os.path.join(HERE, "..", "build", "bin", "hearsay-peer")):
        if os.path.exists(candidate):
            return os.path.realpath(candidate)
    return "hearsay-peer"


class Interrupted(Exception):
    pass


STOP = {"signal": None}


def on_signal(signum, _frame):
    STOP["signal"] = signum


def python_bin(args):
    """What runs a config's `program` (a torch peer): hearsay-python beside hearsay-peer in
    a build folder; in an installed hearsay (pip, no hearsay-python), this interpreter,
    which imports the installed package."""
    beside = os.path.join(os.path.dirname(os.path.realpath(args.peer_bin)), "hearsay-python")
    if os.path.exists(beside) or not os.path.exists(os.path.join(HERE, "..", "_engine" + sysconfig.get_config_var("EXT_SUFFIX"))):
        return beside
    return sys.executable


def program_cmd(args, program):
    """The command that starts a peer: hearsay-peer, or the config's Python program."""
    if not program:
        return [args.peer_bin]
    if not os.path.exists(program):
        sys.stderr.write(f"hearsay-run: error: program '{program}': no such file (relative to {os.getcwd()})\n")
        sys.exit(2)
    if not os.path.exists(python_bin(args)):
        sys.stderr.write(f"hearsay-run: error: program '{program}' needs {python_bin(args)}, which this build lacks "
                         "(the Python front end: pybind11-dev, python3-dev)\n")
        sys.exit(2)
    return [python_bin(args), os.path.abspath(program)]


def peer_cmd(args, config, extra_sets):
    cmd = [args.peer_bin, "--config", config]
    for s in list(args.set) + list(extra_sets):
        cmd += ["--set", s]
    return cmd


def plan(args):
    r = subprocess.run(peer_cmd(args, args.config, []) + ["--plan"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr.replace("hearsay-peer:", "hearsay-run:"))
        sys.exit(2 if r.returncode == 2 else 1)
    return json.loads(r.stdout)


def new_run_dir(out_dir, name):
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = os.path.join(out_dir, f"{name}-{stamp}")
    path, n = base, 1
    while True:
        try:
            os.makedirs(path)
            return path
        except FileExistsError:
            n += 1
            path = f"{base}-{n}"


def label_of(point):
    parts = [f"{k}={v}" for k, v in point["values"].items()]
    text = "-".join(parts) if parts else "run"
    return re.sub(r"[^A-Za-z0-9=._-]+", "_", text)[:80]


def print_commands(args, p):
    env = p["secret_env"]
    print(f"# {len(p['peers'])} peers of '{p['name']}'; run each line on its own site.")
    if env:
        print(f"# Every peer needs the cluster secret in ${env} (the same value everywhere).")
    for peer in p["peers"]:
        print(f"# site {peer['site']}, peer {peer['name']}, listens on {peer['address']}")
        program = p["points"][0].get("program", "") if p["points"] else ""
        cmd = program_cmd(args, program) + ["--config", os.path.abspath(args.config)]
        cmd += [x for s in args.set for x in ("--set", s)] + ["--peer", peer["name"]]
        print(" ".join(shlex.quote(c) for c in cmd))
    print("# or from Slurm: srun hearsay-peer --config CONFIG (the peer is SLURM_PROCID); see peers/")


# --- live progress --------------------------------------------------------------------------


class PeerView:
    """What the progress display knows of a peer, from the tail of its log."""

    def __init__(self, name, log):
        self.name, self.log, self.offset, self.partial = name, log, 0, ""
        self.step = 0
        self.rate = None
        self.loss = None
        self.acc = None
        self.reached_at = None
        self.tx = None
        self.tau = None
        self.last_bytes = None
        self.last_t = None
        self.quarantined = []  # neighbours whose updates this peer refuses now
        self.state = "starting"

    def poll(self, target, mean):
        """Reads what the log has gained; each evaluation goes into mean (the peers' mean
        accuracy, hearsay_figures.MeanOfLatest)."""
        try:
            with open(self.log, encoding="utf-8", errors="replace") as f:
                f.seek(self.offset)
                data = f.read()
                self.offset = f.tell()
        except FileNotFoundError:
            return
        data = self.partial + data
        lines = data.split("\n")
        self.partial = lines.pop()  # an unfinished line waits for its end
        for line in lines:
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue
            if hearsay_logs.event_problem(e) is not None:
                continue  # the summary's reading of the log reports it
            kind = e.get("event")
            if kind == "step":
                self.state = "training"
                self.step = e.get("step", self.step)
                self.loss = e.get("loss", self.loss)
                self.rate = e.get("samples_per_s")
            elif kind == "eval":
                self.acc = e.get("test_acc", self.acc)
                mean.set(self.name, self.acc)
                if target > 0 and self.reached_at is None and self.acc is not None and self.acc >= target:
                    self.reached_at = e.get("t")
            elif kind == "gossip":
                b, t = e.get("bytes_sent"), e.get("t")
                if self.last_bytes is not None and t is not None and t > self.last_t:
                    self.tx = (b - self.last_bytes) / (t - self.last_t)
                self.last_bytes, self.last_t = b, t
                self.tau = e.get("tau_p50")
                q = e.get("quarantined")
                self.quarantined = q if isinstance(q, list) else []
            elif kind == "end":
                self.state = "done"


def fmt(v, spec, none="-"):
    return none if v is None else format(v, spec)


def render(views, elapsed, title):
    rows = [f"{title}  {elapsed:6.1f} s",
            f"  {'peer':<12} {'state':<9} {'step':>7} {'samples/s':>10} {'loss':>7} {'test acc':>8} {'tx MB/s':>8} {'tau p50':>7}"]
    for v in views:
        acc = fmt(v.acc * 100 if v.acc is not None else None, ".2f") + ("*" if v.reached_at is not None else " ")
        rows.append(f"  {v.name:<12} {v.state:<9} {v.step:>7} {fmt(v.rate, '10.1f'):>10} {fmt(v.loss, '7.4f'):>7} "
                    f"{acc:>9} {fmt(v.tx / 1e6 if v.tx is not None else None, '8.2f'):>8} {fmt(v.tau, '7.1f'):>7}"
                    + (f"  quarantined: {','.join(map(str, v.quarantined))}" if v.quarantined else ""))
    return rows


class Display:
    def __init__(self, plain, every_s):
        self.tty = sys.stdout.isatty() and not plain
        self.every_s = every_s
        self.last = -1e9
        self.lines = 0

    def show(self, views, elapsed, title, force=False):
        if not force and elapsed - self.last < (0.5 if self.tty else self.every_s):
            return
        self.last = elapsed
        rows = render(views, elapsed, title)
        if self.tty:
            if self.lines:
                sys.stdout.write(f"\x1b[{self.lines}F")
            sys.stdout.write("".join(r + "\x1b[K\n" for r in rows))
            self.lines = len(rows)
        else:
            parts = [f"{v.name} step {v.step} {fmt(v.rate, '.0f')} samples/s loss {fmt(v.loss, '.3f')}"
                     f" acc {fmt(v.acc * 100 if v.acc is not None else None, '.1f')}%"
                     f" tx {fmt(v.tx / 1e6 if v.tx is not None else None, '.2f')} MB/s tau {fmt(v.tau, '.0f')}"
                     + (f" quarantined {','.join(map(str, v.quarantined))}" if v.quarantined else "") for v in views]
            sys.stdout.write(f"[{title} {elapsed:.0f}s] " + " | ".join(parts) + "\n")
        sys.stdout.flush()

    def reset(self):
        self.lines = 0


# --- one run ------------------------------------------------------------------------------


def tail(path, n=10):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except FileNotFoundError:
        return ""


def measure_emulated_step(args, p):
    """experiment.emulate_compute: one peer's step and one evaluation measured alone, each
    scaled so that every peer of a run fits on this machine's cores at once
    (ceil(peers / cores)) with experiment.emulate_headroom to spare (1.3: 30%). A simulated run takes the same figures, so
    that it compares with the real run of the config on this machine. Returns a dict:
    emulated_step_s, measured_step_s, and emulated_eval_s, measured_eval_s where the
    program measured an evaluation."""
    program = p["points"][0].get("program", "") if p["points"] else ""
    cmd = program_cmd(args, program) + ["--config", args.config] + [x for s in args.set for x in ("--set", s)]
    r = subprocess.run(cmd + ["--measure-step", "50"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr.replace("hearsay-peer:", "hearsay-run:"))
        sys.exit(2)
    measured = json.loads(r.stdout)
    share = -(-len(p["peers"]) // (os.cpu_count() or 1))
    headroom = p.get("emulate_headroom", 1.3)
    out = {"emulated_step_s": round(measured["step_s"] * share * headroom, 6), "measured_step_s": measured["step_s"]}
    if "eval_s" in measured:
        out.update(emulated_eval_s=round(measured["eval_s"] * share * headroom, 6), measured_eval_s=measured["eval_s"])
    return out


def write_run_config(args, p, point, run_dir, emulated):
    """The run's resolved config, in run_dir/config.textproto; returns its path."""
    cfg_path = os.path.join(run_dir, "config.textproto")
    sets = list(point["sets"])
    if emulated is not None:
        sets.append("train { emulated_step_s: %r }" % emulated["emulated_step_s"])
        if "emulated_eval_s" in emulated:
            sets.append("train { emulated_eval_s: %r }" % emulated["emulated_eval_s"])
    if p["checkpoint_dir"] or p["checkpoint_every_steps"] > 0:
        # Each run checkpoints into its own directory: runs of a sweep share peer names, and
        # one must never resume from another's state.
        sets.append('checkpoint { dir: "%s" }' % os.path.abspath(os.path.join(run_dir, "checkpoints")).replace('"', '\\"'))
    r = subprocess.run(peer_cmd(args, args.config, sets) + ["--print-config"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stderr)
        sys.exit(2)
    with open(cfg_path, "w", encoding="utf-8") as f:
        f.write(r.stdout)
    return cfg_path


def simulate_point(args, p, point, run_dir, emulated=None):
    """One run on the simulator (hearsay-sim): every peer in one process, on virtual time.
    Its progress lines go to the terminal as they come. summary.json holds only what the
    simulation decides (the same for the same config and seed, byte for byte); its wall
    time, speed and memory are in sim_stats.json beside it."""
    cfg_path = write_run_config(args, p, point, run_dir, emulated)
    cmd = [sim_bin(args), "--config", cfg_path, "--log-dir", run_dir, "--progress-every", str(p["progress_every_s"])]
    with open(os.path.join(run_dir, "sim.out"), "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE, text=True)
        with open(os.path.join(run_dir, "sim.err"), "w") as err:
            out_of_mappings = False
            for line in proc.stderr:
                err.write(line)
                sys.stderr.write(line)
                out_of_mappings = out_of_mappings or "Failed to protect stack" in line
        proc.wait()
    if out_of_mappings:
        # SimGrid maps each actor's stack with a guard page: two memory mappings an actor,
        # and the simulator runs one actor per busy directed link (a site of 64 peers whose
        # all-gather posts to all 63 at once keeps 64 x 63 links busy in each site).
        sys.stderr.write(f"hearsay-run: {run_dir}: the simulation ran out of memory mappings (vm.max_map_count = "
                         f"{tail('/proc/sys/vm/max_map_count', 1).strip() or '?'}): each busy simulated link is an actor with two; "
                         "raise it, e.g. sysctl -w vm.max_map_count=262144 (docs/SIMULATION.md, \"Scale\")\n")
    if proc.returncode == 2:
        sys.exit(2)  # bad input: hearsay-sim said where
    summary = hearsay_logs.run_summary(run_dir, p["target_test_acc"])
    cluster = hearsay_logs.simulator_log(run_dir)
    summary.update({
        "name": p["name"],
        "dir": os.path.basename(run_dir),
        "values": point["values"],
        "repeat": point["repeat"],
        "simulated": True,
        "stopped_by": cluster.get("stopped_by") or ("failed" if proc.returncode != 0 else "finished"),
        "failed_peers": [] if proc.returncode == 0 else ["(simulation)"],
        "virtual_s": cluster.get("virtual_s"),
        "faults": cluster.get("faults", []),
        "mean_model_final_test_acc": cluster.get("mean_model_final_test_acc"),
        "wan_bytes_per_site": hearsay_logs.wan_bytes_per_site(run_dir, site_of(p)),
        "steps_per_s_per_site": hearsay_logs.steps_per_s_per_site(summary["peers"], site_of(p)),
    })
    if emulated is not None:
        summary.update({k: v for k, v in emulated.items() if k.startswith("emulated_")})
    with open(os.path.join(run_dir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    return summary


def run_one_program(args, p, env):
    """A config of one peer whose `program` is a torch script: each run of it is that script,
    started as a cluster's peers are (the run's resolved config, its log in the run
    directory), with its output on this terminal. Returns its exit status (128 + N for a
    signal, as a shell gives)."""
    root = new_run_dir(args.out_dir or p["out_dir"], p["name"])
    points = p["points"]
    print(f"hearsay-run: {len(points)} run(s) of '{p['name']}', one peer ({points[0]['program']}), into {root}")
    code = 0
    for point in points:
        run_dir = root
        if len(points) > 1:
            run_dir = os.path.join(root, f"p{point['index']:03d}-{label_of(point)}-r{point['repeat']}")
            os.makedirs(run_dir)
        cfg_path = write_run_config(args, p, point, run_dir, None)
        log = os.path.join(run_dir, f"{p['name']}.jsonl")
        cmd = program_cmd(args, point.get("program", "")) + ["--config", cfg_path, "--log", log]
        code = subprocess.run(cmd, env=env).returncode
        code = 128 - code if code < 0 else code
        print(f"hearsay-run: {os.path.basename(run_dir)}: exit {code}; its log: {log}")
        if code != 0:
            break
    return code


def sim_bin(args):
    """hearsay-sim, beside hearsay-peer."""
    return os.path.join(os.path.dirname(os.path.realpath(args.peer_bin)), "hearsay-sim")


def run_point(args, p, point, run_dir, display, env, emulated=None, cluster_metrics=None):
    cfg_path = write_run_config(args, p, point, run_dir, emulated)
    procs, views = {}, []
    metrics_ports = {}
    if cluster_metrics is not None:
        # Each peer's own /metrics on a loopback port, scraped by hearsay-run's.
        metrics_ports = dict(zip([peer["name"] for peer in p["peers"]], hearsay_metrics.free_ports(len(p["peers"]))))
        cluster_metrics.set_peers(metrics_ports)
    for peer in p["peers"]:
        name = peer["name"]
        log = os.path.join(run_dir, f"{name}.jsonl")
        out = open(os.path.join(run_dir, f"{name}.out"), "w")
        err = open(os.path.join(run_dir, f"{name}.err"), "w")
        cmd = program_cmd(args, point.get("program", "")) + ["--config", cfg_path, "--peer", name, "--quiet", "--log", log]
        if name in metrics_ports:
            cmd += ["--metrics", f"127.0.0.1:{metrics_ports[name]}"]
        # One shared-WAN scope per run: its peers share the emulated site-to-site pipes.
        run_env = dict(env, HEARSAY_RUN_ID=f"{os.getpid()}:{os.path.abspath(run_dir)}")
        procs[name] = (subprocess.Popen(cmd, stdout=out, stderr=err, env=run_env), out, err)
        views.append(PeerView(name, log))
    title = os.path.basename(run_dir)
    target = p["target_test_acc"]
    start = time.monotonic()
    stopped_by, failed, stopping_since = None, [], None
    exit_codes = {}
    # The peers' mean accuracy by hearsay_figures' rule, as time to target reads it from the
    # logs: every peer waited for, one that died keeping its last value (no peer restarts).
    mean = hearsay_figures.MeanOfLatest(v.name for v in views)
    display.reset()
    while True:
        time.sleep(0.2)
        elapsed = time.monotonic() - start
        for v in views:
            v.poll(target, mean)
        for name, (proc, _, _) in procs.items():
            if name in exit_codes or proc.poll() is None:
                continue
            exit_codes[name] = proc.returncode
            view = next(v for v in views if v.name == name)
            if proc.returncode != 0 and stopping_since is None:
                view.state = "died"
                failed.append(name)
                how = f"exit status {proc.returncode}" if proc.returncode > 0 else f"signal {-proc.returncode}"
                sys.stderr.write(f"\nhearsay-run: peer {name} died ({how}); the tail of its stderr:\n"
                                 f"{tail(os.path.join(run_dir, name + '.err'))}\n")
                display.reset()
                if p["synchronous"]:
                    stopped_by = stopped_by or "peer_failed"  # the others cannot go on without it
            elif view.state != "died":
                view.state = "done" if proc.returncode == 0 else "stopped"
        if len(exit_codes) == len(procs):
            break
        if stopped_by is None:
            if STOP["signal"] is not None:
                stopped_by = "signal"
            elif p["stop_at_target"] and hearsay_figures.reached(mean.mean(), target):
                stopped_by = "target"
            elif p["max_wall_s"] > 0 and elapsed > p["max_wall_s"]:
                stopped_by = "wall_time"
        if stopped_by is not None and stopping_since is None:
            stopping_since = elapsed
            for name, (proc, _, _) in procs.items():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
        if stopping_since is not None and elapsed - stopping_since > 15:
            for proc, _, _ in procs.values():
                if proc.poll() is None:
                    proc.kill()  # a peer that ignores SIGTERM for 15 s
        display.show(views, elapsed, title)
    display.show(views, time.monotonic() - start, title, force=True)
    for _, out, err in procs.values():
        out.close()
        err.close()
    summary = hearsay_logs.run_summary(run_dir, target)
    summary.update({
        "name": p["name"],
        "run_dir": run_dir,
        "values": point["values"],
        "repeat": point["repeat"],
        "stopped_by": stopped_by or "finished",
        "failed_peers": failed,
        "exit_codes": exit_codes,
        "wall_s": round(time.monotonic() - start, 3),
        "wan_bytes_per_site": hearsay_logs.wan_bytes_per_site(run_dir, site_of(p)),
        "steps_per_s_per_site": hearsay_logs.steps_per_s_per_site(summary["peers"], site_of(p)),
    })
    if emulated is not None:
        summary.update(emulated)
    with open(os.path.join(run_dir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    return summary


def write_report(root):
    """The figures and index.html of every run under root (hearsay_plot.report, as
    hearsay-plot ROOT draws them again). A report that fails says so and changes no exit
    status: the runs and their summaries are complete without it."""
    try:
        import hearsay_plot  # matplotlib takes a second to import: only once the runs are done
        hearsay_plot.report([root], root)
    except SystemExit as e:  # no peer wrote a log (stopped before any started)
        print(f"hearsay-run: no report: {e}", file=sys.stderr)
        return
    except Exception:  # noqa: BLE001 - a bug in the report must not lose the run's exit status
        traceback.print_exc()
        print(f"hearsay-run: the report failed; the runs and summary.json are complete (hearsay-plot {root} "
              "draws it again)", file=sys.stderr)
        return
    print(f"hearsay-run: report in {os.path.join(root, 'index.html')}")


def describe(s):
    ttt = "-" if s["time_to_target_s"] is None else f"{s['time_to_target_s']:.1f} s"
    acc = "-" if s["final_test_acc"] is None else f"{100 * s['final_test_acc']:.2f}%"
    return (f"time to {100 * s['target_test_acc']:.0f}%: {ttt}, final test accuracy {acc}, "
            f"{s['bytes_sent_total'] / 1e6:.1f} MB sent, {s['steps_total']} steps ({s['stopped_by']})")


def main():
    ap = argparse.ArgumentParser(prog="hearsay-run", description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--set", action="append", default=[], metavar="FRAGMENT",
                    help="merge a text-format fragment over the config (repeatable)")
    ap.add_argument("--out-dir", help="where run directories go (default: experiment.out_dir, runs)")
    ap.add_argument("--plain", action="store_true", help="periodic progress lines even on a terminal")
    ap.add_argument("--print-commands", action="store_true", help="print each peer's command line and exit")
    ap.add_argument("--peer-bin", default=default_peer_bin(), help="the hearsay-peer program")
    ap.add_argument("--metrics", metavar="HOST:PORT",
                    help="serve the running cluster's metrics (every peer's, labelled) in Prometheus's text format "
                         "at http://HOST:PORT/metrics (docs/OPERATIONS.md)")
    ap.add_argument("--simulate", action="store_true",
                    help="run every peer in one process on virtual time, over SimGrid's network model "
                         "(docs/SIMULATION.md); as experiment.simulate: true")
    args = ap.parse_args()
    if args.simulate:
        args.set.append("experiment { simulate: true }")
    if not os.path.exists(args.config):
        print(f"hearsay-run: error: {args.config}: no such config", file=sys.stderr)
        return 2
    p = plan(args)
    one_program = p["points"][0].get("program", "") if len(p["peers"]) < 2 and p["points"] else ""
    if len(p["peers"]) < 2 and not one_program:
        print(f"hearsay-run: error: {args.config}: cluster.peers lists {len(p['peers'])} peer(s) and the config names "
              f"no program; hearsay-run runs clusters and torch programs (a native peer alone: hearsay-peer --config "
              f"{args.config})", file=sys.stderr)
        return 2
    for point in p["points"]:
        program_cmd(args, point.get("program", ""))  # a missing program stops here, before any run
    if args.print_commands:
        print_commands(args, p)
        return 0
    cluster_metrics = None
    if args.metrics:
        if args.simulate or p.get("simulate", False):
            print("hearsay-run: error: --metrics: a simulated cluster runs in one process on virtual time; "
                  "its figures are in its logs, not live", file=sys.stderr)
            return 2
        try:
            cluster_metrics = hearsay_metrics.ClusterMetrics(args.metrics)
        except ValueError as e:
            print(f"hearsay-run: error: {e}", file=sys.stderr)
            return 2
        print(f"hearsay-run: the cluster's metrics at http://{args.metrics}/metrics (port {cluster_metrics.port})")
    env = dict(os.environ)
    if one_program:
        return run_one_program(args, p, env)
    if p["secret_env"] and not env.get(p["secret_env"]):
        env[p["secret_env"]] = secrets.token_hex(16)  # peers on this machine share a made-up secret
    root = new_run_dir(args.out_dir or p["out_dir"], p["name"])
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    display = Display(args.plain, p["progress_every_s"])
    points = p["points"]
    print(f"hearsay-run: {len(points)} run(s) of '{p['name']}', {len(p['peers'])} peers each, into {root}")
    simulate = p.get("simulate", False)
    if simulate and not any("simulate: true" in x for x in args.set):
        args.set.append("experiment { simulate: true }")
    emulated = None
    if p.get("emulate_compute") and not (simulate and p.get("emulated_step_s", 0) > 0):
        emulated = measure_emulated_step(args, p)
        said = (f"hearsay-run: emulated compute: a step takes slowdown x {emulated['emulated_step_s'] * 1e3:.3f} ms "
                f"(measured {emulated['measured_step_s'] * 1e3:.3f} ms alone")
        if "emulated_eval_s" in emulated:
            said += (f"), an evaluation {emulated['emulated_eval_s'] * 1e3:.1f} ms "
                     f"(measured {emulated['measured_eval_s'] * 1e3:.1f} ms alone")
        print(said + f"; {len(p['peers'])} peers on {os.cpu_count()} cores)")
    summaries = []
    for point in points:
        if STOP["signal"] is not None:
            break
        run_dir = root
        if len(points) > 1:
            run_dir = os.path.join(root, f"p{point['index']:03d}-{label_of(point)}-r{point['repeat']}")
            os.makedirs(run_dir)
        if simulate:
            s = simulate_point(args, p, point, run_dir, emulated)
        else:
            s = run_point(args, p, point, run_dir, display, env, emulated, cluster_metrics)
        summaries.append(s)
        print(f"hearsay-run: {os.path.basename(run_dir)}: {describe(s)}")
    top = dict(summaries[0]) if len(points) == 1 and summaries else {"name": p["name"], "run_dir": root}
    if simulate:
        top.pop("run_dir", None)  # a simulated run's summary is the same wherever it was written
    top["points"] = [{k: v for k, v in s.items() if k != "peers"} for s in summaries]
    top["interrupted"] = STOP["signal"] is not None
    with open(os.path.join(root, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(top, f, indent=2)
        f.write("\n")
    print(f"hearsay-run: summary in {os.path.join(root, 'summary.json')}")
    if cluster_metrics is not None:
        cluster_metrics.close()
    write_report(root)
    if STOP["signal"] is not None:
        return 130
    return 1 if any(s["failed_peers"] for s in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
