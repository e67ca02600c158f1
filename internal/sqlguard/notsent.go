package sqlguard

import "strings"

// ArgumentRefused reports whether err, or an error it wraps, is
// database/sql's refusal to convert an argument for the driver. database/sql
// converts every argument before it hands the statement to the driver, so a
// statement refused this way was never sent and changed nothing: its
// outcome is known. database/sql gives the error no type of its own; its
// message starts "sql: converting argument", and a test against each
// driver keeps the match honest.
func ArgumentRefused(err error) bool {
	return InChain(err, func(e error) bool { return strings.HasPrefix(e.Error(), "sql: converting argument ") })
}

// InChain reports whether match holds for err or for any error in the tree
// that err wraps (through Unwrap() error and Unwrap() []error).
func InChain(err error, match func(error) bool) bool {
	for err != nil {
		if match(err) {
			return true
		}
		switch e := err.(type) {
		case interface{ Unwrap() error }:
			err = e.Unwrap()
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				if InChain(inner, match) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}
