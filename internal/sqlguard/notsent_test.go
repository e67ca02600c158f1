package sqlguard

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"testing"
)

// TestArgumentRefused: only database/sql's conversion refusal, however
// wrapped, proves that a statement was not sent; errors that merely mention
// one, and the errors of a statement cut off in flight, do not.
func TestArgumentRefused(t *testing.T) {
	refused := fmt.Errorf("sql: converting argument $4 type: %w", errors.New("unsupported type struct { X int }, a struct"))
	for name, c := range map[string]struct {
		err  error
		want bool
	}{
		"refused":         {refused, true},
		"wrapped":         {fmt.Errorf("mysql: Table.Update: %w", refused), true},
		"joined":          {errors.Join(io.EOF, refused), true},
		"nil":             {nil, false},
		"bad connection":  {driver.ErrBadConn, false},
		"EOF":             {io.ErrUnexpectedEOF, false},
		"context":         {context.DeadlineExceeded, false},
		"mentions it":     {errors.New("server said: sql: converting argument"), false},
		"a user's prefix": {errors.New("sql: converting arguments failed upstream"), false},
	} {
		if got := ArgumentRefused(c.err); got != c.want {
			t.Errorf("%s: ArgumentRefused(%v) = %v, want %v", name, c.err, got, c.want)
		}
	}
}
