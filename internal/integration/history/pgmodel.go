package history

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// PostgreSQL guard operations, as the model knows them: calls on one row of
// a table whose rows carry a value, a version and a row-level mark, guarded
// by the guard table's mark of the row's resource.
const (
	PgRead    = "read"    // a plain SELECT of the row and of its resource's guard mark
	PgTxRMW   = "txrmw"   // InTx: guard, SELECT ... FOR UPDATE, UPDATE value and version
	PgTxRead  = "txread"  // InTx: guard, SELECT ... FOR SHARE
	PgQuery   = "query"   // Query: guard and SELECT ... FOR SHARE in one batch
	PgExec    = "exec"    // Exec: guard and UPDATE value and version in one batch
	PgRowUpd  = "rowupd"  // Table.Update: the row's own mark admits, then sets the value (not the version)
	PgRowMark = "rowmark" // Table.Update without values: raises the row's own mark
	PgUV      = "uv"      // Table.UpdateVersion: sets the value if the version is as read, and bumps it
	PgOnce    = "once"    // Once: guard, then, unless the work's key is done, the work (as exec) and its record
)

// PgOnceKeys is how many keys of work a row has for Once: PgIn.Once is one
// of 1 to PgOnceKeys.
const PgOnceKeys = 15

// Aborted is a call that PostgreSQL rolled back for a reason a retry may
// cure (ErrRetryable): nothing changed.
const Aborted = "aborted"

// PgIn is one call on one row.
type PgIn struct {
	Key      string
	Op       string
	Fence    Mark
	Expected int64 // uv
	Data     string
	Once     int    // once: the key of the work, 1 to PgOnceKeys
	Attack   string // an adversarial call: what it offers (the Attack constants), "" for an honest one
}

// PgOut is what a call returned.
type PgOut struct {
	Status  string
	Data    string // ok of read, txrmw (the value it read), txread, query
	Version int64  // ok of read, txrmw (the version it read), txread, query, uv (the new version); conflict: the version found
	Guard   Mark   // read: the guard mark; stale of a guarded call: the mark it lost to
	Row     Mark   // read: the row's mark; stale of rowupd and rowmark: the mark it lost to
	Ran     bool   // ok of once: whether the work ran (false: its key was done already)
}

// PgState is one row and its resource's guard mark.
type PgState struct {
	Data    string
	Version int64
	Guard   Mark
	Row     Mark
	Done    uint16 // bit i: Once's key i is done
}

func pgApply(s PgState, in PgIn) (PgState, PgOut) {
	n := s
	switch in.Op {
	case PgRead:
		return s, PgOut{Status: Ok, Data: s.Data, Version: s.Version, Guard: s.Guard, Row: s.Row}
	case PgUV:
		if s.Version != in.Expected {
			return s, PgOut{Status: Conflict, Version: s.Version}
		}
		n.Data, n.Version = in.Data, s.Version+1
		return n, PgOut{Status: Ok, Version: n.Version}
	case PgRowUpd, PgRowMark:
		if !s.Row.admits(in.Fence) {
			return s, PgOut{Status: Stale, Row: s.Row}
		}
		n.Row = in.Fence
		if in.Op == PgRowUpd {
			n.Data = in.Data
		}
		return n, PgOut{Status: Ok}
	}
	if !s.Guard.admits(in.Fence) {
		return s, PgOut{Status: Stale, Guard: s.Guard}
	}
	n.Guard = in.Fence
	switch in.Op {
	case PgTxRMW:
		n.Data, n.Version = in.Data, s.Version+1
		return n, PgOut{Status: Ok, Data: s.Data, Version: s.Version}
	case PgTxRead, PgQuery:
		return n, PgOut{Status: Ok, Data: s.Data, Version: s.Version}
	case PgExec:
		n.Data, n.Version = in.Data, s.Version+1
		return n, PgOut{Status: Ok}
	case PgOnce:
		bit := uint16(1) << in.Once
		if s.Done&bit != 0 {
			return n, PgOut{Status: Ok}
		}
		n.Data, n.Version, n.Done = in.Data, s.Version+1, s.Done|bit
		return n, PgOut{Status: Ok, Ran: true}
	}
	panic("history: unknown PostgreSQL operation " + in.Op)
}

// PgModel is a row under the PostgreSQL guards: a value with a version,
// fenced by its resource's guard mark and by its own row mark, which know
// nothing of each other. A refused or aborted call changes nothing; an open
// call may have been applied, or not.
var PgModel = porcupine.NondeterministicModel{
	Partition: partitionBy(func(in any) string { return in.(PgIn).Key }),
	Init:      func() []any { return []any{PgState{}} },
	Step: func(state, input, output any) []any {
		s, in, out := state.(PgState), input.(PgIn), output.(PgOut)
		n, want := pgApply(s, in)
		switch out.Status {
		case Unknown:
			if n == s {
				return []any{s}
			}
			return []any{s, n}
		case Aborted:
			return []any{s}
		case Failed:
			// A Once that the server refused with an error of its own
			// changed nothing. It is legal only where the work would have
			// run (the fence admitted, the key not done): a Once on a done
			// key must report done, never fail.
			if in.Op == PgOnce && !want.Ran {
				return nil
			}
			return []any{s}
		}
		if out != want {
			return nil
		}
		return []any{n}
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(PgIn), output.(PgOut)
		call := in.Op
		switch in.Op {
		case PgRead:
			call += "()"
		case PgUV:
			call += fmt.Sprintf("(v%d, %s)", in.Expected, in.Data)
		case PgTxRead, PgQuery, PgRowMark:
			call += fmt.Sprintf("[%v]()", in.Fence)
		case PgOnce:
			call += fmt.Sprintf("[%v](#%d, %s)", in.Fence, in.Once, in.Data)
		default:
			call += fmt.Sprintf("[%v](%s)", in.Fence, in.Data)
		}
		if in.Attack != "" {
			call += " {" + in.Attack + "}"
		}
		switch out.Status {
		case Ok:
			if in.Op == PgOnce {
				return call + fmt.Sprintf(" -> ok, ran %v", out.Ran)
			}
			return call + fmt.Sprintf(" -> ok %q v%d guard %v row %v", out.Data, out.Version, out.Guard, out.Row)
		case Stale:
			return call + fmt.Sprintf(" -> stale, guard %v row %v", out.Guard, out.Row)
		case Conflict:
			return call + fmt.Sprintf(" -> conflict v%d", out.Version)
		}
		return call + " -> " + out.Status
	},
	DescribeState: func(state any) string {
		s := state.(PgState)
		return fmt.Sprintf("%q v%d guard %v row %v done %b", s.Data, s.Version, s.Guard, s.Row, s.Done)
	},
}

// PgKinds is what one call of a PostgreSQL (or other SQL guard) history
// counts for: its operation, when it returned a definite answer; its
// refusal, conflict or abort; an open call, which the checker places; what
// a Once found; an attack, when it was answered.
func PgKinds(op porcupine.Operation) []string {
	in, out := op.Input.(PgIn), op.Output.(PgOut)
	if out.Status == Unknown {
		return []string{"open placed"}
	}
	k := []string{in.Op}
	switch out.Status {
	case Stale:
		k = append(k, "stale refused")
	case Conflict:
		k = append(k, "conflict")
	case Aborted:
		k = append(k, "aborted")
	case Failed:
		k = append(k, "once failed")
	case Ok:
		if in.Op == PgOnce && out.Ran {
			k = append(k, "once ran")
		} else if in.Op == PgOnce {
			k = append(k, "once done already")
		}
	}
	if in.Attack != "" {
		k = append(k, "attack "+in.Attack)
	}
	return k
}
