// Which of this machine's addresses its peers can reach.
//
// A trainer accepts its peers' connections (Gloo's pairs) on one address, which it
// publishes through the rendezvous store; peers on other machines dial that address. The
// host name is a poor default for it: Debian maps it to 127.0.1.1 in /etc/hosts (many
// images to 127.0.0.1), so a trainer that binds its host name advertises a loopback
// address, and every peer on another machine dials its own loopback instead. What is
// reachable, in the common case of one cluster network, is the address of the interface
// that traffic to the coordinator leaves through: the coordinator's network is the one
// every node shares.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace drover {

// The local IP address (text form: "10.0.0.11", "fd00::11") of the interface the kernel
// routes packets to `address` ("host:port", "[v6]:port" or a bare host) through. Sends
// nothing: it connects a UDP socket, which only picks the route and the source address.
// A loopback `address` gives a loopback address. NotFound when the host does not
// resolve; Unavailable when there is no route to it (the network is not up yet).
// Thread-safe.
StatusOr<std::string> LocalAddressToward(std::string_view address);

// The first address `host` (a name or a literal) resolves to, in text form. NotFound when
// it does not resolve. Thread-safe.
StatusOr<std::string> ResolveHost(std::string_view host);

}  // namespace drover
