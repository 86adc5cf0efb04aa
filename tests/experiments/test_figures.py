"""The figures' one definition (experiments/hearsay_figures.py) on small hand-made logs: the
peers' mean accuracy curve (aligned in time, crashed and restarted peers, ended peers),
time to target (reached, never reached, no target), bytes to target, the mean over seeds,
and that summary.json and the report's curves take them from there.

Each check is one that the other way of doing it would fail: the comment beside it says
which. Runs nothing but Python: /usr/bin/python3 tests/experiments/test_figures.py"""
import json
import math
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.realpath(__file__)), "..", "..", "experiments"))
import hearsay_figures as hf  # noqa: E402
import hearsay_logs  # noqa: E402
import hearsay_panels  # noqa: E402


def start(unix_time=None, **fields):
    e = {"t": 0.0, "event": "start", **fields}
    if unix_time is not None:
        e["unix_time"] = unix_time
    return e


def ev(t, acc, loss=None):
    e = {"t": t, "event": "eval", "test_acc": acc}
    if loss is not None:
        e["test_loss"] = loss
    return e


def gossip(t, sent):
    return {"t": t, "event": "gossip", "bytes_sent": sent}


def crash(t, peer):
    return {"t": t, "event": "fault", "kind": "crash", "state": "begin", "target": peer}


def end(t, sent=None):
    e = {"t": t, "event": "end"}
    if sent is not None:
        e["bytes_sent"] = sent
    return e


class MeanCurve(unittest.TestCase):
    def test_peers_evaluating_at_different_times_are_aligned_on_the_run_clock(self):
        logs = {"a": [start(), ev(1.0, 0.5), ev(3.0, 1.0)],
                "b": [start(), ev(2.0, 0.75), ev(4.0, 1.0)]}
        curve = hf.mean_accuracy_curve(logs)
        # Each peer's latest value at t, once both have one: no point at 1.0 (a alone would
        # be 0.5), and at 3.0 a's new 1.0 with b's 0.75 from 2.0.
        self.assertEqual(curve, [(2.0, 0.625), (3.0, 0.875), (4.0, 1.0)])
        # Averaging each peer's k-th evaluation instead (no alignment in time) reaches 0.875
        # only with both second evaluations, at 4.0.
        self.assertEqual(hf.time_to_target(curve, 0.875), 3.0)

    def test_unix_time_places_a_late_peer_on_the_run_clock(self):
        logs = {"a": [start(1000.0), ev(1.0, 0.5), ev(3.0, 1.0)],
                "b": [start(1000.5), ev(2.0, 0.75), ev(4.0, 1.0)]}
        # b started 0.5 s after a: its evaluations are at 2.5 and 4.5 of the run (each log's
        # own t would put them at 2.0 and 4.0).
        self.assertEqual(hf.mean_accuracy_curve(logs), [(2.5, 0.625), (3.0, 0.875), (4.5, 1.0)])
        self.assertEqual(hf.Logs(logs).all_started_s(), 0.5)

    def test_evaluations_at_one_moment_make_one_point(self):
        logs = {"a": [start(), ev(1.0, 0.5), ev(2.0, 1.0)], "b": [start(), ev(1.0, 0.5), ev(2.0, 1.0)]}
        # One point at 2.0 with both new values; a point per evaluation would put a (1.0 +
        # 0.5) / 2 = 0.75 at 2.0 first.
        self.assertEqual(hf.mean_accuracy_curve(logs), [(1.0, 0.5), (2.0, 1.0)])

    def test_a_crashed_peer_counts_until_its_crash_and_then_is_left_out(self):
        logs = {"a": [start(), ev(1.0, 0.875), ev(3.0, 0.875)],
                "c": [start(), ev(1.0, 0.375), crash(2.0, "c")]}
        curve = hf.mean_accuracy_curve(logs)
        # c counts with 0.375 until 2.0, then the mean is a's alone, from that moment.
        self.assertEqual(curve, [(1.0, 0.625), (2.0, 0.875), (3.0, 0.875)])
        # Counted for good with its last value: never (0.625); left out from the start: 1.0;
        # left out only at the next evaluation: 3.0.
        self.assertEqual(hf.time_to_target(curve, 0.75), 2.0)
        self.assertEqual(hf.Logs(logs).final("test_acc"), (0.875, {"a": 0.875}))

    def test_a_restarted_process_is_out_from_its_last_line_until_it_starts_again(self):
        # b was killed after its gossip at 1.5 (no end event) and started again at 3.0 of
        # the run; it evaluates again at 4.0.
        logs = {"a": [start(1000.0), ev(1.0, 0.875), ev(2.0, 0.875), ev(3.5, 0.875), ev(5.0, 0.875), end(5.0)],
                "b": [start(1000.0), ev(1.0, 0.375), gossip(1.5, 10), start(1003.0), ev(1.0, 0.875), end(1.0)]}
        curve = hf.mean_accuracy_curve(logs)
        self.assertEqual(hf.value_at(curve, 1.2), 0.625)
        self.assertEqual(hf.value_at(curve, 2.5), 0.875)  # counted while down: 0.625
        # Back with its value from before until it evaluates again (waited for as a new
        # peer, the curve would have no point at 3.0 and still read 0.875).
        self.assertEqual(hf.value_at(curve, 3.2), 0.625)
        self.assertEqual(hf.value_at(curve, 4.0), 0.875)
        self.assertEqual(hf.Logs(logs).down["b"], [(1.5, 3.0)])

    def test_a_peer_that_ended_counts_with_its_final_value(self):
        logs = {"a": [start(), ev(1.0, 0.5), end(2.0)], "b": [start(), ev(1.0, 0.75), ev(3.0, 1.0), end(3.0)]}
        # Left out once it ended, the mean at 3.0 would be b's 1.0.
        self.assertEqual(hf.mean_accuracy_curve(logs)[-1], (3.0, 0.75))

    def test_a_log_that_stops_without_an_end_is_waited_for(self):
        logs = {"a": [start(), ev(1.0, 0.9)], "c": [start()]}
        # c may still be running (or died: the log cannot say): no mean without it.
        self.assertEqual(hf.mean_accuracy_curve(logs), [])
        self.assertIsNone(hf.time_to_target(hf.mean_accuracy_curve(logs), 0.5))

    def test_a_peer_that_never_evaluates_is_not_waited_for(self):
        logs = {"a": [start(), ev(1.0, 0.9)], "s": [start(evaluates=False), gossip(0.5, 10)]}
        self.assertEqual(hf.mean_accuracy_curve(logs), [(1.0, 0.9)])

    def test_the_mean_is_exact(self):
        logs = {p: [start(), ev(1.0, 0.35)] for p in "abc"}
        # sum / len of three 0.35 is 0.3499999999999999: peers all at the target would miss it.
        self.assertEqual(hf.mean_accuracy_curve(logs), [(1.0, 0.35)])
        self.assertEqual(hf.time_to_target(hf.mean_accuracy_curve(logs), 0.35), 1.0)

    def test_the_live_rule_is_the_same_tracker(self):
        mean = hf.MeanOfLatest(["a", "b"])
        mean.set("a", 0.9)
        self.assertIsNone(mean.mean())  # b not yet evaluated
        mean.set("b", 0.7)
        self.assertEqual(mean.mean(), 0.8)
        mean.count("b", False)
        self.assertEqual(mean.mean(), 0.9)
        mean.count("b", True)
        self.assertEqual(mean.mean(), 0.8)  # back with its last value
        mean.set("b", float("nan"))  # a null (non-finite) score changes nothing
        self.assertEqual(mean.mean(), 0.8)


class TimeToTarget(unittest.TestCase):
    def test_never_reached_and_no_target(self):
        curve = hf.mean_accuracy_curve({"a": [start(), ev(1.0, 0.5), ev(2.0, 0.75)],
                                        "b": [start(), ev(1.0, 0.875), ev(2.0, 0.75)]})
        self.assertEqual(curve, [(1.0, 0.6875), (2.0, 0.75)])
        # b's own crossing of 0.875 at 1.0 is not the cluster's; nor is the best of the
        # curve's points a crossing of a target above it.
        self.assertIsNone(hf.time_to_target(curve, 0.875))
        self.assertIsNone(hf.time_to_target(curve, 0.76))
        self.assertEqual(hf.time_to_target(curve, 0.75), 2.0)
        self.assertIsNone(hf.time_to_target(curve, 0.0))  # no target, not "at once"

    def test_a_loss_target_is_reached_from_above(self):
        curve = hf.Logs({"a": [start(), ev(1.0, 0.5, loss=3.0), ev(2.0, 0.6, loss=2.0)],
                         "b": [start(), ev(1.0, 0.5, loss=2.0), ev(2.0, 0.6, loss=1.0)]}).mean_curve("test_loss")
        self.assertEqual(curve, [(1.0, 2.5), (2.0, 1.5)])
        self.assertEqual(hf.time_to_target(curve, 2.0, lower_is_better=True), 2.0)  # at least 2.0: 1.0
        self.assertIsNone(hf.time_to_target(curve, 1.0, lower_is_better=True))


class BytesToTarget(unittest.TestCase):
    def test_every_peers_bytes_interpolated_at_the_time_to_target(self):
        logs = hf.Logs({"a": [start(1000.0), gossip(1.0, 100), ev(2.0, 0.75), gossip(3.0, 300), ev(4.0, 1.0)],
                        "b": [start(1001.0), gossip(1.0, 1000), ev(1.5, 1.0), gossip(2.0, 3000), ev(3.0, 1.0)]})
        ttt = hf.time_to_target(logs.mean_curve(), 0.875)
        self.assertEqual(ttt, 2.5)  # b's evaluation at its own 1.5
        # a: 100 at 1 s, 300 at 3 s -> 250 at 2.5; b (started at 1.0 of the run): 1000 at
        # 2.0, 3000 at 3.0 -> 2000. The last reports before 2.5 would give 1100; the
        # totals 3300; each log's own clock (b at its 2.5: 3000) 3250.
        self.assertEqual(hf.bytes_to_target(logs, ttt), 2250)
        self.assertIsNone(hf.bytes_to_target(logs, None))  # never reached: no bytes to it
        self.assertEqual(logs.bytes_sent(), 3300)

    def test_a_restarted_process_counts_from_zero_again_and_sends_nothing_while_down(self):
        logs = hf.Logs({"a": [start(1000.0), gossip(1.0, 100), gossip(2.0, 200),
                              start(1003.0), gossip(1.0, 300), end(1.0, 300)]})
        # The new process's 300 come on top of the 200 before (read as one counter going on
        # from 200 to 300, 300 in all).
        self.assertEqual(logs.bytes_sent(), 500)
        self.assertEqual(logs.bytes_sent(2.5), 200)  # down: across the gap it would be 275
        self.assertEqual(logs.bytes_sent(3.5), 350)

    def test_a_simulated_peers_counter_goes_on_across_a_crash(self):
        # The simulator's t goes on across incarnations (virtual seconds since it began).
        logs = hf.Logs({"a": [start(0.0, simulated=True), gossip(1.0, 100), gossip(2.0, 200), crash(2.5, "a"),
                              dict(start(3.0, simulated=True), t=3.0), gossip(4.0, 260), end(4.0, 260)]})
        self.assertEqual(logs.bytes_sent(), 260)  # added up as two counters: 460
        self.assertEqual(logs.bytes_sent(3.5), 230)


class OverSeeds(unittest.TestCase):
    def test_mean_sample_sd_and_how_many_never(self):
        s = hf.over_seeds([1.0, 3.0, None])
        # The sample standard deviation (the population's would be 1.0); a seed that never
        # reached the target is not a 0 (that mean would be 1.33).
        self.assertEqual((s["mean"], s["sd"], s["n"], s["of"]), (2.0, math.sqrt(2), 2, 3))
        self.assertEqual(hf.mean_sd([1.0, 3.0, None]), "2.0 ± 1.4 (1 of 3 never)")
        self.assertEqual(hf.mean_sd([2.0]), "2.0")  # one seed has no spread
        self.assertEqual(hf.mean_sd([None, None]), "-")
        self.assertIsNone(hf.over_seeds([None]))


class EveryToolTakesThem(unittest.TestCase):
    """summary.json and the report's curves are these definitions, on the same logs."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="hearsay-figures-test-")
        self.logs = {
            "a": [start(1000.0), gossip(1.0, 100), ev(1.0, 0.75), gossip(3.0, 300), ev(3.0, 0.875), end(3.0, 300)],
            "b": [start(1000.5), gossip(1.0, 1000), ev(1.5, 1.0), gossip(2.0, 3000), ev(2.5, 0.9375), end(2.5, 3000)],
            "c": [start(1000.0), ev(1.0, 0.25), crash(1.2, "c")],
        }
        for name, events in self.logs.items():
            with open(os.path.join(self.tmp.name, name + ".jsonl"), "w", encoding="utf-8") as f:
                f.write("".join(json.dumps({"peer": name, **e}) + "\n" for e in events))

    def tearDown(self):
        self.tmp.cleanup()

    def test_summary_and_report_agree_with_the_definitions(self):
        s = hearsay_logs.run_summary(self.tmp.name, 0.875)
        # At 1.0 b has not evaluated yet: no mean; c crashes at 1.2; b's first evaluation,
        # at 2.0 of the run: (0.75 + 1.0) / 2 = 0.875.
        self.assertEqual(s["time_to_target_s"], 2.0)
        # a at 2.0: 200; b (from 0.5): 1000 at 1.5, 3000 at 2.5 -> 2000; c sent nothing.
        self.assertEqual(s["bytes_to_target_total"], 2200)
        self.assertEqual(s["bytes_sent_total"], 3300)
        # At the end: a 0.875 and b 0.9375; c, down, out (with it: 0.6875).
        self.assertEqual(s["final_test_acc"], 0.90625)
        self.assertEqual((s["final_test_acc_min"], s["final_test_acc_max"]), (0.875, 0.9375))
        # Each peer's own crossing on the run's clock (b's own clock says 1.5).
        self.assertEqual(s["peers"]["b"]["time_to_target_s"], 2.0)
        self.assertEqual(s["peers_reached_target"], 2)
        run = hearsay_panels.Run(self.tmp.name, hearsay_logs.peer_logs(self.tmp.name))
        self.assertEqual(run.curve("time", "test_acc"), hf.Logs(self.logs).mean_curve("test_acc"))
        # The curve against bytes crosses the target at the summary's bytes to target.
        self.assertEqual(next(x for x, acc in run.curve("bytes", "test_acc") if acc >= 0.875), 2200)


if __name__ == "__main__":
    unittest.main(verbosity=2)
