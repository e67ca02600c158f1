package pgcore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestEncodeRefused: pgx's encoding refusals, however wrapped, prove that a
// statement was not sent; a server's reply and the errors of a statement
// cut off in flight do not.
func TestEncodeRefused(t *testing.T) {
	value := errors.New("unable to encode struct { X int }{X:1} into text format for unknown type (OID 0): cannot find encode plan")
	args := fmt.Errorf("failed to encode args[3]: %w", value)
	for name, c := range map[string]struct {
		err  error
		want bool
	}{
		"extended protocol": {args, true},
		"simple protocol":   {value, true},
		"wrapped":           {fmt.Errorf("pgsql: fenced update of %q: %w", "t", args), true},
		"nil":               {nil, false},
		"server error":      {&pgconn.PgError{Severity: "ERROR", Code: "22P02", Message: "unable to encode"}, false},
		"EOF":               {io.ErrUnexpectedEOF, false},
		"context":           {context.Canceled, false},
		"mentions it":       {errors.New("conn closed after: unable to encode"), false},
	} {
		if got := EncodeRefused(c.err); got != c.want {
			t.Errorf("%s: EncodeRefused(%v) = %v, want %v", name, c.err, got, c.want)
		}
	}
}
