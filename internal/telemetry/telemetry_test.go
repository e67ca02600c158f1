package telemetry

import (
	"testing"
	"unicode/utf8"
)

func TestSanitize(t *testing.T) {
	tests := []struct{ in, want string }{
		{"", ""},
		{"plain", "plain"},
		{"{user42}:cart", "{user42}:cart"},
		{"héllo ✓", "héllo ✓"},
		{"a\xffb", `a\xffb`},
		{"\xff\xfe", `\xff\xfe`},
		{"ok\xe2\x82", `ok\xe2\x82`}, // a sequence cut short
		{"é\xc3", `é\xc3`},
	}
	for _, tt := range tests {
		got := Sanitize(tt.in)
		if got != tt.want || !utf8.ValidString(got) {
			t.Errorf("Sanitize(%q) = %q; want %q, valid UTF-8", tt.in, got, tt.want)
		}
	}
	if String(KeyKey, "a\x00\xff").Value.AsString() != `a`+"\x00"+`\xff` {
		t.Errorf("String does not sanitize its value")
	}
}
