package rediscmd

// StoreClient is what storage/redis runs on: its scripts, and their
// loading by Store.Preload.
type StoreClient interface {
	Runner
	Loader
}

// NewStore is storage/redis's constructor of a Store on c, a client other
// than go-redis's: its options cannot be read and it does not marshal a
// script's arguments at every send, so the store treats every send as one
// that may repeat an earlier one (see storage/redis's Retries). opts are
// storage/redis Option values; the *redis.Store is returned as any, since
// storage/redis imports this package. Package storage/redis sets it when
// it is initialised, so a package that imports storage/redis (the nested
// module lock/rueidisfence) can call it.
var NewStore func(c StoreClient, opts []any) (any, error)
