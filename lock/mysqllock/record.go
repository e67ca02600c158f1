package mysqllock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/lockbackend"
	"github.com/fencekit/fencekit/lock"
)

// watchEvery is how often a record's watcher reads it: MySQL has no
// notifications, so a watch is a read of one row by its key, four times a
// second while someone watches.
const watchEvery = 250 * time.Millisecond

// checkRecord refuses a fence or a value the record cannot take, before
// anything is sent.
func checkRecord(ctx context.Context, op string, f fence.Fence, value *string) error {
	if err := checkArgs(ctx, op, f.Resource, f.Holder, 0, false); err != nil {
		return err
	}
	if f.Token < 1 || f.Token > fence.MaxToken {
		return invalid("%s %q: token %d out of range", op, f.Resource, f.Token)
	}
	if value != nil && (!utf8.ValidString(*value) || strings.ContainsRune(*value, 0)) {
		return invalid("%s %q: value is not valid UTF-8 or holds a NUL byte", op, f.Resource)
	}
	return nil
}

// PutRecord writes value as f's record while f's grant holds the lock.
func (b *backend) PutRecord(ctx context.Context, f fence.Fence, value string, linger time.Duration) error {
	if err := checkRecord(ctx, "PutRecord", f, &value); err != nil {
		return err
	}
	if b.onRecord != nil {
		b.onRecord()
	}
	var r sql.NullInt64
	err := b.call(ctx, callSQL(setRecordProc, f.Resource, f.Holder, int64(f.Token), value, ms(linger)), &r)
	if err != nil {
		return unknown(ctx, translate(ctx, "PutRecord", f.Resource, err))
	}
	switch {
	case r.Int64 == 1:
		return nil
	case r.Int64 < 0:
		return &lockbackend.NewerRecordError{Resource: f.Resource, Token: fence.Token(-r.Int64)}
	}
	return fmt.Errorf("mysqllock: PutRecord %q: %w", f.Resource, lock.ErrNotHeld)
}

// KeepRecord keeps f's record as long as its lock and linger more.
func (b *backend) KeepRecord(ctx context.Context, f fence.Fence, linger time.Duration) error {
	if err := checkRecord(ctx, "KeepRecord", f, nil); err != nil {
		return err
	}
	var kept sql.NullInt64
	if err := b.call(ctx, callSQL(keepProc, f.Resource, f.Holder, int64(f.Token), ms(linger)), &kept); err != nil {
		return translate(ctx, "KeepRecord", f.Resource, err)
	}
	if kept.Int64 != 1 {
		return fmt.Errorf("mysqllock: KeepRecord %q: %w", f.Resource, lock.ErrNotHeld)
	}
	return nil
}

// ProclaimRecord makes value f's record's value while f's grant holds the
// lock and the record is f's, counting up its Seq.
func (b *backend) ProclaimRecord(ctx context.Context, f fence.Fence, value string) error {
	if err := checkRecord(ctx, "Proclaim", f, &value); err != nil {
		return err
	}
	var ok sql.NullInt64
	if err := b.call(ctx, callSQL(proclaimProc, f.Resource, f.Holder, int64(f.Token), value), &ok); err != nil {
		return unknown(ctx, translate(ctx, "Proclaim", f.Resource, err))
	}
	if ok.Int64 != 1 {
		return fmt.Errorf("mysqllock: Proclaim %q: %w", f.Resource, lock.ErrNotHeld)
	}
	return nil
}

// readRecord reads the record of the grant that holds resource's lock.
func (b *backend) readRecord(ctx context.Context, resource string) (lockbackend.Record, bool, error) {
	if err := checkArgs(ctx, "ReadRecord", resource, "-", 0, false); err != nil {
		return lockbackend.Record{}, false, err
	}
	var (
		value  []byte
		token  int64
		holder []byte
		seq    int64
	)
	err := b.call(ctx, callSQL(recordProc, resource), &value, &token, &holder, &seq)
	if errors.Is(err, sql.ErrNoRows) {
		return lockbackend.Record{}, false, nil
	}
	if err != nil {
		return lockbackend.Record{}, false, translate(ctx, "ReadRecord", resource, err)
	}
	return lockbackend.Record{Value: string(value), Token: fence.Token(token), Seq: uint64(seq)}, true, nil
}

// ReadRecord returns the record of the grant that holds resource's lock.
func (b *backend) ReadRecord(ctx context.Context, resource string) (lockbackend.Record, error) {
	rec, ok, err := b.readRecord(ctx, resource)
	if err != nil {
		return lockbackend.Record{}, err
	}
	if !ok {
		return lockbackend.Record{}, fmt.Errorf("mysqllock: ReadRecord %q: %w", resource, lockbackend.ErrNoRecord)
	}
	return rec, nil
}

// WatchRecord sends the records written for resource until ctx ends, as
// it reads them every watchEvery: each new (token, seq) once.
func (b *backend) WatchRecord(ctx context.Context, resource string) <-chan lockbackend.Record {
	out := make(chan lockbackend.Record, 1)
	go func() {
		defer close(out)
		var last lockbackend.Record
		first := true
		t := time.NewTicker(watchEvery)
		defer t.Stop()
		for {
			rec, ok, err := b.readRecord(ctx, resource)
			if err == nil && ok && (first || rec.Token != last.Token || rec.Seq != last.Seq) {
				if !first {
					select {
					case out <- rec:
					case <-ctx.Done():
						return
					}
				}
				last = rec
			}
			if err == nil {
				first = false
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return out
}
