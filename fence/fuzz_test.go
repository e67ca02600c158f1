package fence

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// validSpec is Validate's rule, written out again from its doc.
func validSpec(f Fence) bool {
	storable := func(s string) bool { return utf8.ValidString(s) && !strings.ContainsRune(s, 0) }
	return len(f.Resource) >= 1 && len(f.Resource) <= MaxResourceLen && storable(f.Resource) &&
		f.Token >= 1 && f.Holder != "" && storable(f.Holder)
}

// FuzzValidate: Validate accepts exactly the fences its doc describes, and
// every refusal matches ErrInvalid.
func FuzzValidate(f *testing.F) {
	f.Add("r", int64(1), "h")
	f.Add("", int64(1), "h")
	f.Add("r", int64(0), "h")
	f.Add("r", int64(-1), "")
	f.Add("r\x00", int64(7), "h")
	f.Add("r", int64(7), "\xff")
	f.Add("ünï", int64(1<<53), "0123456789abcdef0123456789abcdef")
	f.Add(strings.Repeat("r", MaxResourceLen+1), int64(1), "h")
	f.Fuzz(func(t *testing.T, resource string, token int64, holder string) {
		fc := Fence{Resource: resource, Token: Token(token), Holder: holder}
		err := fc.Validate()
		if want := validSpec(fc); (err == nil) != want {
			t.Fatalf("Validate(%v) = %v, want valid=%v", fc, err, want)
		}
		if err != nil && (!errors.Is(err, errInvalidFence) || !errors.Is(err, ErrInvalid)) {
			t.Fatalf("Validate(%v) = %v, does not match ErrInvalid", fc, err)
		}
	})
}

// FuzzAdmits: Admits is the admission rule of the package doc; a mark
// admits its own fence, and whatever it admits, it admits any newer token.
func FuzzAdmits(f *testing.F) {
	f.Add(int64(0), "", int64(1), "a")
	f.Add(int64(5), "a", int64(5), "a")
	f.Add(int64(5), "a", int64(5), "b")
	f.Add(int64(5), "a", int64(4), "a")
	f.Add(int64(-9), "x", int64(-9), "x")
	f.Fuzz(func(t *testing.T, hwmToken int64, hwmHolder string, token int64, holder string) {
		hwm := Fence{Resource: "r", Token: Token(hwmToken), Holder: hwmHolder}
		fc := Fence{Resource: "r", Token: Token(token), Holder: holder}
		want := token > hwmToken || (token == hwmToken && holder == hwmHolder)
		if got := Admits(hwm, fc); got != want {
			t.Fatalf("Admits(%v, %v) = %v, want %v", hwm, fc, got, want)
		}
		if !Admits(hwm, hwm) {
			t.Fatalf("mark %v does not admit itself", hwm)
		}
		if Admits(hwm, fc) && token < 1<<62 {
			newer := Fence{Resource: "r", Token: Token(token + 1), Holder: hwmHolder + "!"}
			if !Admits(hwm, newer) {
				t.Fatalf("Admits(%v) takes %v but not the newer %v", hwm, fc, newer)
			}
		}
	})
}

// FuzzFenceString: a fence's text names its holder only by its mark, which
// is "-" for no holder and otherwise "#" and 8 hex digits, the same for the
// same holder; a token's text reads back as the token.
func FuzzFenceString(f *testing.F) {
	f.Add("r", int64(1), "0123456789abcdef0123456789abcdef")
	f.Add("", int64(-1), "")
	f.Add("\"q\"", int64(1<<53-1), "token=1")
	f.Fuzz(func(t *testing.T, resource string, token int64, holder string) {
		fc := Fence{Resource: resource, Token: Token(token), Holder: holder}
		mark := HolderMark(holder)
		if mark != HolderMark(holder) {
			t.Fatalf("HolderMark(%q) is not stable", holder)
		}
		switch {
		case holder == "":
			if mark != "-" {
				t.Fatalf("HolderMark(\"\") = %q, want -", mark)
			}
		case len(mark) != 9 || mark[0] != '#' || strings.Trim(mark[1:], "0123456789abcdef") != "":
			t.Fatalf("HolderMark(%q) = %q, want # and 8 lowercase hex digits", holder, mark)
		}
		s := fc.String()
		if !strings.HasSuffix(s, " holder="+mark) {
			t.Fatalf("%q does not end with the holder's mark %s", s, mark)
		}
		// The holder appears in the text only where the resource or the
		// mark already spell it.
		if len(holder) >= 8 && strings.Contains(s, holder) &&
			!strings.Contains(strconv.Quote(resource), holder) && !strings.Contains(mark, holder) {
			t.Fatalf("%q reveals holder %q", s, holder)
		}
		if n, err := strconv.ParseInt(fc.Token.String(), 10, 64); err != nil || n != token {
			t.Fatalf("Token(%d).String() = %q reads back as %d, %v", token, fc.Token.String(), n, err)
		}
	})
}
