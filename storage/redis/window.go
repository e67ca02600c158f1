package redis

import (
	"fmt"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// retryPlan is what a go-redis client may do between the first run of a
// command on the server and the last time it sends the command again: the
// waits of each retry, with go-redis v9.23's defaults and its meaning of 0
// and -1 applied.
type retryPlan struct {
	retries     int           // resends after the first send
	backoff     time.Duration // longest wait before a resend
	pool        time.Duration // longest wait for a pooled connection
	dial        time.Duration // one dial attempt; 0: no bound
	dialTries   int           // dial attempts per new connection
	dialPause   time.Duration // longest pause between two dial attempts
	read, write time.Duration // socket read and write timeouts; 0: no bound
}

// handshakeTrips is the round trips a new connection makes before a command
// can be written on it: HELLO, the pipelined AUTH/SELECT/CLIENT SETINFO, and
// the maintenance notifications handshake.
const handshakeTrips = 3

// horizon returns the longest time from the first run of a command to the
// server's receipt of its last resend, or an error when some wait has no
// bound while the client retries.
//
// Each resend follows a failure of the attempt before it, which the client
// sees at most read after that attempt ran on the server. It then waits up
// to backoff, up to pool for a connection, up to one dial budget (dialTries
// attempts of dial with a pause between two) plus one dial timeout for a
// connection another goroutine is still setting up, handshakeTrips round
// trips on the new connection, and write to send the command. retries such
// steps follow the first run at most:
//
//	horizon = retries × (read + backoff + pool + dialTries×dial + (dialTries−1)×dialPause
//	                     + dial + handshakeTrips×(write+read) + write)
func (p retryPlan) horizon() (time.Duration, error) {
	if p.retries <= 0 {
		return 0, nil
	}
	switch {
	case p.read <= 0:
		return 0, fmt.Errorf("%w: the client's ReadTimeout is disabled and it retries commands (MaxRetries %d), so a retry may come at any time: set a ReadTimeout, or turn retries off", errInvalidOption, p.retries)
	case p.write <= 0:
		return 0, fmt.Errorf("%w: the client's WriteTimeout is disabled and it retries commands (MaxRetries %d), so a retry may come at any time: set a WriteTimeout, or turn retries off", errInvalidOption, p.retries)
	case p.dial <= 0:
		return 0, fmt.Errorf("%w: the client's DialTimeout is disabled and it retries commands (MaxRetries %d), so a retry may come at any time: set a DialTimeout, or turn retries off", errInvalidOption, p.retries)
	}
	tries := time.Duration(p.dialTries)
	step := p.read + max(p.backoff, 0) + max(p.pool, 0) +
		tries*p.dial + (tries-1)*max(p.dialPause, 0) + p.dial +
		handshakeTrips*(p.write+p.read) + p.write
	return time.Duration(p.retries) * step, nil
}

// planOf reads the retry plan of a *goredis.Client or *goredis.ClusterClient;
// ok is false for any other client. (New refuses a *goredis.Ring: see
// ring.go.)
func planOf(client goredis.Scripter) (p retryPlan, ok bool) {
	switch c := client.(type) {
	case *goredis.Client:
		// NewClient has already applied the defaults: 0 and below now mean
		// "none" (no retries, no backoff, no timeout).
		o := c.Options()
		p = retryPlan{
			retries: max(o.MaxRetries, 0), backoff: o.MaxRetryBackoff, pool: o.PoolTimeout,
			dial: o.DialTimeout, read: o.ReadTimeout, write: o.WriteTimeout,
		}
		p.dialTries, p.dialPause = dialRetries(o.DialerRetries, o.DialerRetryTimeout, o.DialerRetryBackoff)
		return p, true
	case *goredis.ClusterClient:
		// The cluster client sends a command up to MaxRedirects+1 times, each
		// through a node client that itself retries MaxRetries times (none
		// by default). Node clients apply Options' defaults to what the
		// cluster passes them.
		o := c.Options()
		node := max(o.MaxRetries, 0)
		read := nodeTimeout(o.ReadTimeout, 5*time.Second)
		p = retryPlan{
			retries: (max(o.MaxRedirects, 0)+1)*(node+1) - 1,
			backoff: max(o.MaxRetryBackoff, nodeBackoff(o.MaxRetryBackoff)),
			pool:    nodePool(o.PoolTimeout, read),
			dial:    nodeTimeout(o.DialTimeout, 5*time.Second),
			read:    read, write: nodeTimeout(o.WriteTimeout, read),
		}
		p.dialTries, p.dialPause = dialRetries(o.DialerRetries, o.DialerRetryTimeout, o.DialerRetryBackoff)
		return p, true
	}
	return retryPlan{}, false
}

// nodeTimeout is a timeout as a node client's options make it: 0 means def,
// a negative value none (0 here).
func nodeTimeout(v, def time.Duration) time.Duration {
	switch {
	case v > 0:
		return v
	case v == 0:
		return def
	}
	return 0
}

// nodeBackoff is a retry backoff as a node client's options make it: 0
// means one second.
func nodeBackoff(v time.Duration) time.Duration {
	if v == 0 {
		return time.Second
	}
	return v
}

// nodePool is a pool timeout as a node client's options make it: 0 means
// one second more than the read timeout, or 30 s without one.
func nodePool(v, read time.Duration) time.Duration {
	switch {
	case v != 0:
		return v
	case read > 0:
		return read + time.Second
	}
	return 30 * time.Second
}

// dialRetries returns the dial attempts per connection and the longest
// pause between two, as go-redis's pool applies them: 5 attempts unless
// more are set, and a constant pause (100 ms unless set) unless a backoff
// function gives the pause of each attempt.
func dialRetries(tries int, pause time.Duration, backoff func(int) time.Duration) (int, time.Duration) {
	if tries <= 0 {
		tries = 5
	}
	if backoff == nil {
		if pause <= 0 {
			pause = 100 * time.Millisecond
		}
		return tries, pause
	}
	var longest time.Duration
	for i := range tries - 1 {
		longest = max(longest, backoff(i))
	}
	return tries, longest
}
