// "host:port" addresses: IPv4 literals, host names, and IPv6 literals in brackets.
#pragma once

#include <string>
#include <utility>

namespace hearsay {

// Splits an address; throws InputError naming it when malformed.
std::pair<std::string, std::string> split_host_port(const std::string& address);
std::string join_host_port(const std::string& host, unsigned port);

}  // namespace hearsay
