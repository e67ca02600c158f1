package redisbackend

import (
	"context"
	"time"

	"github.com/fencekit/fencekit/internal/rediscmd"
)

// Client is what the Redis backends need of a Redis client, so that one
// backend serves every client library: go-redis (goredis.go, in this
// module) and rueidis (the nested module lock/rueidisfence). It is small on
// purpose: scripts by hash, their replies, pub/sub, and a few facts about
// the deployment.
type Client interface {
	// Run and HonoursDeadlines run scripts, as package rediscmd says:
	// the part of this interface that storage/redis shares.
	rediscmd.Runner

	// Sharded reports whether the client spreads keys over the slots of a
	// Redis Cluster: releases then publish with SPUBLISH and waiters
	// subscribe with SSUBSCRIBE, one subscription connection per slot.
	Sharded() bool

	// PerChannel reports whether each channel needs a subscription
	// connection of its own (a go-redis Ring, which routes a connection by
	// its first channel).
	PerChannel() bool

	// NewPubSub returns a subscription connection with no channel yet;
	// making it does no I/O (a client may connect on its first Subscribe).
	NewPubSub() PubSub

	// Listen subscribes to channel (with SSUBSCRIBE when Sharded) and
	// returns the payloads published on it until ctx ends, then closes
	// the channel. The subscription is sent before Listen returns; after
	// a broken connection it is made again, and what was published
	// meanwhile is not heard.
	Listen(ctx context.Context, channel string) <-chan string

	// IDs names what makes two clients the same Redlock voter: at least
	// the client itself, and where the client knows it, the server it
	// reaches.
	IDs() []any

	// DialFailure returns the error of the client's latest failed dial if
	// no dial has succeeded since and it is recent, or nil; a client that
	// cannot tell returns nil. Redlock uses it to say why a node did not
	// answer.
	DialFailure() error
}

// Reply is a command's reply, read in go-redis's terms (see
// rediscmd.Reply).
type Reply = rediscmd.Reply

// Nil is the error of a Reply that is a nil bulk string: go-redis's.
var Nil = rediscmd.Nil

// PubSub is one subscription connection of a Client. Subscribe and
// Unsubscribe use SSUBSCRIBE and SUNSUBSCRIBE when the client is Sharded.
// Its methods are called by one writer (Subscribe, Unsubscribe) and one
// reader (Receive, Ping) at a time, and Close from anywhere, more than
// once.
type PubSub interface {
	Subscribe(ctx context.Context, channel string) error
	Unsubscribe(ctx context.Context, channel string) error
	// Receive returns the next event, waiting at most timeout; with
	// nothing received by then it returns an Event of kind EventNone and
	// a nil error. An error means the connection is broken or closed:
	// the caller replaces it.
	Receive(timeout time.Duration) (Event, error)
	// Ping checks that the connection still answers.
	Ping(ctx context.Context) error
	Close() error
}

// EventKind is what a PubSub received.
type EventKind uint8

const (
	EventNone        EventKind = iota // nothing within the timeout
	EventSubscribe                    // a subscription was confirmed
	EventUnsubscribe                  // a subscription ended (asked for, or by the server)
	EventMessage                      // a message on a subscribed channel
	EventOther                        // anything else (a pong)
)

// Event is one thing a PubSub received.
type Event struct {
	Kind    EventKind
	Channel string
	Payload string
}

// script is a Lua script run by its hash, sent whole the first time a
// server has not seen it.
type script = rediscmd.Script

func newScript(src string) *script { return rediscmd.NewScript(src) }

// cutReply is the reply of a call cut short at its context's end (see
// calls.go): only its error.
type cutReply struct{ err error }

func (r cutReply) Err() error                   { return r.err }
func (r cutReply) Val() any                     { return nil }
func (r cutReply) Result() (any, error)         { return nil, r.err }
func (r cutReply) Int64() (int64, error)        { return 0, r.err }
func (r cutReply) Int64Slice() ([]int64, error) { return nil, r.err }
func (r cutReply) Slice() ([]any, error)        { return nil, r.err }
