"""A torch peer stopped by SIGTERM while its step waits for a synchronous round ends the
run (with its end event) at once, as hearsay-peer does; hearsay-run relies on it."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.environ.get("HEARSAY_BIN_DIR", os.path.join(ROOT, "build", "bin"))

CONFIG = '''name: "torch-signals"
model { kind: MLP hidden: [16] }
data { format: SYNTHETIC synthetic_train: 4096 synthetic_test: 256 synthetic_dim: 8 num_classes: 4 }
optim { optimizer: "sgd" lr: 0.05 }
train { batch_size: 16 max_steps: 1000000 epochs: 0 eval_every_steps: 1000000 }
log { every_steps: 1 }
cluster {
  id: "torch-signals"
  secret_env: "HEARSAY_SECRET"
  peers { name: "a" address: "127.0.0.1:17457" }
  peers { name: "b" address: "127.0.0.1:17458" }
  gossip { algorithm: "allreduce" sync_timeout_s: 120 }
}
'''


def events(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


class Signals(unittest.TestCase):
    def test_import_loads_no_library_that_takes_signals(self):
        # libfabric, once linked, loaded libinfinipath at import, whose constructor took
        # SIGINT and SIGTERM (and the crash signals) for a handler that calls exit(1).
        # libfabric is now loaded only when a fabric transport is made.
        code = ("import signal, hearsay\n"
                "maps = open('/proc/self/maps').read()\n"
                "print('libfabric' in maps, 'infinipath' in maps, signal.getsignal(signal.SIGINT) is signal.default_int_handler)")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["False", "False", "True"])

    def test_close_ends_the_signal_watcher(self):
        # close() also runs at interpreter exit (atexit), where the peer object may never be
        # destroyed: a watcher thread left polling while the exit handlers run is a crash
        # at exit. After close() the process has no thread the peer started.
        import hearsay.torch as ht

        def threads():
            return len(os.listdir("/proc/self/task"))

        before = threads()
        peer = ht.Peer(os.path.join(HERE, "alone-synthetic.textproto"), argv=[], quiet=True, handle_signals=True)
        self.assertGreater(threads(), before, "no signal watcher started")
        peer.close()
        self.assertEqual(threads(), before)

    def test_sigterm_ends_a_step_waiting_for_a_synchronous_round(self):
        d = tempfile.mkdtemp()
        config = os.path.join(d, "c.textproto")
        with open(config, "w") as f:
            f.write(CONFIG)
        env = dict(os.environ, HEARSAY_SECRET="a-test-secret-of-enough-bytes")
        log_a, log_b = os.path.join(d, "a.jsonl"), os.path.join(d, "b.jsonl")
        native = subprocess.Popen([os.path.join(BIN, "hearsay-peer"), "--config", config, "--peer", "b", "--quiet",
                                   "--log", log_b], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        torch_peer = subprocess.Popen([os.path.join(BIN, "hearsay-python"), os.path.join(ROOT, "examples", "torch", "fmnist.py"),
                                       "--config", config, "--peer", "a", "--quiet", "--log", log_a], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 60
            while not any(e["event"] == "step" and e["step"] >= 5 for e in events(log_a)):
                self.assertLess(time.monotonic(), deadline, "the torch peer never stepped")
                self.assertIsNone(torch_peer.poll(), torch_peer.stderr.read() if torch_peer.poll() is not None else "")
                time.sleep(0.1)
            native.send_signal(signal.SIGSTOP)  # the round's other half never comes
            time.sleep(1.0)
            steps_before = max(e["step"] for e in events(log_a) if e["event"] == "step")
            time.sleep(1.0)
            steps_after = max(e["step"] for e in events(log_a) if e["event"] == "step")
            self.assertEqual(steps_before, steps_after, "the torch peer kept stepping without its neighbour")
            t0 = time.monotonic()
            torch_peer.send_signal(signal.SIGTERM)
            out, err = torch_peer.communicate(timeout=30)
            took = time.monotonic() - t0
            self.assertEqual(torch_peer.returncode, 0, err)
            self.assertLess(took, 10, "SIGTERM waited for the synchronous round's timeout")
            end = [e for e in events(log_a) if e["event"] == "end"]
            self.assertEqual(len(end), 1)
            self.assertEqual(end[0]["steps"], steps_after)
        finally:
            for p in (torch_peer, native):
                if p.poll() is None:
                    p.send_signal(signal.SIGCONT)
                    p.kill()
                p.wait()


    def torch_peer(self, config_text, *extra):
        d = tempfile.mkdtemp()
        config = os.path.join(d, "c.textproto")
        with open(config, "w") as f:
            f.write(config_text.replace("CKPT_DIR", os.path.join(d, "ckpt")))
        env = dict(os.environ, HEARSAY_SECRET="a-test-secret-of-enough-bytes")
        log = os.path.join(d, "a.jsonl")
        cmd = [os.path.join(BIN, "hearsay-python"), os.path.join(ROOT, "examples", "torch", "fmnist.py"), "--config", config,
               "--quiet", "--log", log] + list(extra)
        return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), d, log

    def test_sigint_while_joining_ends_the_join_at_once_with_a_message_and_python_s_interrupt(self):
        # Its neighbour never comes and the join would wait 30 s: SIGINT ends it now.
        config = CONFIG.replace('gossip { algorithm: "allreduce" sync_timeout_s: 120 }',
                                'gossip { algorithm: "adpsgd" }\n  connect_timeout_s: 30')
        proc, d, log = self.torch_peer(config, "--peer", "a")
        try:
            deadline = time.monotonic() + 60
            while True:  # joining: its port is open (it listens, then waits for b)
                self.assertLess(time.monotonic(), deadline, "the peer never listened")
                self.assertIsNone(proc.poll(), proc.stderr.read() if proc.poll() is not None else "")
                try:
                    socket.create_connection(("127.0.0.1", 17457), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.1)
            time.sleep(0.5)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.assertLess(took, 10, "SIGINT waited for the join's timeout")
        self.assertIn(proc.returncode, (-signal.SIGINT, 130), err)  # Python's own exit for an interrupt
        self.assertIn("fmnist.py: SIGINT: stopping after the current step", err)
        self.assertIn("fmnist.py: peer a: stopped by SIGINT after 0 steps", err)
        self.assertIn("KeyboardInterrupt", err)
        self.assertNotIn("neighbours connected within", err)  # not the quorum's error

    def test_sigint_mid_training_writes_the_checkpoint_says_so_and_exits_as_an_interrupt(self):
        config = ('name: "a"\nmodel { kind: MLP hidden: [16] }\n'
                  'data { format: SYNTHETIC synthetic_train: 4096 synthetic_test: 256 synthetic_dim: 8 num_classes: 4 }\n'
                  'optim { optimizer: "sgd" lr: 0.05 }\n'
                  'train { batch_size: 16 max_steps: 1000000 epochs: 0 eval_every_steps: 1000000 }\n'
                  'log { every_steps: 1 }\ncheckpoint { dir: "CKPT_DIR" every_steps: 1000000 }\n')
        proc, d, log = self.torch_peer(config)
        try:
            deadline = time.monotonic() + 60
            while not any(e["event"] == "step" and e["step"] >= 5 for e in events(log)):
                self.assertLess(time.monotonic(), deadline, "the torch peer never stepped")
                self.assertIsNone(proc.poll(), proc.stderr.read() if proc.poll() is not None else "")
                time.sleep(0.1)
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.assertIn(proc.returncode, (-signal.SIGINT, 130), err)
        [end] = [e for e in events(log) if e["event"] == "end"]
        self.assertTrue(end["stopped"])
        self.assertIsNone(end["final_test_acc"])  # nothing was evaluated: no accuracy, not 0
        self.assertIn(f"fmnist.py: peer a: stopped by SIGINT after {end['steps']} steps", err)
        self.assertTrue(os.path.exists(os.path.join(d, "ckpt", "a.pt")), err)

if __name__ == "__main__":
    unittest.main()
