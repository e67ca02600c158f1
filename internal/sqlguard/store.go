package sqlguard

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"reflect"
	"sync"

	"go.opentelemetry.io/otel/trace"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/telemetry"
)

// Store is one SQL storage adapter, as the shared code needs to know it.
// Make it once per adapter, as a package-level pointer; it must not be
// copied once used.
type Store struct {
	// Name is the adapter's package name ("postgres", "mysql"): it starts
	// error messages, names the instrumentation scope (storage/Name) and is
	// the storage attribute of the rejection counter.
	Name string
	// Invalid returns the adapter's error for a call refused before
	// anything was sent; it must match fence.ErrInvalid.
	Invalid func(format string, args ...any) error
	// Retryable is the adapter's ErrRetryable.
	Retryable error
	// CommitWatchesContext, if set, reports whether db's driver ends a
	// COMMIT in flight when the context the transaction began with ends
	// (pgx's stdlib does; lib/pq and go-sql-driver/mysql wait for the
	// reply). RunTx then commits without the goroutine of [Store.Commit].
	CommitWatchesContext func(db *sql.DB) bool

	obs struct {
		once   sync.Once
		tracer trace.Tracer
		// idleTP is OpenTelemetry's default global tracer provider when
		// the tracer was taken from it (no SDK installed yet), else nil.
		idleTP     trace.TracerProvider
		rejections *telemetry.RejectionCounter
	}
}

// CheckCall refuses a nil context, a nil handle (name says which argument
// it is) or a context that is already done, before anything is sent.
func (s *Store) CheckCall(ctx context.Context, handle any, name string) error {
	if ctx == nil {
		return s.Invalid("nil context")
	}
	if IsNil(handle) {
		return s.Invalid("nil %s", name)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", s.Name, err)
	}
	return nil
}

// IsNil reports whether v is nil or an interface holding a nil pointer,
// map, slice, function or channel: a handle no call can use.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

// GuardAll is the adapters' GuardAll once the handle was checked: it sorts
// fences (see SortFences), puts them on the span of ctx and guards each in
// that order with guard, stopping at the first error.
func (s *Store) GuardAll(ctx context.Context, fences []fence.Fence, validate func(fence.Fence) error, guard func(fence.Fence) error) error {
	sorted, err := s.SortFences(fences, validate)
	if err != nil {
		return err
	}
	FencesAttrs(ctx, sorted)
	for _, f := range sorted {
		if err := guard(f); err != nil {
			return err
		}
	}
	return nil
}

// CheckKey refuses a NULL key before anything is sent: nil, a nil pointer,
// or a driver.Valuer whose value is nil (an invalid sql.Null*, pgx's null
// values). SQL NULL equals no key, and a nullable unique column holds any
// number of NULLs, so an upsert with one would insert a new row every time,
// whatever the fence: a stale one included. op names the call and table
// the table in the message.
func (s *Store) CheckKey(op, table string, key any) error {
	v := key
	if valuer, ok := key.(driver.Valuer); ok && !IsNil(key) {
		var err error
		if v, err = valuer.Value(); err != nil {
			return s.Invalid("%s on %q: key %v: %v", op, table, key, err)
		}
	}
	if IsNil(v) {
		return s.Invalid("%s on %q: NULL key: SQL NULL equals no key, and a nullable unique column holds any number of NULLs; pass the row's key", op, table)
	}
	return nil
}
