package testenv

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Commands is a go-redis hook (client.AddHook) that records the name of
// every command the client sends, pipelined ones included, in lower case.
type Commands struct {
	mu    sync.Mutex
	names []string
}

// Take returns the commands recorded since the last Take and forgets them.
func (h *Commands) Take() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := h.names
	h.names = nil
	return out
}

// Len returns how many commands were recorded since the last Take.
func (h *Commands) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.names)
}

func (h *Commands) record(cmds ...redis.Cmder) {
	h.mu.Lock()
	for _, c := range cmds {
		h.names = append(h.names, strings.ToLower(c.Name()))
	}
	h.mu.Unlock()
}

// DialHook passes dials through.
func (h *Commands) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook records cmd.
func (h *Commands) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.record(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook records every command of the pipeline.
func (h *Commands) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.record(cmds...)
		return next(ctx, cmds)
	}
}

// Replay is a go-redis hook (client.AddHook) that, once armed, lets some
// commands through and then runs the next one twice, reporting only the
// second reply: what a client does when it retries a command whose reply
// was lost after the server ran it (go-redis retries after a read timeout).
type Replay struct {
	skip  atomic.Int32
	armed atomic.Bool
}

// Arm makes the hook replay the command after the next skip commands, once.
func (h *Replay) Arm(skip int) {
	h.skip.Store(int32(skip))
	h.armed.Store(true)
}

// DialHook passes dials through.
func (h *Replay) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook runs the armed command twice.
func (h *Replay) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.armed.Load() && h.skip.Add(-1) < 0 && h.armed.CompareAndSwap(true, false) {
			_ = next(ctx, cmd) // the run whose reply is lost
		}
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook passes pipelines through.
func (h *Replay) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
