// The inproc transport: peers in one process, each transport with its own thread and
// mailbox. Frames are flattened to bytes and decoded on the other side with the same
// decoder and session as tcp, so tests of the protocol run here exactly as on a socket.
// Addresses are names ("peer0"); listen("") picks a unique one.
#pragma once

#include <memory>

#include "hearsay/transport.h"

namespace hearsay {

std::unique_ptr<Transport> create_inproc_transport(const TransportOptions& options);

}  // namespace hearsay
