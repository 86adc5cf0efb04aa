// Link emulation: a decorator over any transport that gives each directed link a one-way
// latency, jitter, a bandwidth cap, a loss probability and scheduled outages. This is how
// a geo-distributed cluster is reproduced on one machine.
//
// The model, per link: a frame of S bytes starts transmitting when the link is free
// (back-to-back frames queue behind each other), occupies it for 8S/B seconds (a token
// bucket with no burst allowance), and arrives latency + jitter after its last bit left;
// arrivals keep their order, as on a TCP path. A frame sent during an outage, or lost
// with probability `loss`, never arrives. The sender's completion fires when its frame
// has left the emulated link, as a failure for a frame that will never arrive. Links that
// name the same `pipe` share one such bandwidth queue (a WAN between two sites). Control
// frames (OutFrame::urgent: heartbeats, acknowledgements) skip the data queue, as the tcp
// transport sends them ahead of its own. A connection that drops takes the frames on its
// link with it: they are failed, or lost in flight, never delivered over the next one.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "hearsay/transport.h"

namespace hearsay {

struct LinkModel {
  double latency_s = 0;
  double jitter_s = 0;        // arrival delay varies uniformly in [-jitter, +jitter]
  double bandwidth_bps = 0;   // bits per second; 0: unlimited
  double loss = 0;            // probability in [0, 1)
  // [start, end) in seconds since the transport was created.
  std::vector<std::pair<double, double>> outages;
  // Non-empty: the bandwidth is a pipe of this name shared with every link (in this
  // process or another of the same run) that names it, instead of this link's own: a
  // WAN between two sites, one pipe per direction (shared_pipe.h). `pipe_scope` keeps
  // runs apart (pipe_scope_of_this_run() for a peer process).
  std::string pipe;
  std::string pipe_scope;
};

// The pipe scope of this process's run: HEARSAY_RUN_ID when set (hearsay-run sets one per
// run), else the parent's pid (peers started together by one launcher).
std::string pipe_scope_of_this_run();

// Checks a model's numbers; throws InputError naming `where` and the field.
void check_link_model(const LinkModel& m, const std::string& where);

// Wraps `inner`. Links to peers not in `per_peer` use `default_model`.
std::unique_ptr<Transport> create_emulated_transport(std::unique_ptr<Transport> inner, LinkModel default_model,
                                                     std::map<std::string, LinkModel> per_peer = {},
                                                     uint64_t seed = 1);

}  // namespace hearsay
