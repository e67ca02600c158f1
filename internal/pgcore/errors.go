package pgcore

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/sqlguard"
)

// SQLSTATE codes the adapters interpret.
const (
	CodeSerializationFailure = "40001"
	CodeDeadlockDetected     = "40P01"
	CodeUndefinedTable       = "42P01"
	CodeUndefinedFunction    = "42883"
	CodeUndefinedColumn      = "42703"
	// CodeStale is what fencekit_guard_admit raises for a stale fence.
	CodeStale = "FK001"
)

// ServerError is a PostgreSQL error reply, read from whichever driver
// returned it.
type ServerError struct {
	// Code is the SQLSTATE.
	Code string
	// Message is the primary message.
	Message string
	// Detail is the reply's DETAIL, where the driver keeps it (pgx's
	// PgError and lib/pq's Error do).
	Detail string
	// Final is true for a reply of severity FATAL or PANIC: the server ended
	// the session, which says nothing about what it had committed (a backend
	// terminated while COMMIT waits for a synchronous standby has committed
	// locally). An ERROR reply aborts the statement and its transaction.
	Final bool
}

// sqlStater is a server error of a driver other than pgx (lib/pq's
// *pq.Error has these methods).
type sqlStater interface {
	error
	SQLState() string
}

type fataler interface{ Fatal() bool }

// AsServerError finds a server error reply in err's chain: pgx's
// *pgconn.PgError, or any error with a SQLState method (lib/pq's *pq.Error,
// whose Fatal method then gives the severity).
func AsServerError(err error) (ServerError, bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		sev := pgErr.SeverityUnlocalized
		if sev == "" {
			sev = pgErr.Severity
		}
		return ServerError{Code: pgErr.Code, Message: pgErr.Message, Detail: pgErr.Detail, Final: sev == "FATAL" || sev == "PANIC"}, true
	}
	var st sqlStater
	if errors.As(err, &st) && st.SQLState() != "" {
		s := ServerError{Code: st.SQLState(), Message: st.Error(), Detail: detailField(st)}
		if f, ok := st.(fataler); ok {
			s.Final = f.Fatal()
		}
		return s, true
	}
	return ServerError{}, false
}

// detailField is the string field Detail of the struct err points to
// (lib/pq's *pq.Error keeps the reply's DETAIL there, with no method to
// read it by), or "".
func detailField(err error) string {
	v := reflect.ValueOf(err)
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return ""
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return ""
	}
	if f := v.FieldByName("Detail"); f.IsValid() && f.Kind() == reflect.String {
		return f.String()
	}
	return ""
}

// StaleMark reads the mark that a refusal of fencekit_guard_admit (SQLSTATE
// CodeStale) carries in its DETAIL, a JSON object {"token": <bigint>,
// "holder": <text>}, as the mark of resource.
func StaleMark(resource, detail string) (fence.Fence, error) {
	var mark struct {
		Token  int64  `json:"token"`
		Holder string `json:"holder"`
	}
	if err := json.Unmarshal([]byte(detail), &mark); err != nil {
		return fence.Fence{}, fmt.Errorf("unreadable mark %q: %w", detail, err)
	}
	return fence.Fence{Resource: resource, Token: fence.Token(mark.Token), Holder: mark.Holder}, nil
}

// Retryable reports whether code aborted a transaction that running again
// may commit: a serialization failure or a deadlock.
func Retryable(code string) bool {
	return code == CodeSerializationFailure || code == CodeDeadlockDetected
}

// MissingOwnObject reports whether s says that one of fencekit's own tables
// or functions is missing from the search_path (and not one of the
// caller's).
func MissingOwnObject(s ServerError) bool {
	return (s.Code == CodeUndefinedTable || s.Code == CodeUndefinedFunction) && NamesOwnObject(s.Message)
}

// ownObjects are the tables and functions the migrations create.
var ownObjects = [...]string{"fencekit_guard", "fencekit_guard_admit", "fencekit_guard_try", "fencekit_guard_judge", "fencekit_once"}

// NamesOwnObject reports whether msg, a server error's message, names one of
// fencekit's own objects as a whole identifier (so fencekit_guard does not
// match within fencekit_guard_x or my_fencekit_guard). The name is inserted
// into the message verbatim whatever the server's language.
func NamesOwnObject(msg string) bool {
	for _, name := range ownObjects {
		for i := 0; ; {
			j := strings.Index(msg[i:], name)
			if j < 0 {
				break
			}
			start, end := i+j, i+j+len(name)
			if (start == 0 || !identByte(msg[start-1])) && (end == len(msg) || !identByte(msg[end])) {
				return true
			}
			i = start + 1
		}
	}
	return false
}

// identByte reports whether b can continue an unquoted SQL identifier.
func identByte(b byte) bool {
	return b == '_' || b == '$' || b >= 0x80 || 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9'
}

// EncodeRefused reports whether err, or an error it wraps, is pgx's refusal
// to encode an argument. pgx encodes every argument of a statement before
// it sends the statement's execution (under the simple protocol, before it
// sends anything; with a statement cache it may have prepared the
// statement, which runs nothing), so a write refused this way was never
// applied: its outcome is known. pgx gives these errors no type of their
// own: their messages start "failed to encode args[" (the extended
// protocol) or "unable to encode " (the value's own, alone under the simple
// protocol). A test through each query mode keeps the match honest.
func EncodeRefused(err error) bool {
	return sqlguard.InChain(err, func(e error) bool {
		m := e.Error()
		return strings.HasPrefix(m, "failed to encode args[") || strings.HasPrefix(m, "unable to encode ")
	})
}

// MigrationNote names the migration that creates the object msg (a server
// error's message) reports missing, when a database migrated by an earlier
// release lacks it: "; migration 00005 adds fencekit_guard_try", or "" for
// objects every release's migrations create.
func MigrationNote(msg string) string {
	if strings.Contains(msg, "fencekit_guard_try") {
		return "; migration 00005 adds fencekit_guard_try"
	}
	if strings.Contains(msg, "fencekit_guard_judge") {
		return "; migration 00009 adds fencekit_guard_judge"
	}
	return ""
}
