package fencekit_test

import (
	"bufio"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestREADMEIsAGuide keeps the README a front door: the two commands a
// newcomer needs in its first lines, the guide to choosing a call near the
// top, everything else in docs/ behind links that resolve.
func TestREADMEIsAGuide(t *testing.T) {
	f, err := os.Open("README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(lines) > 400 {
		t.Errorf("README.md has %d lines; keep it at most 400 and move reference material to docs/", len(lines))
	}
	head := strings.Join(lines[:min(8, len(lines))], "\n")
	for _, want := range []string{"go run ./examples/lostupdate", "go test -race -count=1 ./... ./examples/... ./internal/integration/..."} {
		if !strings.Contains(head, want) {
			t.Errorf("README.md's first lines do not give %q", want)
		}
	}
	which := -1
	for i, l := range lines {
		if strings.HasPrefix(l, "## Which ") {
			which = i + 1
			break
		}
	}
	if which < 0 || which > 120 {
		t.Errorf("README.md's guide to choosing (a section headed \"## Which ...\") is at line %d; it must start within the first 120 lines", which)
	}
	// Every relative link of the README and of docs/ names a file that exists.
	link := regexp.MustCompile(`\]\(([^)#:]+)(#[^)]*)?\)`)
	files := []string{"README.md"}
	docs, _ := os.ReadDir("docs")
	for _, d := range docs {
		files = append(files, "docs/"+d.Name())
	}
	for _, name := range files {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		dir := "."
		if strings.HasPrefix(name, "docs/") {
			dir = "docs"
		}
		for _, m := range link.FindAllStringSubmatch(string(src), -1) {
			if _, err := os.Stat(dir + "/" + m[1]); err != nil {
				t.Errorf("%s links to %s, which does not exist", name, m[1])
			}
		}
	}
}
