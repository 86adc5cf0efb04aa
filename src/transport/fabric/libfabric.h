// libfabric, loaded (dlopen) when a fabric transport is first made, never linked: linking
// it loads every provider's libraries at process start, libinfinipath among them, whose
// constructor takes SIGINT, SIGTERM, SIGSEGV, SIGBUS, SIGILL and SIGABRT for a handler
// that calls exit(1) and writes *.btr files into the working directory. Before loading it
// sets libinfinipath's documented IPATH_NO_BACKTRACE (unless the environment sets it), so
// that handler is never installed; a peer that uses tcp never loads libfabric at all.
//
// The few functions libfabric exports (the rest of its API is inline calls through the
// objects these return) are reached through here, under names of their own, so nothing
// in the process can bind to them by accident.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

namespace hearsay::fabric {

struct Libfabric {
  decltype(&::fi_getinfo) getinfo;
  decltype(&::fi_freeinfo) freeinfo;
  decltype(&::fi_dupinfo) dupinfo;
  decltype(&::fi_fabric) fabric;
  decltype(&::fi_strerror) strerror;
};

// Loads libfabric.so.1 once (thread-safe); throws InputError when it cannot be loaded.
const Libfabric& libfabric();

}  // namespace hearsay::fabric
