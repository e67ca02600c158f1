package fence

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits that every lock and store of this module applies, so that a fence one
// of them accepts is one the others accept too.
const (
	// MaxToken is the largest token a lock of this module issues: 2^53 - 1.
	// Lua scripts hold numbers as doubles, which are exact only up to 2^53,
	// so an issuer at this limit fails with an error instead of repeating a
	// token. Stores admit any positive int64, so fences from other issuers
	// keep working.
	MaxToken Token = 1<<53 - 1

	// MaxResourceLen is the longest resource name, in bytes, that locks and
	// stores accept. It keeps a resource well inside PostgreSQL's btree index
	// row limit (about 2.7 KB), so the guard table can always index it.
	MaxResourceLen = 1024
)

// Token is a fencing token: it strictly increases with every new grant of a
// resource's lock. The zero Token means "no token"; grants start at 1.
type Token int64

// String returns the token in decimal.
func (t Token) String() string { return strconv.FormatInt(int64(t), 10) }

// Fence is what a lock holder presents to storage: the resource it holds, the
// token of its grant and the holder id of its grant. Re-entering or extending a
// lease keeps its fence.
//
// A store's high-water mark is also expressed as a Fence: the newest fence it
// has admitted for a resource. The zero mark (Token 0) admits any valid fence.
type Fence struct {
	Resource string
	Token    Token
	Holder   string
}

// String formats the fence for logs and errors. The holder id, which is the
// secret that releases a lock, appears only as its [HolderMark].
func (f Fence) String() string {
	return fmt.Sprintf("%q token=%d holder=%s", f.Resource, f.Token, HolderMark(f.Holder))
}

// HolderMark returns a short mark of a holder id that logs, errors and traces
// may carry: "#" and the first 8 hex digits of its SHA-256, or "-" for an
// empty holder. Two fences with the same mark almost surely have the same
// holder; the mark does not reveal the id, which releases and extends a lock.
func HolderMark(holder string) string {
	if holder == "" {
		return "-"
	}
	sum := sha256.Sum256([]byte(holder))
	return "#" + hex.EncodeToString(sum[:4])
}

// Validate reports whether f can be presented to storage: a resource of 1 to
// [MaxResourceLen] bytes, a token of at least 1 and a non-empty holder, both
// strings valid UTF-8 without NUL bytes (every store must be able to keep
// them; PostgreSQL's text type refuses NUL and invalid UTF-8). The error
// matches [ErrInvalid].
//
// The zero Fence gets an error of its own: it is what a caller holds after
// ignoring the error of the call that should have produced the fence.
func (f Fence) Validate() error {
	switch {
	case f == Fence{}:
		return fmt.Errorf("%w: zero Fence: was an error from Acquire or FenceLock ignored?", errInvalidFence)
	case f.Resource == "":
		return fmt.Errorf("%w: empty resource", errInvalidFence)
	case len(f.Resource) > MaxResourceLen:
		return fmt.Errorf("%w: resource of %d bytes is longer than %d", errInvalidFence, len(f.Resource), MaxResourceLen)
	case !storable(f.Resource):
		return fmt.Errorf("%w: resource %q is not valid UTF-8 or holds a NUL byte", errInvalidFence, f.Resource)
	case !storable(f.Holder):
		return fmt.Errorf("%w: holder %q for %q is not valid UTF-8 or holds a NUL byte", errInvalidFence, f.Holder, f.Resource)
	case f.Token < 1:
		return fmt.Errorf("%w: token %d for %q is below 1", errInvalidFence, f.Token, f.Resource)
	case f.Holder == "":
		return fmt.Errorf("%w: empty holder for %q", errInvalidFence, f.Resource)
	}
	return nil
}

func storable(s string) bool { return utf8.ValidString(s) && !strings.Contains(s, "\x00") }

// Admits reports whether a store whose high-water mark is hwm admits an
// operation carrying f: f's token is newer than the mark, or it is the mark's
// own token presented by the mark's own holder.
//
// This is the rule every storage adapter applies atomically with the
// operation; it is exported so that other stores can apply the same rule.
func Admits(hwm, f Fence) bool {
	return f.Token > hwm.Token || (f.Token == hwm.Token && f.Holder == hwm.Holder)
}

// NewHolder returns a fresh holder id: 128 bits from crypto/rand, as 32
// lowercase hex digits. Locks call it once per grant.
func NewHolder() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b[:])
}
