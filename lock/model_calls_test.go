package lock_test

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strconv"
	"testing"

	"github.com/fencekit/fencekit/lock"
)

// How the model reads the Locker's script calls from its clients' hooks:
// each call is named by the script it runs (its hash, or the hash of the
// source an EVAL sends), and each reply by the shape the script documents.
// A reply of a shape the model does not know is counted as unparsed, never
// dropped: a run with too many of them fails (see model.report), so a
// change of the protocol makes the model fail rather than judge nothing.

// modelScripts names the Locker's scripts by hash (lock.ModelScripts).
var modelScripts = lock.ModelScripts()

// scriptCall is one EVALSHA or EVAL of a named script, its keys and its
// arguments read as text.
type scriptCall struct {
	name string
	keys []string
	argv []string
}

// argText reads a command argument as Redis gets it: go-redis writes a
// *string or *int64 as the value it points at.
func argText(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case *string:
		if x != nil {
			return *x
		}
	case *int64:
		if x != nil {
			return strconv.FormatInt(*x, 10)
		}
	case []byte:
		return string(x)
	}
	return fmt.Sprint(v)
}

// parseScriptCall names a command that runs one of the Locker's scripts;
// ok is false for any other command.
func parseScriptCall(args []any) (c scriptCall, ok bool) {
	if len(args) < 3 {
		return c, false
	}
	var hash string
	switch argText(args[0]) {
	case "evalsha", "EVALSHA":
		hash = argText(args[1])
	case "eval", "EVAL":
		sum := sha1.Sum([]byte(argText(args[1])))
		hash = hex.EncodeToString(sum[:])
	default:
		return c, false
	}
	if c.name, ok = modelScripts[hash]; !ok {
		return c, false
	}
	n, err := strconv.Atoi(argText(args[2]))
	if err != nil || n < 0 || 3+n > len(args) {
		return c, false
	}
	for _, k := range args[3 : 3+n] {
		c.keys = append(c.keys, argText(k))
	}
	for _, a := range args[3+n:] {
		c.argv = append(c.argv, argText(a))
	}
	return c, true
}

// The shapes of acquire.lua's replies, as its header names them.
const (
	shapeRefused    = "refused"     // {0, remaining ms}
	shapeQueued     = "queued"      // {0, remaining ms, refreshed µs, place}: a queued caller's refusal
	shapeGranted    = "granted"     // {1, token[, 1]} (token 0: a retried grant whose state was lost)
	shapeReentered  = "reentered"   // {2, token, holder}
	shapeHandedOver = "handed over" // {3, token, remaining ms}: a release handed it to this queued caller
)

// acquireReply is one of acquire.lua's replies, read by its shape.
type acquireReply struct {
	shape  string
	token  int64  // granted, reentered, handed over
	ref    int64  // queued: the entry's refresh, µs on the server's clock
	holder string // reentered: the holder of the grant re-entered
}

// parseAcquireReply reads a reply of acquire.lua; ok is false for a reply
// of no shape the script documents.
func parseAcquireReply(v any) (r acquireReply, ok bool) {
	res, isSlice := v.([]any)
	if !isSlice || len(res) < 2 {
		return r, false
	}
	kind, ok1 := res[0].(int64)
	n, ok2 := res[1].(int64)
	if !ok1 || !ok2 {
		return r, false
	}
	switch {
	case kind == 0 && len(res) == 2:
		return acquireReply{shape: shapeRefused}, true
	case kind == 0 && len(res) == 4:
		ref, ok := res[2].(int64)
		if !ok || ref <= 0 {
			return r, false
		}
		if _, ok := res[3].(int64); !ok && res[3] != nil {
			return r, false
		}
		return acquireReply{shape: shapeQueued, ref: ref}, true
	case kind == 1 && (len(res) == 2 || len(res) == 3 && res[2] == int64(1)):
		return acquireReply{shape: shapeGranted, token: n}, true
	case kind == 2 && len(res) == 3:
		h, ok := res[2].(string)
		if !ok {
			return r, false
		}
		return acquireReply{shape: shapeReentered, token: n, holder: h}, true
	case kind == 3 && len(res) == 3:
		if _, ok := res[2].(int64); !ok {
			return r, false
		}
		return acquireReply{shape: shapeHandedOver, token: n}, true
	}
	return r, false
}

// TestModelReadsAcquireReplies pins the reply shapes the model reads to
// acquire.lua's, so that a reply the model would count as unparsed is a
// change of the protocol, not a slip of the parser.
func TestModelReadsAcquireReplies(t *testing.T) {
	for _, tc := range []struct {
		reply any
		shape string
	}{
		{[]any{int64(0), int64(25)}, shapeRefused},
		{[]any{int64(0), int64(-1)}, shapeRefused},
		{[]any{int64(0), int64(25), int64(1_700_000_000_000_000), int64(2)}, shapeQueued},
		{[]any{int64(0), int64(25), int64(1_700_000_000_000_000), nil}, shapeQueued},
		{[]any{int64(1), int64(7)}, shapeGranted},
		{[]any{int64(1), int64(7), int64(1)}, shapeGranted},
		{[]any{int64(2), int64(7), "holder"}, shapeReentered},
		{[]any{int64(3), int64(7), int64(20)}, shapeHandedOver},
		{[]any{int64(0), int64(25), int64(1)}, ""},
		{[]any{int64(4)}, ""},
		{[]any{int64(5), int64(1)}, ""},
		{"7", ""},
		{nil, ""},
	} {
		r, ok := parseAcquireReply(tc.reply)
		if ok != (tc.shape != "") || r.shape != tc.shape {
			t.Errorf("reply %v: read as %q (ok %v), want %q", tc.reply, r.shape, ok, tc.shape)
		}
	}
	// Every script the model names is one the Locker runs: an EVAL of its
	// source is recognised as the script.
	for _, name := range []string{"acquire", "try", "raise"} {
		c, ok := parseScriptCall([]any{"eval", lock.ModelScriptSource(name), 1, "k", "a"})
		if !ok || c.name != name || len(c.keys) != 1 || len(c.argv) != 1 {
			t.Errorf("EVAL of the %s script read as %+v (ok %v)", name, c, ok)
		}
	}
	holder := "h"
	c, ok := parseScriptCall([]any{"evalsha", findHash(t, "acquire"), "1", "k", &holder})
	if !ok || c.argv[0] != "h" {
		t.Errorf("a *string argument read as %+v (ok %v)", c, ok)
	}
}

func findHash(t *testing.T, name string) string {
	for h, n := range modelScripts {
		if n == name {
			return h
		}
	}
	t.Fatalf("no script named %s", name)
	return ""
}

// TestModelReadsReleaseMessages pins the release messages the model reads
// besides a grant: a queue announcement, and nothing else of its shape.
func TestModelReadsReleaseMessages(t *testing.T) {
	for msg, want := range map[string]bool{
		"q:120:a: 1 0 0":       true,
		"q:-2:a:b:c: 1 0 0":    true,
		"q:-1:a:b: 1 0 0":      true,
		"q:120:a":              false,
		"q:120: 1 0 0":         false,
		"q:x:a: 1 0 0":         false,
		"q:120:a:b:c:d: 1 0 0": false,
		"q:120::b: 1 0 0":      false,
		"h 12 1700000 3":       false,
		"moved":                false,
		"q:-3:a: 1 0 0":        false,
	} {
		if got := isQueueAnnouncement(msg); got != want {
			t.Errorf("%q read as a queue announcement: %v, want %v", msg, got, want)
		}
	}
}
