package sqlguard

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/fencekit/fencekit/fence"
)

var errRetry = errors.New("test: retry it")

func testStore() *Store {
	return &Store{
		Name: "test",
		Invalid: func(format string, args ...any) error {
			return fmt.Errorf("test: %w: "+format, append([]any{fence.ErrInvalid}, args...)...)
		},
		Retryable: errRetry,
	}
}

func TestCheckCall(t *testing.T) {
	s := testStore()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	var nilPtr *strings.Builder
	for name, c := range map[string]struct {
		ctx    context.Context
		handle any
		want   error
		msg    string
	}{
		"ok":           {context.Background(), &strings.Builder{}, nil, ""},
		"nil context":  {nil, &strings.Builder{}, fence.ErrInvalid, "test: fence: invalid argument: nil context"},
		"nil handle":   {context.Background(), nil, fence.ErrInvalid, "test: fence: invalid argument: nil db"},
		"nil pointer":  {context.Background(), nilPtr, fence.ErrInvalid, "test: fence: invalid argument: nil db"},
		"context done": {done, &strings.Builder{}, context.Canceled, "test: context canceled"},
	} {
		err := s.CheckCall(c.ctx, c.handle, "db")
		if !errors.Is(err, c.want) || (err != nil && err.Error() != c.msg) || (err == nil) != (c.want == nil) {
			t.Errorf("%s: CheckCall = %v; want %v (%q)", name, err, c.want, c.msg)
		}
	}
}

func TestIsNil(t *testing.T) {
	var m map[string]int
	var f func()
	for v, want := range map[any]bool{0: false, "": false, &struct{}{}: false} {
		if IsNil(v) != want {
			t.Errorf("IsNil(%#v) = %v", v, !want)
		}
	}
	if !IsNil(nil) || !IsNil(m) || !IsNil(f) || !IsNil((*int)(nil)) {
		t.Error("IsNil missed a nil value")
	}
}

func TestSortFences(t *testing.T) {
	s := testStore()
	in := []fence.Fence{
		{Resource: "b", Token: 1, Holder: "h"},
		{Resource: "a", Token: 2, Holder: "h"},
		{Resource: "B", Token: 3, Holder: "h"},
	}
	got, err := s.SortFences(in, fence.Fence.Validate)
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Resource != "B" || got[1].Resource != "a" || got[2].Resource != "b" {
		t.Errorf("order %v; want B, a, b (byte order)", got)
	}
	if in[0].Resource != "b" {
		t.Error("SortFences reordered its argument")
	}
	for name, c := range map[string]struct {
		fences []fence.Fence
		want   error
	}{
		"none":    {nil, fence.ErrInvalid},
		"invalid": {[]fence.Fence{{Resource: "a", Token: 1, Holder: "h"}, {Resource: "", Token: 1, Holder: "h"}}, fence.ErrInvalid},
		"twice":   {[]fence.Fence{{Resource: "a", Token: 1, Holder: "h"}, {Resource: "a", Token: 2, Holder: "h"}}, fence.ErrInvalid},
	} {
		if _, err := s.SortFences(c.fences, fence.Fence.Validate); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v; want %v", name, err, c.want)
		}
	}
}

func TestRetry(t *testing.T) {
	s := testStore()
	ctx := context.Background()
	unknown := &fence.OutcomeUnknownError{Op: "test", Err: errRetry}
	conflict := &fence.ConflictError{Key: "k", Expected: 1, Actual: 2}
	for name, c := range map[string]struct {
		attempts  int
		errs      []error // fn's results, the last repeated
		wantCalls int
		want      error
	}{
		"success":          {0, []error{nil}, 1, nil},
		"retryable":        {0, []error{errRetry, errRetry, nil}, 3, nil},
		"conflict":         {0, []error{conflict, nil}, 2, nil},
		"default attempts": {0, []error{errRetry}, 10, errRetry},
		"attempts":         {3, []error{errRetry}, 3, errRetry},
		"stale":            {0, []error{fence.ErrStale}, 1, fence.ErrStale},
		"outcome unknown":  {0, []error{unknown}, 1, fence.ErrOutcomeUnknown},
		"other":            {0, []error{errors.New("other")}, 1, nil},
	} {
		calls := 0
		err := s.Retry(ctx, c.attempts, 10, func(context.Context) error {
			e := c.errs[min(calls, len(c.errs)-1)]
			calls++
			return e
		})
		if calls != c.wantCalls {
			t.Errorf("%s: %d calls; want %d", name, calls, c.wantCalls)
		}
		if c.want != nil && !errors.Is(err, c.want) || name == "other" && err == nil {
			t.Errorf("%s: err = %v; want %v", name, err, c.want)
		}
	}
	var nilCtx context.Context
	for name, call := range map[string]func() error{
		"nil context":       func() error { return s.Retry(nilCtx, 0, 10, func(context.Context) error { return nil }) },
		"nil function":      func() error { return s.Retry(ctx, 0, 10, nil) },
		"negative attempts": func() error { return s.Retry(ctx, -1, 10, func(context.Context) error { return nil }) },
	} {
		if err := call(); !errors.Is(err, fence.ErrInvalid) {
			t.Errorf("%s: err = %v; want fence.ErrInvalid", name, err)
		}
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Retry(done, 0, 10, func(context.Context) error { return nil }); !errors.Is(err, context.Canceled) || !strings.HasPrefix(err.Error(), "test: retry: ") {
		t.Errorf("ended context: err = %v", err)
	}
}

func TestCheckColumns(t *testing.T) {
	s := testStore()
	d := Dialect{
		Check: func(what, name string) error {
			if name == "" {
				return s.Invalid("empty %s", what)
			}
			return nil
		},
		Kept:  strings.ToLower,
		Clash: func(first, second, name string) error { return fmt.Errorf("clash %s %s %s", first, second, name) },
	}
	c := Columns{Key: "id", Token: "tok", Holder: "holder", Version: "version"}
	for name, tc := range map[string]struct {
		c      Columns
		values []string
		want   string // "" for no error
	}{
		"ok":                 {c, []string{"a", "b"}, ""},
		"empty key":          {Columns{Token: "t", Holder: "h", Version: "v"}, nil, "test: fence: invalid argument: empty key column"},
		"clash":              {Columns{Key: "id", Token: "ID", Holder: "h", Version: "v"}, nil, "clash key token ID"},
		"empty value":        {c, []string{"a", ""}, "test: fence: invalid argument: empty value column"},
		"value twice":        {c, []string{"a", "A"}, `test: fence: invalid argument: table "t": column "A" is set twice or is the value column`},
		"value is managed":   {c, []string{"Tok"}, `test: fence: invalid argument: table "t": column "Tok" is set twice or is the token column`},
		"managed goes first": {Columns{Key: "id", Token: "id", Holder: "h", Version: "v"}, []string{""}, "clash key token id"},
	} {
		err := s.CheckColumns("t", tc.c, tc.values, d)
		if got := fmt.Sprint(err); tc.want == "" && err != nil || tc.want != "" && got != tc.want {
			t.Errorf("%s: err = %v; want %q", name, err, tc.want)
		}
	}
}

// A retry cut short by its context names the store once, and matches both
// the context's error and the last attempt's.
func TestRetryEndedByContextNamesStoreOnce(t *testing.T) {
	s := testStore()
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := s.Retry(ctx, 10, 10, func(context.Context) error {
		calls++
		cancel()
		return fmt.Errorf("test: conflict on row 1: %w", errRetry)
	})
	if calls != 1 {
		t.Fatalf("fn ran %d times, want 1", calls)
	}
	if !errors.Is(err, context.Canceled) || !errors.Is(err, errRetry) {
		t.Fatalf("err %v matches neither context.Canceled nor the last error", err)
	}
	const want = "test: retry: context canceled (last error: conflict on row 1: test: retry it)"
	if err.Error() != want {
		t.Fatalf("err %q, want %q", err, want)
	}
}

// TestCommitOutcome: a COMMIT's outcome is known only when the error
// proves that nothing committed: database/sql's rollback for an ended
// context, or an error the adapter's notApplied recognises. A transaction
// that the caller's function ended itself, and every other error, leave
// the outcome unknown.
func TestCommitOutcome(t *testing.T) {
	errRefused := errors.New("test: the server refused COMMIT")
	errBroken := errors.New("test: connection broken")
	notApplied := func(err error) (error, bool) {
		if errors.Is(err, errRefused) {
			return fmt.Errorf("test: op: %w", err), true
		}
		return nil, false
	}
	live := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		name    string
		ctx     context.Context
		err     error
		unknown bool
		is      error
	}{
		{"committed", live, nil, false, nil},
		{"rolled back by database/sql for the ended context", ended, sql.ErrTxDone, false, context.Canceled},
		{"ended by the caller's function", live, sql.ErrTxDone, true, sql.ErrTxDone},
		{"refused by the server", live, errRefused, false, errRefused},
		{"broken connection", live, errBroken, true, errBroken},
		{"broken connection, context ended", ended, errBroken, true, errBroken},
	} {
		got := commitOutcome(c.ctx, "test: op", c.err, notApplied)
		switch {
		case c.err == nil && got != nil:
			t.Errorf("%s: %v, want nil", c.name, got)
		case c.err == nil:
		case errors.Is(got, fence.ErrOutcomeUnknown) != c.unknown:
			t.Errorf("%s: %v; want an unknown outcome %v", c.name, got, c.unknown)
		case !errors.Is(got, c.is):
			t.Errorf("%s: %v; want it to match %v", c.name, got, c.is)
		}
	}
}
