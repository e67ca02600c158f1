package sqlguard

import (
	"strconv"
	"testing"
)

// TestStatementsBound: Keep keeps the first value for a key, and no more
// than maxKept values; KeyOf tells every field and column apart and gives
// no key past KeyCols columns.
func TestStatementsBound(t *testing.T) {
	var s Statements[int]
	col := func(c string) string { return c }
	key := func(name string) StmtKey {
		k, ok := KeyOf(1, "", name, "id", "", "", "", []string{"a"}, col)
		if !ok {
			t.Fatal("no key for one column")
		}
		return k
	}
	s.Keep(key("t0"), 1)
	s.Keep(key("t0"), 2)
	if v, ok := s.Load(key("t0")); !ok || v != 1 {
		t.Fatalf("Load = %d, %v; want the first value kept, 1", v, ok)
	}
	for i := range maxKept + 10 {
		s.Keep(key("t"+strconv.Itoa(i)), i)
	}
	if s.Len() != maxKept {
		t.Fatalf("%d values kept, want at most %d", s.Len(), maxKept)
	}
	if _, ok := s.Load(key("t" + strconv.Itoa(maxKept+5))); ok {
		t.Fatal("a value past the bound was kept")
	}
	base, _ := KeyOf(1, "s", "n", "k", "t", "h", "v", []string{"a", "b"}, col)
	for name, other := range map[string]func() (StmtKey, bool){
		"op":      func() (StmtKey, bool) { return KeyOf(2, "s", "n", "k", "t", "h", "v", []string{"a", "b"}, col) },
		"space":   func() (StmtKey, bool) { return KeyOf(1, "", "n", "k", "t", "h", "v", []string{"a", "b"}, col) },
		"name":    func() (StmtKey, bool) { return KeyOf(1, "s", "m", "k", "t", "h", "v", []string{"a", "b"}, col) },
		"key":     func() (StmtKey, bool) { return KeyOf(1, "s", "n", "K", "t", "h", "v", []string{"a", "b"}, col) },
		"token":   func() (StmtKey, bool) { return KeyOf(1, "s", "n", "k", "T", "h", "v", []string{"a", "b"}, col) },
		"holder":  func() (StmtKey, bool) { return KeyOf(1, "s", "n", "k", "t", "H", "v", []string{"a", "b"}, col) },
		"version": func() (StmtKey, bool) { return KeyOf(1, "s", "n", "k", "t", "h", "V", []string{"a", "b"}, col) },
		"columns": func() (StmtKey, bool) { return KeyOf(1, "s", "n", "k", "t", "h", "v", []string{"b", "a"}, col) },
		"fewer":   func() (StmtKey, bool) { return KeyOf(1, "s", "n", "k", "t", "h", "v", []string{"a"}, col) },
	} {
		if k, ok := other(); !ok || k == base {
			t.Errorf("%s: the same key as another call's (%v)", name, ok)
		}
	}
	one, _ := KeyOf(1, "", "n", "k", "", "", "", []string{"a"}, col)
	if two, _ := KeyOf(1, "", "n", "k", "", "", "", []string{"a", ""}, col); one == two {
		t.Error("one column and the same with an empty second: the same key")
	}
	if _, ok := KeyOf(1, "", "n", "k", "", "", "", make([]string, KeyCols+1), col); ok {
		t.Fatalf("a key for %d columns", KeyCols+1)
	}
}
