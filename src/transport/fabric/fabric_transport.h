// The fabric transport: libfabric reliable-datagram endpoints (FI_EP_RDM) with the
// provider named in the options: "tcp;ofi_rxm" (default), "shm" for peers on one host,
// verbs or efa where the machine has them.
//
// How it works: each peer opens one endpoint. Peers find each other through a small TCP
// bootstrap at the listen address: the dialler sends its endpoint name, the listener
// answers with its own, both insert the other into their address vector, and the
// bootstrap socket stays open as the link's liveness signal (its close means the peer is
// gone). Frames then travel as ordered (FI_ORDER_SAS) messages of at most one receive
// buffer each, reassembled by the same FrameDecoder and Session as tcp. Receive buffers
// are registered once and reposted; payloads are sent from the caller's memory unless
// the provider needs local registration (FI_MR_LOCAL), in which case they are staged
// through registered send buffers. Where both sides can (shm), large payloads skip the
// receive buffers: each goes as one tagged message that the receiver, having read the
// frame's head, receives straight into the frame (docs/WIRE.md, "direct payloads").
// One thread drives the completion queue. register_memory() registers with fi_mr_reg
// where the provider's domain asks for local registration, and says it needs none elsewhere.
//
// The files: fabric_endpoint (the libfabric objects, buffers and posted operations),
// fabric_progress (the thread that drives them), fabric_connection (one peer),
// fabric_bootstrap (how peers meet), fabric_transport_impl.h and fabric_transport.cpp (the
// transport's life cycle), scratch_space.h (where discarded payloads land).
#pragma once

#include <memory>

#include "hearsay/transport.h"

namespace hearsay {

std::unique_ptr<Transport> create_fabric_transport(const TransportOptions& options);

}  // namespace hearsay
