// The one place that knows which transports this build contains.
#include "hearsay/build_config.h"
#include "hearsay/error.h"
#include "hearsay/transport.h"
#include "inproc/inproc_transport.h"
#include "tcp/tcp_transport.h"
#if HEARSAY_HAVE_FABRIC
#include "fabric/fabric_transport.h"
#endif

namespace hearsay {

std::unique_ptr<Transport> create_transport(const std::string& kind, const TransportOptions& options) {
  if (kind == "tcp") return create_tcp_transport(options);
  if (kind == "inproc") return create_inproc_transport(options);
  if (kind == "fabric" || kind.rfind("fabric:", 0) == 0) {
#if HEARSAY_HAVE_FABRIC
    // "fabric:PROVIDER" names the provider inline; plain "fabric" takes it from options.
    if (kind == "fabric") return create_fabric_transport(options);
    TransportOptions o = options;
    o.fabric_provider = kind.substr(7);
    return create_fabric_transport(o);
#else
    throw InputError("transport 'fabric': this build has no libfabric (HEARSAY_FABRIC=OFF or libfabric-dev missing)");
#endif
  }
  throw InputError("transport '" + kind + "': unknown; use tcp, fabric, fabric:PROVIDER or inproc");
}

std::vector<std::string> available_transports() {
  std::vector<std::string> kinds{"tcp", "inproc"};
#if HEARSAY_HAVE_FABRIC
  kinds.push_back("fabric:tcp;ofi_rxm");
  kinds.push_back("fabric:shm");
#endif
  return kinds;
}

}  // namespace hearsay
