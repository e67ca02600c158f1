package rediscmd

import (
	"context"
	"crypto/sha1"
	"encoding/hex"

	"github.com/redis/go-redis/v9"
)

// Runner runs Lua scripts by hash and says how its calls end.
type Runner interface {
	// Run runs a script from args laid out as EVALSHA takes them:
	// "evalsha", the script's SHA-1 in hex, the number of keys, the keys,
	// the arguments. If the server has not seen the script (a NOSCRIPT
	// reply), it runs it again as EVAL with src, writing "eval" and src
	// over args[0] and args[1]. The keys and arguments are strings,
	// []byte, *string, int64, *int64, int, nil (an empty argument) or an
	// encoding.BinaryMarshaler; a pointer is read, and a BinaryMarshaler
	// marshalled, when the command is written (go-redis does so at every
	// send of the command, rueidis once, before the first). Run keeps no
	// reference to args once it returns.
	//
	// A reply error (the server refused the command, so it did nothing)
	// is an error with a RedisError method, as go-redis's are; any other
	// error means the command may or may not have run.
	Run(ctx context.Context, src string, args []any) Reply

	// HonoursDeadlines reports whether a call ends by its context's
	// deadline, whatever happens on the connection (see package
	// rediscall: calls on a client that does not are run in a goroutine).
	HonoursDeadlines() bool
}

// Loader loads a script into every server that may run it (every master
// of a Redis Cluster), so that its first EVALSHA there needs no EVAL.
type Loader interface {
	Load(ctx context.Context, src string) error
}

// Reply is a command's reply, read in go-redis's terms: integers are
// int64, bulk strings string, arrays []any, a nil bulk string nil (and, at
// the top level, the error Nil). A *redis.Cmd of go-redis is one.
type Reply interface {
	Err() error
	Val() any
	Result() (any, error)
	Int64() (int64, error)
	Int64Slice() ([]int64, error)
	Slice() ([]any, error)
}

var _ Reply = (*redis.Cmd)(nil)

// Nil is the error of a Reply that is a nil bulk string: go-redis's.
var Nil = redis.Nil

// Script is a Lua script run by its hash, sent whole the first time a
// server has not seen it.
type Script struct {
	src  string
	hash string
	// hashArg is hash boxed once, so that laying out a call's arguments
	// does not allocate for it every time.
	hashArg any
}

// NewScript returns the Script of src.
func NewScript(src string) *Script {
	sum := sha1.Sum([]byte(src))
	h := hex.EncodeToString(sum[:])
	return &Script{src: src, hash: h, hashArg: h}
}

// Hash returns the script's SHA-1 in hex.
func (s *Script) Hash() string { return s.hash }

// Src returns the script's source.
func (s *Script) Src() string { return s.src }

// Run runs the script on c with keys and args.
func (s *Script) Run(ctx context.Context, c Runner, keys []string, args ...any) Reply {
	return c.Run(ctx, s.src, s.Args(keys, args...))
}

// Args lays out a call of the script with keys and args as [Runner.Run]
// takes them, in one new slice; keys and args are not kept.
func (s *Script) Args(keys []string, args ...any) []any {
	all := make([]any, 3+len(keys)+len(args))
	all[0], all[1], all[2] = "evalsha", s.hashArg, len(keys)
	for i, k := range keys {
		all[3+i] = k
	}
	copy(all[3+len(keys):], args)
	return all
}
