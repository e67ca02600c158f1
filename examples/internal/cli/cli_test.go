package cli

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		args []string
		done bool
		code int
		out  string
	}{
		{[]string{"-h"}, true, 0, "demo: shows a thing\n\nusage: go run ./examples/demo [flags]"},
		{[]string{"-nosuch"}, true, 2, "usage: go run ./examples/demo [flags]"},
		{[]string{"-n", "3"}, false, 0, ""},
	} {
		fs := flag.NewFlagSet("demo", flag.ContinueOnError)
		var out bytes.Buffer
		fs.SetOutput(&out)
		fs.Int("n", 1, "a number")
		done, code := Parse(fs, "demo", "shows a thing", tc.args)
		if done != tc.done || code != tc.code {
			t.Errorf("%v: done, code = %v, %d; want %v, %d", tc.args, done, code, tc.done, tc.code)
		}
		if !strings.Contains(out.String(), tc.out) || (tc.out == "" && out.Len() > 0) {
			t.Errorf("%v: output %q, want it to contain %q", tc.args, out.String(), tc.out)
		}
	}
}
