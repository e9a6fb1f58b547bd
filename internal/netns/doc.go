// Package netns builds a small network of "hosts" on one Linux machine for
// multi-host tests: each host is a network namespace of its own
// (ip netns add) with loopback and one veth interface, eth0, whose peer is a
// port of a bridge living in a switch namespace of its own, so that nothing
// is added to the caller's namespace (no interface, address or route).
// Addresses are from a private /24 and exist only inside the namespaces the
// Net made. Names carry a random prefix, unique per Net, and Close removes
// every namespace (their interfaces go with them).
//
// A Host runs commands inside its namespace (ip netns exec), takes its link
// down and up (a partition), and dials from inside its namespace
// (Host.DialContext, Host.HTTPClient), so a test process in the root
// namespace can talk to the servers of a host without an address there.
//
// It needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and the ip command
// (iproute2). A Net is safe for concurrent use once built; AddHost and Close
// must not run concurrently with each other.
package netns
