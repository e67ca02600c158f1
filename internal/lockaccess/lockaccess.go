// Package lockaccess lets the packages of this module that build on a
// [lock.Locker] (election) reach the Redis clients it was made with, without
// widening the lock package's public API. Package lock sets Clients when it
// is initialised.
package lockaccess

import "github.com/redis/go-redis/v9"

// Clients returns the Redis clients of a *lock.Locker (one for a Locker made
// by lock.New, one per node for lock.NewRedlock) and how many of them must
// agree for a lease to be held. It takes the Locker as any because package
// lock imports this one.
var Clients func(locker any) (clients []redis.UniversalClient, quorum int)
