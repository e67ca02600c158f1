package redisbackend

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// The record beside a resource's lock (the election's leader), on Redis: a
// hash next to the lock key (":leader": v the value, t the token, h the
// holder id), in the lock's slot, written only while its writer holds the
// lock and replaced only by a higher token; each write is announced on
// the resource's ":leaders" channel as "<token> <value>", and each value
// proclaimed within the grant (n counts them) as "<token>.<n> <value>".
// Redlock keeps one on every node and counts a quorum (redlock_record.go).

var (
	//go:embed record_put.lua
	recordPutLua    string
	recordPutScript = newScript(recordPutLua)

	//go:embed record_keep.lua
	recordKeepLua    string
	recordKeepScript = newScript(recordKeepLua)

	//go:embed record_read.lua
	recordReadLua    string
	recordReadScript = newScript(recordReadLua)

	//go:embed record_proclaim.lua
	recordProclaimLua    string
	recordProclaimScript = newScript(recordProclaimLua)
)

// recordNames are resource's lock key, its record's key and the channel
// that announces its records.
func recordNames(prefix, resource string) (lockKey, recordKey, channel string) {
	base := prefix + "{" + resource + "}"
	return base + ":lock", base + ":leader", base + ":leaders"
}

// putReply reads record_put.lua's reply on one server: 1 written (or
// already f's), 0 not held, {-1, token} a newer record.
func putReply(v any) (ok bool, newer fence.Token, err error) {
	switch v := v.(type) {
	case int64:
		return v == 1, 0, nil
	case []any:
		if len(v) == 2 {
			if s, isStr := v[1].(string); isStr {
				if n, err := strconv.ParseUint(s, 10, 64); err == nil && n > 0 {
					return false, fence.Token(n), nil
				}
			}
		}
	}
	return false, 0, fmt.Errorf("unexpected reply %v", v)
}

// readReply reads record_read.lua's reply: {value, token, holder, n}
// (n nil until a value was proclaimed), or an empty array when nobody's
// record stands.
func readReply(v any) (rec lockbackend.Record, holder string, ok bool) {
	arr, _ := v.([]any)
	if len(arr) < 3 {
		return rec, "", false
	}
	var seq uint64
	if len(arr) > 3 {
		s, _ := arr[3].(string)
		seq, _ = strconv.ParseUint(s, 10, 64)
	}
	value, _ := arr[0].(string)
	ts, _ := arr[1].(string)
	holder, _ = arr[2].(string)
	n, err := strconv.ParseUint(ts, 10, 64)
	if err != nil || n == 0 {
		return rec, "", false
	}
	return lockbackend.Record{Value: value, Token: fence.Token(n), Seq: seq}, holder, true
}

// parseAnnouncement reads a record's announcement, "<token> <value>", or
// "<token>.<n> <value>" for a value proclaimed within the grant.
func parseAnnouncement(payload string) (lockbackend.Record, bool) {
	tok, value, ok := strings.Cut(payload, " ")
	tok, seqs, proclaimed := strings.Cut(tok, ".")
	n, err := strconv.ParseUint(tok, 10, 64)
	if !ok || err != nil || n == 0 {
		return lockbackend.Record{}, false
	}
	var seq uint64
	if proclaimed {
		if seq, err = strconv.ParseUint(seqs, 10, 64); err != nil {
			return lockbackend.Record{}, false
		}
	}
	return lockbackend.Record{Value: value, Token: fence.Token(n), Seq: seq}, true
}

func (b *redisBackend) PutRecord(ctx context.Context, f fence.Fence, value string, linger time.Duration) error {
	lk, rk, ch := recordNames(b.prefix, f.Resource)
	v, err := b.script(ctx, nil, b.recordPut(), []string{lk, rk},
		f.Holder, strconv.FormatUint(uint64(f.Token), 10), value, linger.Milliseconds(), ch, b.sharded).Result()
	if err != nil {
		return translate(ctx, err, "record", f.Resource)
	}
	ok, newer, err := putReply(v)
	switch {
	case err != nil:
		return fmt.Errorf("lock: record %q: %w", f.Resource, err)
	case newer > 0:
		return &lockbackend.NewerRecordError{Resource: f.Resource, Token: newer}
	case !ok:
		return ErrNotHeld
	}
	return nil
}

func (b *redisBackend) KeepRecord(ctx context.Context, f fence.Fence, linger time.Duration) error {
	lk, rk, _ := recordNames(b.prefix, f.Resource)
	n, err := b.script(ctx, nil, recordKeepScript, []string{lk, rk}, f.Holder, linger.Milliseconds()).Int64()
	if err != nil {
		return translate(ctx, err, "keep record", f.Resource)
	}
	if n != 1 {
		return ErrNotHeld
	}
	return nil
}

func (b *redisBackend) ProclaimRecord(ctx context.Context, f fence.Fence, value string) error {
	lk, rk, ch := recordNames(b.prefix, f.Resource)
	n, err := b.script(ctx, nil, recordProclaimScript, []string{lk, rk},
		f.Holder, strconv.FormatUint(uint64(f.Token), 10), value, ch, b.sharded).Int64()
	if err != nil {
		return translate(ctx, err, "proclaim", f.Resource)
	}
	if n != 1 {
		return ErrNotHeld
	}
	return nil
}

func (b *redisBackend) ReadRecord(ctx context.Context, resource string) (lockbackend.Record, error) {
	lk, rk, _ := recordNames(b.prefix, resource)
	v, err := b.script(ctx, nil, recordReadScript, []string{lk, rk}).Result()
	if err != nil {
		return lockbackend.Record{}, translate(ctx, err, "read record", resource)
	}
	rec, _, ok := readReply(v)
	if !ok {
		return lockbackend.Record{}, lockbackend.ErrNoRecord
	}
	return rec, nil
}

func (b *redisBackend) WatchRecord(ctx context.Context, resource string) <-chan lockbackend.Record {
	_, _, ch := recordNames(b.prefix, resource)
	return watchRecords(ctx, []Client{b.client}, ch)
}

// watchRecords listens to channel on every client and sends each
// announcement until ctx ends, then closes the channel: the record it
// names, or with several clients (one node's announcement is not a
// quorum's) a zero Record.
func watchRecords(ctx context.Context, clients []Client, channel string) <-chan lockbackend.Record {
	out := make(chan lockbackend.Record, 64)
	var heard []<-chan string
	for _, c := range clients {
		heard = append(heard, c.Listen(ctx, channel))
	}
	go func() {
		defer close(out)
		msgs := make(chan string)
		for _, ch := range heard {
			go func() {
				for p := range ch {
					select {
					case msgs <- p:
					case <-ctx.Done():
						return
					}
				}
			}()
		}
		for {
			select {
			case <-ctx.Done():
				return
			case p := <-msgs:
				var rec lockbackend.Record
				if len(clients) == 1 {
					var ok bool
					if rec, ok = parseAnnouncement(p); !ok {
						continue
					}
				}
				select {
				case out <- rec:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}

// recordPut is the script PutRecord runs: record_put.lua, or the variant a
// test's control put in its place (UseRecordPut).
func (b *redisBackend) recordPut() *script {
	if p := b.putScript.Load(); p != nil {
		return p
	}
	return recordPutScript
}

// UseRecordPut makes this backend write records with src instead of
// record_put.lua, and returns its hash; RecordPutHash returns the hash of
// the script in use, and RecordPutSource record_put.lua's source. They are
// for the election model's broken variants only (reached through the
// backend, since the backend's type is not exported) and change nothing
// else.
func (b *redisBackend) UseRecordPut(src string) string {
	sc := newScript(src)
	b.putScript.Store(sc)
	return sc.Hash()
}

func (b *redisBackend) RecordPutHash() string { return b.recordPut().Hash() }

func (b *redisBackend) RecordPutSource() string { return recordPutLua }

var _ lockbackend.Proclaimer = (*redisBackend)(nil)
