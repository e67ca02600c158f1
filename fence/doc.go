// Package fence holds the vocabulary that a lock and a store share: fencing
// tokens, fences, the admission rule and the errors a store returns when it
// refuses an operation.
//
// A lock grants a resource to one holder at a time and hands it a [Fence]: the
// resource, a [Token] that strictly increases with every grant of that
// resource, and a holder id that is unique to the grant. A store that keeps a
// high-water mark per resource (or per row) admits an operation carrying a
// fence only if [Admits] says so, and raises the mark in the same atomic step
// as the operation itself. A refused operation changes nothing and returns a
// [*StaleError], which matches [ErrStale] and carries the mark it lost to.
//
// After a refusal the holder's unit of work is over: drop it, or redo it whole
// (fenced read, compute, fenced write) under a newer fence. Retrying only the
// refused write with a newer token would overwrite the newer holder's update
// with a value computed from an old read.
//
// Reads that a later write depends on must pass the same admission: a holder
// whose read was admitted cannot then be overtaken by an older holder's write,
// because the older holder's token is now below the mark.
//
// The package imports no database driver. Any lock that can produce a strictly
// increasing token per resource (this module's lock package, or a fence taken
// over a redsync or redislock lock) can drive the storage adapters.
package fence
