# hearsay: the two commands are `make demo` and `make test` (the fast tier; `make test-all`
# is every test, the long tier's real-process clusters, sanitizers, hosts and Slurm too). This Makefile drives CMake
# (as neovim's does); everything lands in build/, binaries in build/bin/.
BUILD_DIR   ?= build
BUILD_TYPE  ?= Release
HEARSAY_CUDA ?= AUTO
JOBS        ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps test-deps bench-deps build test test-all test-asan test-tsan test-hosts test-slurm demo demo-single bench wheel clean

all: build

deps:
	@tools/install-deps.sh

test-deps:
	@tools/install-deps.sh deps/debian-packages.txt deps/debian-test-packages.txt

bench-deps:
	@tools/install-deps.sh deps/debian-packages.txt deps/debian-test-packages.txt deps/debian-bench-packages.txt

$(BUILD_DIR)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DHEARSAY_CUDA=$(HEARSAY_CUDA) $(CMAKE_FLAGS)

build: deps $(BUILD_DIR)/CMakeCache.txt data/kjv.txt
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The text corpus of the GPT configs: the whole King James Bible from Debian's bible-kjv,
# one verse a line ("Ge1:1 In the beginning..."), 4.4 MB.
data/kjv.txt: | deps
	mkdir -p data
	bible -f gen1:1-rev22:21 > data/kjv.txt.tmp
	mv data/kjv.txt.tmp data/kjv.txt

# The fast tier: every test not labelled "long" (tests/CMakeLists.txt, tests/long_cases.cmake),
# i.e. the unit tests and the small in-process clusters of every module. It builds only the
# tests and hearsay-peer, and needs none of the test packages (torch, Chromium, Prometheus,
# Slurm), so after `make demo` it is the tests' build and about a minute and a half of ctest.
test: deps $(BUILD_DIR)/CMakeCache.txt data/kjv.txt
	cmake --build $(BUILD_DIR) -j $(JOBS) --target hearsay_tests
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) -LE long

# The long tier, which CI runs (.ci/run): the whole build and every test (the fast tier's
# again, and the real-process clusters, convergence runs, the Python front end, Prometheus,
# the report in Chromium, the wheel, the fuzzers), then peers on separate hosts, a real
# Slurm, and the suite under ASan + UBSan and under TSan.
test-all: build test-deps
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)
	$(MAKE) test-hosts test-slurm test-asan test-tsan

# The tests again under AddressSanitizer and UndefinedBehaviorSanitizer (CPU only). Left
# out: the Fashion-MNIST convergence runs (minutes, no new code paths), the 450 signalled
# peers ('signals: SIGTERM and SIGINT at every phase', timed for the plain build), and the straggler
# step-rate, consensus-decay, Byzantine time-to-target and site-split checks (they compare
# times that the sanitizers' slowdown distorts). At -O0: at -O1 (tried 2026-12-05) its
# ctest ran about twice as fast, but asio's thread-local recycling allocator was reported
# as an alloc-dealloc mismatch (operator new against free, asio/detail/memory.hpp) in 11
# tests, not every run.
test-asan: test-deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DHEARSAY_SANITIZE=ON -DHEARSAY_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -j $(JOBS) -E 'convergence_test|10x slower|consensus distance falls|Byzantine peer|measured speeds|on non-IID shards|sim_network_test|simulator:|report:|signals: SIGTERM and SIGINT at every phase|utilisation:'

# The tests again under ThreadSanitizer (CPU only; -O1, since TSan slows code 5-15x and
# -O0 doubles that); any report fails the test. TSAN_OPTIONS (with tests/tsan.supp, for
# races inside libraries that are not ours) is set by tests/CMakeLists.txt in ctest's
# environment, so ctest run by hand in build-tsan gets it too. OpenBLAS keeps its threads:
# its code is not instrumented, so TSan neither sees nor reports their accesses.
# Left out, as in test-asan:
#   convergence_test           the Fashion-MNIST runs: minutes under TSan, and one peer's
#                              training loop, which the other tests run too;
#   '10x slower'               cluster_test's straggler step rates: a ratio of compute to
#                              message time, which TSan's slowdown distorts;
#   'consensus distance falls' cluster_test's consensus decay: the same ratio decides how
#                              far the peers drift between messages.
#   'measured speeds'          site_replicas_test's split: the peers' measured compute
#                              times, of which the sanitizer's slowdown makes the real
#                              work a larger and noisier part than the emulated steps.
#   'Byzantine peer'           13 in-process clusters of 8 peers, asserting ratios of times
#                              to target: 9 minutes under TSan, and the sanitizer's slowdown
#                              distorts the times it compares.
#   sim_network_test, 'simulator:'  SimGrid's actors switch stacks by hand (one thread runs
#                              them all), which TSan reads as races it cannot follow.
#   'report:'                  the report's test draws a simulated sweep (hearsay-sim, as
#                              'simulator:'); the report itself is Python.
#   'signals: SIGTERM and SIGINT at every phase'
#                              450 real peer processes signalled at random times: their
#                              phases are timed for the plain build, and the code they run
#                              is the same as the other tests'.
#   'utilisation:'             compute utilisation's shares of 4 ms emulated steps: the
#                              sanitizer's slowdown makes the engine's own work overrun them.
#   'on non-IID shards'        cluster_test's 13 algorithms against peers alone: the
#                              asynchronous ones' accuracy after a fixed schedule depends on
#                              the same ratio (1 of 3 runs under ASan with ctest -j 2 missed
#                              the bound by 0.02 of accuracy at a loss of 1.88, as sgp's,
#                              whose margin is the thinnest); the every-algorithm convergence
#                              test beside it still runs each algorithm.
test-tsan: test-deps
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG='-g -O1' -DHEARSAY_SANITIZE=thread -DHEARSAY_CUDA=OFF $(CMAKE_FLAGS)
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && ctest --output-on-failure -j $(JOBS) -E 'convergence_test|10x slower|consensus distance falls|Byzantine peer|measured speeds|on non-IID shards|sim_network_test|simulator:|report:|signals: SIGTERM and SIGINT at every phase|utilisation:'


# Peers on separate hosts: 3 sites as network namespaces on a bridge, each site's link
# shaped in the kernel (tbf, 50 Mbit/s each way), 6 hearsay-peer processes at real
# addresses train to the quickstart's 85% (docs/OPERATIONS.md, "Sites as hosts"). Needs
# root (CAP_NET_ADMIN); elsewhere it says SKIPPED (exit status 77) and passes nothing.
test-hosts: build test-deps
	/usr/bin/python3 tests/hosts/test_hosts.py || [ $$? -eq 77 ]

# A real Slurm: munged, slurmctld and slurmd started from files of the test's own (one node,
# oversubscribed), the shipped peers/slurm/hearsay.sbatch submitted with only a config: a
# job array of 4 peers trains to 85%, one of them cancelled and requeued resumes from its
# checkpoint (docs/OPERATIONS.md, "Slurm"). Needs root; elsewhere SKIPPED (exit status 77).
test-slurm: build test-deps
	/usr/bin/python3 tests/slurm/test_slurm.py || [ $$? -eq 77 ]

# configs/quickstart.textproto: four peer processes in two emulated sites (one a 4x slower
# GPU) train the MLP on Fashion-MNIST, asynchronous gossip against all-reduce; hearsay-run
# then draws runs/quickstart-*/index.html from their logs. Only what it runs is built
# (hearsay-peer; hearsay-run and hearsay-plot are Python), so a first demo waits for no
# test, benchmark, simulator or extension: `make build` or `make test` builds the rest.
demo: deps $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j $(JOBS) --target hearsay-peer
	$(BUILD_DIR)/bin/hearsay-run configs/quickstart.textproto

# One peer alone: the foundation's quickstart.
demo-single: build
	rm -rf runs/demo-single
	$(BUILD_DIR)/bin/hearsay-peer --config configs/single-mlp.textproto --log runs/demo-single/peer0.jsonl
	$(BUILD_DIR)/bin/hearsay-plot runs/demo-single

# The Python package with its extension and programs as a wheel, dist/hearsay-VERSION-*.whl,
# for machines with the same Debian packages (pip install --no-index it into a venv made
# with --system-site-packages): built apart in build-wheel for any x86-64 CPU and every
# GPU architecture from sm_75, without the tests. `pip install .` builds into build/.
wheel: deps
	/usr/bin/python3 python/build_backend/hearsay_wheel.py --build-dir build-wheel --wheel-dir dist \
	  --cmake-flag=-DHEARSAY_NATIVE=OFF --cmake-flag=-DHEARSAY_TESTS=OFF --cmake-flag=-DHEARSAY_CUDA=$(HEARSAY_CUDA) \
	  --cmake-flag=-DHEARSAY_CUDA_ARCHS=all $(addprefix --cmake-flag=,$(CMAKE_FLAGS))

bench: build bench-deps
	$(BUILD_DIR)/bin/hearsay-bench step
	$(BUILD_DIR)/bin/hearsay-bench transport

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-wheel dist
