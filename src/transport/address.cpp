#include "address.h"

#include <charconv>

#include "hearsay/error.h"

namespace hearsay {

std::pair<std::string, std::string> split_host_port(const std::string& address) {
  std::string host, port;
  if (!address.empty() && address[0] == '[') {
    const auto close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      throw InputError("address '" + address + "': expected [ipv6]:port");
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    const auto colon = address.rfind(':');
    if (colon == std::string::npos || address.find(':') != colon) {
      throw InputError("address '" + address + "': expected host:port (IPv6 in brackets: [::1]:port)");
    }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  unsigned value = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (host.empty() || port.empty() || ec != std::errc() || ptr != port.data() + port.size() || value > 65535) {
    throw InputError("address '" + address + "': bad host or port");
  }
  return {host, port};
}

std::string join_host_port(const std::string& host, unsigned port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

}  // namespace hearsay
