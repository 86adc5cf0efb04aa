// The simulated network's model (docs/SIMULATION.md, "Network model checks"), against
// the figures it must give and beside the emulated transport's for the same link.
//
// Each SimGrid case builds its own engine: SimGrid keeps one per process, so these cases
// run one per process (ctest runs every doctest case on its own).
#include <simgrid/s4u/Actor.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Link.hpp>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "doctest/doctest.h"
#include "hearsay/config.h"
#include "hearsay/config.pb.h"
#include "hearsay/emulated.h"
#include "hearsay/error.h"
#include "hearsay/transport.h"
#include "hearsay/wire.h"
#include "hearsay/wire.pb.h"
#include "../../src/sim/sim_network.h"
#include "../../src/sim/sim_platform.h"

namespace hearsay {
namespace {

namespace s4u = simgrid::s4u;

// Two sites over one 50 Mbit/s, 40 ms WAN pipe each way; inside a site a fast LAN with
// no latency, so a cross-site route's terms are the WAN's alone.
constexpr double kLatencyS = 0.040;
constexpr double kWanBytesPerS = 50e6 / 8;
constexpr size_t kFrameBytes = 1 << 20;

// The three peers a0, a1 (site a) and b0 (site b), the WAN above between the sites, each
// site's LAN `lan_ms` of latency at 100 Gbit/s; `more` is appended (e.g. access links).
std::string three_peers(int lan_ms = 0, const std::string& more = "") {
  const std::string lan = "link { latency_ms: " + std::to_string(lan_ms) + " bandwidth_mbps: 100000 }";
  return R"(
cluster {
  secret_env: "X"
  peers { name: "a0" site: "a" address: "h:1" }
  peers { name: "a1" site: "a" address: "h:2" }
  peers { name: "b0" site: "b" address: "h:3" }
  site_links { site_a: "a" site_b: "a" )" + lan + R"( }
  site_links { site_a: "b" site_b: "b" )" + lan + R"( }
  site_links { site_a: "a" site_b: "b" link { latency_ms: 40 bandwidth_mbps: 50 } }
}
)" + more;
}

OutFrame frame_of(size_t bytes) {
  wire::Envelope e;
  auto* u = e.mutable_update();  // an update: transports hand updates to the receiver
  u->set_update_id(bytes);
  u->set_tensor_length(bytes / 4);
  u->set_segment_length(bytes / 4);
  auto payload = std::make_shared<std::vector<uint8_t>>(bytes, 7);
  return make_frame(e, payload->data(), payload->size(), payload);
}

// A SimGrid engine with these options (SimGrid keeps them, and the engine, for the
// process: hence one case a process).
std::unique_ptr<s4u::Engine> start_engine(const std::vector<std::string>& options) {
  static std::vector<std::string> args;
  args = {"sim_network_test"};
  args.insert(args.end(), options.begin(), options.end());
  static std::vector<char*> argv;
  argv.clear();
  for (auto& a : args) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  return std::make_unique<s4u::Engine>(&argc, argv.data());
}

// One simulation of the three peers above: `script` runs as an actor on a0's host with
// the network and the transports; returns what it recorded.
struct SimRig {
  std::unique_ptr<s4u::Engine> engine;
  sim::SimPlatform platform;
  std::unique_ptr<sim::SimNetwork> net;
  std::vector<std::unique_ptr<sim::SimTransport>> transports;
  std::vector<std::unique_ptr<sim::SimClock>> clocks;
  std::map<std::string, std::vector<double>> arrivals;  // by receiver

  explicit SimRig(const std::string& model = "CM02", const std::string& cluster = three_peers()) {
    const config::Config cfg = parse_config(cluster, "sim_network_test");
    config::SimulationConfig simulation = cfg.experiment().simulation();
    simulation.set_network_model(model);
    engine = start_engine(sim::simgrid_options(simulation));  // as the simulator starts its own
    platform = sim::build_platform(cfg.cluster(), simulation);
    net = std::make_unique<sim::SimNetwork>(platform, std::vector<std::string>{"a0", "a1", "b0"}, 1);
    for (int i = 0; i < 3; ++i) {
      transports.push_back(std::make_unique<sim::SimTransport>(*net, i));
      clocks.push_back(std::make_unique<sim::SimClock>(*net, i));
      const std::string me = net->name(i);
      transports[i]->set_receiver([this, me](const std::string&, InFrame&&) { arrivals[me].push_back(s4u::Engine::get_clock()); });
      net->peer_up(i, transports[i].get(), clocks[i].get());
    }
  }
  void run(std::function<void()> script) {
    s4u::Actor::create("script", platform.hosts[0], std::move(script));
    engine->run();
  }
};

TEST_CASE("simulated network: a frame of B bytes over latency L and bandwidth W arrives at L + B/W (CM02)") {
  SimRig rig;
  rig.run([&] {
    rig.transports[0]->send("b0", frame_of(kFrameBytes), nullptr);
    rig.net->flush();
  });
  REQUIRE(rig.arrivals["b0"].size() == 1);
  const double bytes = static_cast<double>(frame_of(kFrameBytes).size());
  const double expected = kLatencyS + bytes / kWanBytesPerS;
  MESSAGE("simulated arrival " << rig.arrivals["b0"][0] << " s, L + B/W = " << expected << " s");
  CHECK(rig.arrivals["b0"][0] == doctest::Approx(expected).epsilon(0.001));
}

TEST_CASE("simulated network: LV08 adds its TCP terms to L + B/W (latency x 13.01, bandwidth x 0.97), at arrival under the default") {
  SimRig rig("LV08");
  rig.run([&] {
    rig.transports[0]->send("b0", frame_of(kFrameBytes), nullptr);
    rig.net->flush();
  });
  REQUIRE(rig.arrivals["b0"].size() == 1);
  const double bytes = static_cast<double>(frame_of(kFrameBytes).size());
  // SimGrid's LV08 factors (its documentation); its TCP window (4 MiB / 2L) does not bind
  // at 50 Mbit/s and 40 ms.
  const double expected = 13.01 * kLatencyS + bytes / (0.97 * kWanBytesPerS);
  MESSAGE("LV08 arrival " << rig.arrivals["b0"][0] << " s, 13.01 L + B/(0.97 W) = " << expected << " s");
  CHECK(rig.arrivals["b0"][0] == doctest::Approx(expected).epsilon(0.01));
}

TEST_CASE("simulated network: two flows across one shared WAN pipe each get half of it") {
  SimRig rig;
  std::vector<double> done_at(2, -1);
  rig.run([&] {
    rig.transports[0]->send("b0", frame_of(4 * kFrameBytes), [&](const SendStatus&) { done_at[0] = s4u::Engine::get_clock(); });
    rig.transports[1]->send("b0", frame_of(4 * kFrameBytes), [&](const SendStatus&) { done_at[1] = s4u::Engine::get_clock(); });
    rig.net->flush();
  });
  REQUIRE(rig.arrivals["b0"].size() == 2);
  const double bytes = static_cast<double>(frame_of(4 * kFrameBytes).size());
  // Each at W/2 for the whole transfer: both arrive at L + 2B/W.
  const double expected = kLatencyS + 2 * bytes / kWanBytesPerS;
  MESSAGE("two flows arrive at " << rig.arrivals["b0"][0] << " and " << rig.arrivals["b0"][1] << " s, L + 2B/W = " << expected);
  CHECK(rig.arrivals["b0"][0] == doctest::Approx(expected).epsilon(0.001));
  CHECK(rig.arrivals["b0"][1] == doctest::Approx(expected).epsilon(0.001));
  // Each sender hears when its last byte has left (the default, departure): L sooner.
  CHECK(done_at[0] == doctest::Approx(2 * bytes / kWanBytesPerS).epsilon(0.001));
  CHECK(done_at[1] == doctest::Approx(2 * bytes / kWanBytesPerS).epsilon(0.001));
}

// Site a behind a 20 Mbit/s uplink (slower than its 100 Gbit/s interfaces and the 50
// Mbit/s WAN), both LANs 2 ms; site b without access links.
const std::string kUplinkCluster =
    three_peers(2, R"(experiment { simulate: true simulation { sites { site: "a" uplink_mbps: 20 downlink_mbps: 20 } } })");

TEST_CASE("simulated network: a site's uplink is shared by every flow that leaves the site, and a flow inside the site "
          "does not touch it") {
  SimRig rig("CM02", kUplinkCluster);
  rig.run([&] {
    rig.transports[0]->send("b0", frame_of(kFrameBytes), nullptr);
    rig.transports[1]->send("b0", frame_of(kFrameBytes), nullptr);
    rig.transports[0]->send("a1", frame_of(kFrameBytes), nullptr);
    rig.net->flush();
  });
  REQUIRE(rig.arrivals["b0"].size() == 2);
  REQUIRE(rig.arrivals["a1"].size() == 1);
  const double bytes = static_cast<double>(frame_of(kFrameBytes).size());
  const double uplink = 20e6 / 8;
  // Both at half the uplink; the latency is the WAN's plus half of site a's LAN (the
  // sender's interface is off the route, its half latency on the uplink instead) and
  // b0's interface's (site b has no second peer, so no LAN pair: the default link's, none).
  const double expected = kLatencyS + 0.001 + 2 * bytes / uplink;
  MESSAGE("two flows through a 20 Mbit/s uplink arrive at " << rig.arrivals["b0"][0] << " and " << rig.arrivals["b0"][1]
                                                            << " s, L + 2B/W_up = " << expected);
  CHECK(rig.arrivals["b0"][0] == doctest::Approx(expected).epsilon(1e-5));
  CHECK(rig.arrivals["b0"][1] == doctest::Approx(expected).epsilon(1e-5));
  // Inside the site: the LAN's 2 ms and its 100 Gbit/s, the uplink's flows beside it or not.
  const double lan = 0.002 + bytes / (100000e6 / 8);
  CHECK(rig.arrivals["a1"][0] == doctest::Approx(lan).epsilon(1e-5));
}

// Two frames of B bytes queued at once on one link (a0 -> b0); when the sender heard of
// each, and when each arrived. An empty `completion` leaves the config's default.
struct TwoFrames {
  std::vector<double> done_at, arrivals;
};
TwoFrames two_frames_on_one_link(const std::string& completion) {
  SimRig rig("CM02", three_peers(0, completion.empty() ? "" : "experiment { simulation { sender_completion: \"" + completion + "\" } }"));
  TwoFrames out;
  rig.run([&] {
    for (int k = 0; k < 2; ++k) {
      rig.transports[0]->send("b0", frame_of(kFrameBytes), [&](const SendStatus&) { out.done_at.push_back(s4u::Engine::get_clock()); });
    }
    rig.net->flush();
  });
  out.arrivals = rig.arrivals["b0"];
  return out;
}

TEST_CASE("simulated network: completing at arrival, the next frame on a link waits for the last to arrive") {
  const TwoFrames f = two_frames_on_one_link("arrival");
  REQUIRE(f.arrivals.size() == 2);
  REQUIRE(f.done_at.size() == 2);
  const double bw = static_cast<double>(frame_of(kFrameBytes).size()) / kWanBytesPerS;
  MESSAGE("at arrival: heard at " << f.done_at[0] << ", " << f.done_at[1] << " s; arrived at " << f.arrivals[0] << ", " << f.arrivals[1]);
  CHECK(f.done_at[0] == doctest::Approx(kLatencyS + bw).epsilon(0.001));
  CHECK(f.arrivals[1] == doctest::Approx(2 * (kLatencyS + bw)).epsilon(0.001));
}

TEST_CASE("simulated network: completing at departure (CM02's default), the sender hears at B/W and the next frame "
          "follows in the pipe, as on the emulated link") {
  const TwoFrames f = two_frames_on_one_link("");
  REQUIRE(f.arrivals.size() == 2);
  REQUIRE(f.done_at.size() == 2);
  const double bw = static_cast<double>(frame_of(kFrameBytes).size()) / kWanBytesPerS;
  MESSAGE("at departure: heard at " << f.done_at[0] << ", " << f.done_at[1] << " s; arrived at " << f.arrivals[0] << ", " << f.arrivals[1]
                                    << " (the emulated link: the second at 0.3777 s)");
  CHECK(f.done_at[0] == doctest::Approx(bw).epsilon(0.001));
  CHECK(f.done_at[1] == doctest::Approx(2 * bw).epsilon(0.001));
  CHECK(f.arrivals[0] == doctest::Approx(kLatencyS + bw).epsilon(0.001));  // an idle route: L + B/W, as at arrival
  CHECK(f.arrivals[1] == doctest::Approx(kLatencyS + 2 * bw).epsilon(0.001));
}

// Two flows through the pipe, the second B + d bytes: both at W/2 until the first arrives
// at L + 2B/W, then the second alone for d/W (here 0.2 ms) more.
std::vector<double> arrivals_of_two_flows_fifth_of_a_millisecond_apart(const std::string& precision) {
  SimRig rig("CM02", three_peers(0, "experiment { simulation { time_precision_s: " + precision + " } }"));
  const size_t extra = static_cast<size_t>(kWanBytesPerS * 0.0002);
  rig.run([&] {
    rig.transports[0]->send("b0", frame_of(kFrameBytes), nullptr);
    rig.transports[1]->send("b0", frame_of(kFrameBytes + extra), nullptr);
    rig.net->flush();
  });
  return rig.arrivals["b0"];
}

TEST_CASE("simulated network: events within the time quantum (time_precision_s) are taken together, none later") {
  // SimGrid's default quantum, 10 us: the second arrival 0.2 ms after the first.
  const std::vector<double> fine = arrivals_of_two_flows_fifth_of_a_millisecond_apart("0.00001");
  REQUIRE(fine.size() == 2);
  MESSAGE("at 10 us: " << fine[0] << " and " << fine[1] << " s");
  CHECK(fine[1] - fine[0] == doctest::Approx(0.0002).epsilon(0.02));
}

TEST_CASE("simulated network: a 1 ms time quantum takes two arrivals 0.2 ms apart together, at the first's time") {
  const std::vector<double> coarse = arrivals_of_two_flows_fifth_of_a_millisecond_apart("0.001");
  REQUIRE(coarse.size() == 2);
  const double bytes = static_cast<double>(frame_of(kFrameBytes).size());
  const double first = kLatencyS + 2 * bytes / kWanBytesPerS;
  MESSAGE("at 1 ms: " << coarse[0] << " and " << coarse[1] << " s; L + 2B/W = " << first);
  CHECK(coarse[0] == doctest::Approx(first).epsilon(0.001));
  // The second was due 0.4 ms later at the rate it had (W/2) before the first ended:
  // within the quantum, so it is taken with the first, 0.2 ms early.
  CHECK(coarse[1] == coarse[0]);
}

TEST_CASE("simulated network: a time quantum over half a WAN link's latency is refused, naming the link") {
  const auto engine = start_engine({"--log=root.thresh:error"});
  // The WAN's 40 ms under twice a 25 ms quantum: refused, naming the link.
  const config::Config wan = parse_config(three_peers(1, "experiment { simulation { time_precision_s: 0.025 } }"), "sim_network_test");
  CHECK_THROWS_WITH_AS(sim::build_platform(wan.cluster(), wan.experiment().simulation()),
                       doctest::Contains("time_precision_s: 0.025000 s is more than half the latency of link 'wan a > b'"), InputError);
}

TEST_CASE("simulated network: a time quantum over half a LAN hop's latency is said at start, not refused") {
  const auto engine = start_engine({"--log=root.thresh:error"});
  // A 1 ms LAN is 0.5 ms a hop, under twice a 1 ms quantum; the 40 ms WAN is not.
  const config::Config lan = parse_config(three_peers(1, "experiment { simulation { time_precision_s: 0.001 } }"), "sim_network_test");
  const sim::SimPlatform p = sim::build_platform(lan.cluster(), lan.experiment().simulation());
  REQUIRE(p.notes.size() == 1);  // site a (b has one peer: no LAN hop)
  CHECK(p.notes[0].find("link 'a LAN (half its latency a hop)' (0.000500 s): its latency is not resolved") != std::string::npos);
}

TEST_CASE("simulated network: an outage of a WAN link delays delivery by its length") {
  SimRig rig;
  const double outage_at = 0.05, outage_s = 3.0;
  rig.run([&] {
    rig.transports[0]->send("b0", frame_of(kFrameBytes), nullptr);
    rig.net->flush();
    s4u::this_actor::sleep_for(outage_at);
    s4u::Link* wan = rig.platform.wan.at({0, 1});
    wan->turn_off();
    s4u::this_actor::sleep_for(outage_s);
    wan->turn_on();
    rig.net->routes_changed();
  });
  REQUIRE(rig.arrivals["b0"].size() == 1);
  const double bytes = static_cast<double>(frame_of(kFrameBytes).size());
  // The frame was cut at outage_at and is carried whole once the link is back.
  const double expected = outage_at + outage_s + kLatencyS + bytes / kWanBytesPerS;
  MESSAGE("delivered at " << rig.arrivals["b0"][0] << " s; without the outage " << kLatencyS + bytes / kWanBytesPerS
                          << " s; outage of " << outage_s << " s from " << outage_at << " s");
  CHECK(rig.arrivals["b0"][0] == doctest::Approx(expected).epsilon(0.001));
  CHECK(rig.net->counters().retries == 1);
}

// The emulated transport (real time, the in-process cluster's and hearsay-run's) on the
// same link: the figures the simulated ones are compared with in docs/SIMULATION.md.
TEST_CASE("emulated link, for comparison: one frame at L + B/W, two through one shared pipe in turn") {
  TransportOptions o;
  o.secret = "sim-network-test-secret";
  o.heartbeat_interval_s = 0;
  auto make = [&](const std::string& id) {
    TransportOptions p = o;
    p.peer_id = id;
    p.cluster_peers = {"a0", "a1", "b0"};
    return create_transport("inproc", p);
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<double> arrived;
  const auto t0 = std::chrono::steady_clock::now();
  auto b0 = make("b0");
  b0->set_receiver([&](const std::string&, InFrame&&) {
    std::lock_guard<std::mutex> lock(mu);
    arrived.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    cv.notify_all();
  });
  const std::string address = b0->listen("");
  LinkModel wan;
  wan.latency_s = kLatencyS;
  wan.bandwidth_bps = 8 * kWanBytesPerS;
  wan.pipe = "sim-network-test wan";
  wan.pipe_scope = "sim-network-test-" + std::to_string(::getpid());
  auto a0 = create_emulated_transport(make("a0"), {}, {{"b0", wan}}, 1);
  auto a1 = create_emulated_transport(make("a1"), {}, {{"b0", wan}}, 2);
  a0->connect("b0", address);
  a1->connect("b0", address);
  while (a0->connected_peers().empty() || a1->connected_peers().empty()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  const auto sent = std::chrono::steady_clock::now();
  a0->send("b0", frame_of(kFrameBytes), nullptr);
  a1->send("b0", frame_of(kFrameBytes), nullptr);
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::seconds(5), [&] { return arrived.size() == 2; });
  }
  REQUIRE(arrived.size() == 2);
  const double start = std::chrono::duration<double>(sent - t0).count();
  const double bytes = static_cast<double>(frame_of(kFrameBytes).size());
  const double first = arrived[0] - start, second = arrived[1] - start;
  MESSAGE("emulated: first at " << first << " s (L + B/W = " << kLatencyS + bytes / kWanBytesPerS << "), second at " << second
                                << " s (L + 2B/W = " << kLatencyS + 2 * bytes / kWanBytesPerS << ")");
  // The shared pipe serves frames in turn: the first at L + B/W, the second one transmit
  // time behind (the simulated max-min pipe gives both L + 2B/W; the mean is the same).
  CHECK(first >= (kLatencyS + bytes / kWanBytesPerS) * 0.95);
  CHECK(second >= (kLatencyS + 2 * bytes / kWanBytesPerS) * 0.95);
  CHECK(second <= kLatencyS + 2 * bytes / kWanBytesPerS + 0.25);
  a0->close();
  a1->close();
  b0->close();
}

}  // namespace
}  // namespace hearsay
