// Package freeport picks loopback TCP ports for processes that bind them
// later (a port flag given to a child process: cb up's services, a test's
// redis-server), so that no other process takes one between the pick and
// the bind: the ports come from below the kernel's ephemeral range and are
// reserved across processes (see Ports).
package freeport
