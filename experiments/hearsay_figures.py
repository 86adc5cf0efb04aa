"""The figures hearsay's reports give, each defined once (docs/LOGS.md, "Time to target").

summary.json (hearsay_logs.run_summary), hearsay-run's stop at the target, the report's
panels (hearsay-plot), the tables (hearsay_table.py, hearsay_scale_table.py,
hearsay_compare.py), gpt_geo_report.py and the chaos run all take them from here; none
computes its own. Everything is read from the peers' logs alone ({peer: [events]}, as
hearsay_logs.read_log gives them).

The run's clock. Times are seconds since the earliest peer's start. Each `start` event's
`unix_time` places the `t` of its incarnation's events (those up to the next `start`;
events a log holds before its first `start` belong to that first incarnation) among the
other peers'. Where a log that has a `start` lacks `unix_time` in it, every peer counts
as starting together (times are each log's own `t`); a log with no `start` at all is
placed at the run's start.

Which peers count in a mean over peers (the rule, in MeanOfLatest and Logs.mean_curve):
- every peer with a log counts from the start of the run, with the latest value it
  evaluated at or before t (its last `eval` event's `test_acc`, or `test_loss`);
- the mean is defined only from when every peer that counts has evaluated at least once:
  a peer that starts late, or is slow to evaluate, is waited for, and one peer's early
  crossing is not the cluster's;
- a peer known to be down is left out from when it went down until its next `start`
  (then it counts again, with its last value from before, until it evaluates again:
  it resumed from its checkpoint). Known to be down: a simulated crash (its `fault`
  event, kind `crash` or `churn`, state `begin`, on that peer), or a process that was
  restarted: an incarnation with no `end` event followed by another `start` went down
  at its last event. One that never comes back is left out for good, so a dead peer
  does not hold the run from its target;
- a peer whose log simply stops without an `end` (no restart follows) keeps counting
  with its last value, and is waited for if it never evaluated: the logs cannot tell a
  process that died for good from one still running (hearsay-run's live stop, which
  could, applies the same rule so that the two agree). A peer that ended (`end`, also a
  stop by a signal) counts with its final value;
- a simulated peer whose `start` says `"evaluates": false` never counts (it never
  evaluates);
- the mean is exact (the correctly rounded mean of the values), so peers all at the
  target have a mean at the target.
The curve has a point at every moment the mean changes: each evaluation (evaluations at
the same moment make one point) and each time a peer goes down or comes back. The final
mean (summary.json's final_test_acc) is its value at the end of the logs (Logs.final),
None where it is not defined then.

Time to target: the first time on the curve whose mean reaches the target (at least it
for an accuracy, at most it for a loss); None where it never does, or where there is no
target (an accuracy target of 0).

Bytes to target: the bytes every peer had sent by that time (Logs.bytes_sent): each
peer's running `bytes_sent` (from its `gossip` events and its `end`) interpolated
linearly between the reports around t, held at its last report after them, 0 before its
first incarnation; a restarted process's counter starts again from 0 and is added to what
its earlier incarnations sent (a simulated peer's counter goes on), and nothing is counted
as sent between an incarnation's last report and the next start. Crashed peers' bytes
count: they were sent.

Over seeds: mean and sample standard deviation of a figure over the runs that have it,
with how many have it (over_seeds, mean_sd); a run that never reached the target has no
time to target and is counted as such, not as 0.
"""
import bisect
import math
import statistics

CRASHES = ("crash", "churn")

# Exact sums: a finite double times 2**1074 is an integer.
_SHIFT = 1074


def finite(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _exact(v):
    n, d = float(v).as_integer_ratio()
    return n << (_SHIFT - (d.bit_length() - 1))


class MeanOfLatest:
    """The mean over the peers that count now of each one's latest value; None until every
    one of them has one. A peer left out (count(peer, False)) keeps its latest value for
    when it counts again."""

    def __init__(self, peers=()):
        self.counted = set(peers)
        self.latest = {}
        self._exact = {}
        self._sum = 0  # of the counted peers' latest values, times 2**_SHIFT
        self._valued = 0  # counted peers with a value

    def count(self, peer, counted=True):
        if counted == (peer in self.counted):
            return
        sign = 1 if counted else -1
        (self.counted.add if counted else self.counted.discard)(peer)
        if peer in self._exact:
            self._sum += sign * self._exact[peer]
            self._valued += sign

    def set(self, peer, value):
        if not finite(value):
            return
        x = _exact(value)
        if peer in self.counted:
            self._sum += x - self._exact.get(peer, 0)
            self._valued += peer not in self._exact
        self.latest[peer], self._exact[peer] = value, x

    def mean(self):
        if not self.counted or self._valued < len(self.counted):
            return None
        return self._sum / (len(self.counted) << _SHIFT)

    def values(self):
        """{peer: latest value} of the peers that count, or None while the mean is not defined."""
        return None if self.mean() is None else {p: self.latest[p] for p in sorted(self.counted)}


def reached(value, target, lower_is_better=False):
    """Whether a mean reaches the target: at least it (an accuracy; a target of 0 is none),
    or at most it (a loss)."""
    if value is None or target is None:
        return False
    return value <= target if lower_is_better else target > 0 and value >= target


def time_to_target(curve, target, lower_is_better=False):
    """The first time of a mean curve [(t, mean)] that reaches the target, or None."""
    return next((t for t, v in curve if reached(v, target, lower_is_better)), None)


def value_at(curve, t):
    """The curve's value at time t (its last point at or before t), or None."""
    i = bisect.bisect_right([p[0] for p in curve], t)
    return curve[i - 1][1] if i else None


def _interpolate(times, totals, t):
    """A running total (totals at times) at t: linear between the points around t, the
    last total after them, 0 before them."""
    i = bisect.bisect_right(times, t)
    if i == 0:
        return 0
    if i == len(times):
        return totals[-1]
    t0, t1, b0, b1 = times[i - 1], times[i], totals[i - 1], totals[i]
    return b0 + (b1 - b0) * ((t - t0) / (t1 - t0)) if t1 > t0 else b1


class Logs:
    """One run's logs on the run's clock, with the figures read from them (the module's
    docstring defines each). peer_events: {peer: [events]}."""

    def __init__(self, peer_events):
        self.peers = list(peer_events)
        self.evaluating = [name for name, events in peer_events.items()
                           if not any(e.get("event") == "start" and e.get("evaluates") is False for e in events)]
        starts = {name: [e for e in events if e.get("event") == "start"] for name, events in peer_events.items()}
        self.aligned = any(starts.values()) and all(any(finite(s.get("unix_time")) for s in st)
                                                    for st in starts.values() if st)
        origins = [s["unix_time"] - s["t"] for st in starts.values() for s in st
                   if self.aligned and finite(s.get("unix_time"))]
        base = min(origins) if origins else 0.0
        self.events = {}  # peer: [(t on the run's clock, event)], in log order
        self.first_start = {}  # peer: its first start's origin on the run's clock
        for name, events in peer_events.items():
            first = next((s for s in starts[name] if finite(s.get("unix_time"))), None) if self.aligned else None
            origin = first["unix_time"] - first["t"] - base if first else 0.0
            self.first_start[name] = origin
            out = []
            for e in events:
                if e.get("event") == "start" and first and finite(e.get("unix_time")):
                    origin = e["unix_time"] - e["t"] - base
                out.append((origin + e["t"], e))
            self.events[name] = out
        self.down = {name: self._down(name) for name in self.peers}
        self._means, self._bytes, self._steps = {}, None, None

    def _down(self, name):
        """[(went down, back or None)]: a simulated crash, or a restart after an
        incarnation that wrote no end event (down from its last event)."""
        out, seen_start, ended, crashed, last = [], False, False, None, None
        for t, e in self.events[name]:
            kind = e.get("event")
            if kind == "start":
                if seen_start and not ended and (crashed if crashed is not None else last) < t:
                    out.append((crashed if crashed is not None else last, t))
                seen_start, ended, crashed = True, False, None
            elif kind == "end":
                ended = True
            elif (kind == "fault" and e.get("kind") in CRASHES and e.get("state") == "begin"
                  and e.get("target") == name and crashed is None):
                crashed = t
            last = t
        if crashed is not None and not ended:
            out.append((crashed, None))
        return out

    def start_offsets(self):
        """Each peer's first incarnation's t = 0 on the run's clock."""
        return dict(self.first_start)

    def all_started_s(self):
        """When the last peer began training (its first start event, written once its data is
        loaded and its model built): a simulated run's peers start at 0, a real one's after
        loading and admission."""
        starts = [next((t for t, e in events if e.get("event") == "start"), None) for events in self.events.values()]
        starts = [t for t in starts if t is not None]
        return max(starts) if starts else 0.0

    def last_end_s(self):
        """When the last peer ended (its last end event), or None."""
        ends = [t for events in self.events.values() for t, e in events if e.get("event") == "end"]
        return max(ends) if ends else None

    def _mean_changes(self, field):
        changes = []  # (t, peer, value, counted)
        for name in self.evaluating:
            changes += [(t, name, e[field], None) for t, e in self.events[name]
                        if e.get("event") == "eval" and finite(e.get(field))]
            for begin, end in self.down[name]:
                changes.append((begin, name, None, False))
                if end is not None:
                    changes.append((end, name, None, True))
        changes.sort(key=lambda c: c[0])
        return changes

    def mean_curve(self, field="test_acc"):
        """[(t, the peers' mean of their latest value of field)] at every change of it."""
        return self._run_mean(field)[0]

    def final(self, field="test_acc"):
        """(the mean at the end of the logs, {peer: the value it counts with}): (None, None)
        where it is not defined then."""
        tracker = self._run_mean(field)[1]
        return tracker.mean(), tracker.values()

    def _run_mean(self, field):
        if field in self._means:
            return self._means[field]
        tracker = MeanOfLatest(self.evaluating)
        curve, changes = [], self._mean_changes(field)
        for i, (t, name, value, counted) in enumerate(changes):
            if counted is None:
                tracker.set(name, value)
            else:
                tracker.count(name, counted)
            if i + 1 < len(changes) and changes[i + 1][0] == t:
                continue  # one point for every change at this moment
            mean = tracker.mean()
            if mean is not None:
                curve.append((t, mean))
        self._means[field] = curve, tracker
        return curve, tracker

    def peer_reached(self, name, target):
        """(t, eval event) of a peer's own first evaluation at or above the target, or None."""
        if target <= 0:
            return None
        return next(((t, e) for t, e in self.events[name]
                     if e.get("event") == "eval" and finite(e.get("test_acc")) and e["test_acc"] >= target), None)

    def _byte_points(self, name):
        """(times, bytes this peer had sent by then) at each report of its running total."""
        events = self.events[name]
        simulated = any(e.get("simulated") for _, e in events if e.get("event") == "start")
        points, base, raw, starts = [(self.first_start[name], 0)], 0, 0, 0
        for t, e in events:
            kind = e.get("event")
            if kind == "start":
                starts += 1
                if starts > 1 and not simulated:
                    base, raw = base + raw, 0  # a new process counts from 0 again
                points.append((t, base + raw))
            elif kind in ("gossip", "end") and finite(e.get("bytes_sent")):
                if e["bytes_sent"] < raw:
                    base += raw  # the counter began again
                raw = e["bytes_sent"]
                points.append((t, base + raw))
        times = [t for t, _ in points]
        for i in range(1, len(times)):  # a clock that went back (restarts without unix_time)
            times[i] = max(times[i], times[i - 1])
        return times, [b for _, b in points]

    def bytes_sent(self, t=math.inf, peers=None):
        """Bytes the peers (default: all) had sent by time t (the end: all they sent)."""
        if self._bytes is None:
            self._bytes = {name: self._byte_points(name) for name in self.peers}
        return sum(_interpolate(*self._bytes[name], t) for name in (self.peers if peers is None else peers))

    def first_byte_s(self):
        """When the first peer reported a byte sent, or None."""
        times = [t for name in self.peers for t, e in self.events[name]
                 if e.get("event") in ("gossip", "end") and finite(e.get("bytes_sent")) and e["bytes_sent"] > 0]
        return min(times) if times else None

    def mean_steps(self, t):
        """The mean over the peers that had logged a step by t of their latest step count."""
        if self._steps is None:
            self._steps = {}
            for name in self.peers:
                pts = [(u, e["step"] if finite(e.get("step")) else e["steps"]) for u, e in self.events[name]
                       if finite(e.get("step")) or (e.get("event") == "end" and finite(e.get("steps")))]
                self._steps[name] = ([u for u, _ in pts], [s for _, s in pts])
        latest = [steps[i - 1] for times, steps in self._steps.values() for i in [bisect.bisect_right(times, t)] if i]
        return sum(latest) / len(latest) if latest else 0.0


def mean_accuracy_curve(peer_events):
    """The peers' mean test accuracy over time (the module's rule)."""
    return Logs(peer_events).mean_curve("test_acc")


def bytes_to_target(logs, t):
    """What every peer had sent by time t (a time to target), rounded; None for no time."""
    return None if t is None else round(logs.bytes_sent(t))


def train_loss_curve(peer_events):
    """[(step, training loss averaged over the peers that logged that step)]."""
    by_step = {}
    for events in peer_events.values():
        for e in events:
            if e.get("event") == "step" and finite(e.get("loss")) and finite(e.get("step")):
                by_step.setdefault(e["step"], []).append(e["loss"])
    return [(s, sum(v) / len(v)) for s, v in sorted(by_step.items())]


def staleness_windows(peer_events, which="p50"):
    """Each log window's staleness percentile (gossip events that applied an update)."""
    return [e["tau_" + which] for events in peer_events.values() for e in events
            if e.get("event") == "gossip" and (e.get("applied") or 0) > 0 and finite(e.get("tau_" + which))]


def staleness(peer_events):
    """The median over the log windows of each staleness percentile, and the largest seen."""
    out = {k: (statistics.median(v) if v else None) for k in ("p50", "p90", "p99")
           for v in [staleness_windows(peer_events, k)]}
    out["max"] = max([e.get("tau_max") or 0 for events in peer_events.values() for e in events
                      if e.get("event") == "gossip" and (e.get("applied") or 0) > 0] + [0])
    return out


def compute_utilisation(peer_events):
    """The mean over peers of their compute utilisation (docs/LOGS.md, "Compute
    utilisation"): each peer's own forward, backward and optimizer time over its training
    time, from its end event; None when no peer's log has one."""
    values = []
    for events in peer_events.values():
        end = next((e for e in reversed(events) if e.get("event") == "end"), None)
        if end is not None and end.get("compute_utilisation") is not None:
            values.append(end["compute_utilisation"])
    return sum(values) / len(values) if values else None


def over_seeds(values):
    """A figure over its seeds (None: that run never had it): {"mean", "sd" (sample standard
    deviation; None with one value), "lo", "hi", "n" (runs that had it), "of" (runs)}, or
    None when none had it."""
    v = [x for x in values if x is not None]
    if not v:
        return None
    return {"mean": statistics.fmean(v), "sd": statistics.stdev(v) if len(v) > 1 else None, "lo": min(v),
            "hi": max(v), "n": len(v), "of": len(values)}


def mean_sd(values, scale=1.0, fmt="{:.1f}"):
    """'mean ± sd' over the seeds of the values (scaled), with how many never had it; '-'
    when none did. The tables' one way of writing a point over its seeds."""
    s = over_seeds([None if x is None else x * scale for x in values])
    if s is None:
        return "-"
    text = fmt.format(s["mean"])
    if s["sd"] is not None:
        text += " ± " + fmt.format(s["sd"]).lstrip("+")
    if s["n"] < s["of"]:
        text += f" ({s['of'] - s['n']} of {s['of']} never)"
    return text


def mean_band(curves):
    """Mean and (min, max) over runs (repeats) of their step curves [(x, value)] on the union
    of their x values, from where every curve has a value."""
    curves = [sorted(c) for c in curves if c]
    if not curves:
        return [], [], [], []
    xs_of = [[x for x, _ in c] for c in curves]
    out_x, mean, lo, hi = [], [], [], []
    for x in sorted({x for c in xs_of for x in c}):
        vals = [c[i - 1][1] for c, cx in zip(curves, xs_of) for i in [bisect.bisect_right(cx, x)] if i]
        if len(vals) < len(curves):  # not every repeat has a value yet
            continue
        out_x.append(x)
        mean.append(sum(vals) / len(vals))
        lo.append(min(vals))
        hi.append(max(vals))
    return out_x, mean, lo, hi
