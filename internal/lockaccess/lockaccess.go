// Package lockaccess lets the packages of this module that build on a
// [lock.Locker] (election) reach the Redis clients it was made with, without
// widening the lock package's public API. Package lock sets Clients, Nodes
// and Closed when it is initialised.
package lockaccess

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fencekit/fencekit/internal/rediscall"
)

// Clients returns the Redis clients of a *lock.Locker (one for a Locker made
// by lock.New, one per node for lock.NewRedlock) and how many of them must
// agree for a lease to be held. It takes the Locker as any because package
// lock imports this one.
var Clients func(locker any) (clients []redis.UniversalClient, quorum int)

// Node is one Redis client of a Locker with the Calls that make a call to
// it return by its context's deadline, whatever the client's options (see
// package rediscall). The Locker's Close waits, within its bound, for the
// calls left running in the background through Calls.
type Node struct {
	Client redis.UniversalClient
	Calls  *rediscall.Calls
}

// Nodes returns a *lock.Locker's nodes (as Clients does), the quorum, and
// the node timeout that bounds each node's call under Redlock (0 for a
// Locker made by lock.New, whose one node is bounded by the caller's
// context alone).
var Nodes func(locker any) (nodes []Node, quorum int, timeout time.Duration)

// Closed reports whether Close was called on a *lock.Locker.
var Closed func(locker any) bool
