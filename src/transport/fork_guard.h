// Listening sockets stay in this process, not in the children it forks.
//
// A fork copies every descriptor. A child that outlives this process's listener (a
// PyTorch DataLoader worker forked after init(), say) would keep the port open: the
// kernel goes on completing handshakes into a backlog nobody accepts from, and each
// such dialler's TLS handshake dies when the child exits. So every listening socket is
// recorded here, and a fork handler closes the child's copies.
#pragma once

namespace hearsay {

// Records `fd`, a listening socket, for closing in every child forked from now on.
void keep_listener_from_children(int fd);

}  // namespace hearsay
