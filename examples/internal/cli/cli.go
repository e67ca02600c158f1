// Package cli gives the examples one command-line behaviour: -h prints what
// the example shows, how to run it and its flags, and exits 0; a bad flag
// prints the same and exits 2.
package cli

import (
	"errors"
	"flag"
	"fmt"
)

// Parse sets fs's usage to name (the example's directory under examples/),
// the one line that says what it shows, and its flags, then parses args. It
// returns done when the program must exit now, with code: 0 after -h, 2 after
// a bad flag.
func Parse(fs *flag.FlagSet, name, what string, args []string) (done bool, code int) {
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "%s: %s\n\nusage: go run ./examples/%s [flags]\n\nflags:\n", name, what, name)
		fs.PrintDefaults()
	}
	switch err := fs.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		return true, 0
	case err != nil:
		return true, 2
	}
	return false, 0
}
