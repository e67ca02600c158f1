package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The docs' Go snippets are compiled here rather than in the fencekit module
// because some show other libraries (redsync, bsm/redislock), which this
// module requires and fencekit's go.mod must not. The test shells out to
// go build with an overlay, so nothing is written into the repository and
// every package a snippet names resolves exactly as in a user's build.

// snippetHowTo is printed with every failure: what a snippet must look like
// to compile, and where to declare what it leaves out.
const snippetHowTo = `Every ` + "```go" + ` block in a Markdown file of the repository, and every
indented code block in a Go doc comment, must compile. The errors above name
the snippet's file and line.

- A block that starts with "package" is compiled as a file of its own.
- Any other block is compiled as declarations if it parses as such, else as
  the body of
      func(ctx context.Context, locker *lock.Locker, client *redis.Client,
          pool *pgxpool.Pool, db *sql.DB, store *fkredis.Store,
          lease *lock.Lease, f fence.Fence) error
  so it may use those names, and "return err". Package names in
  snippetImports (internal/integration/docsnippets_test.go) are imported
  when used.
- A snippet that needs another name (mutex, lk, a type of the application):
  add an entry to snippetPreambles, keyed by the snippet's first line, with
  the declarations it needs. Another package: add it to snippetImports (a
  package of a module that internal/integration does not require yet: go get
  it in internal/integration, never in the root module).
- A doc comment's code block that is not Go (a shell command, SQL): start it
  with a word listed in notGoLead, or add its first word there.

Fix the snippet itself when the error is in it: a snippet that does not
compile, or drops an error (TestDocSnippetsHandleErrors), is a bug a reader
will paste.`

// snippetImports maps a package name a snippet may use to its import path.
var snippetImports = map[string]string{
	"context":    "context",
	"errors":     "errors",
	"fmt":        "fmt",
	"fs":         "io/fs",
	"io":         "io",
	"log":        "log",
	"os":         "os",
	"sql":        "database/sql",
	"strconv":    "strconv",
	"time":       "time",
	"fence":      "github.com/fencekit/fencekit/fence",
	"lock":       "github.com/fencekit/fencekit/lock",
	"pglock":     "github.com/fencekit/fencekit/lock/pglock",
	"mysqllock":  "github.com/fencekit/fencekit/lock/mysqllock",
	"migrations": "github.com/fencekit/fencekit/migrations",
	"postgres":   "github.com/fencekit/fencekit/storage/postgres",
	"fkredis":    "github.com/fencekit/fencekit/storage/redis",
	"redis":      "github.com/redis/go-redis/v9",
	"pgx":        "github.com/jackc/pgx/v5",
	"pgconn":     "github.com/jackc/pgx/v5/pgconn",
	"pgxpool":    "github.com/jackc/pgx/v5/pgxpool",
	"stdlib":     "github.com/jackc/pgx/v5/stdlib",
	"goose":      "github.com/pressly/goose/v3",
	"database":   "github.com/pressly/goose/v3/database",
	"redsync":    "github.com/go-redsync/redsync/v4",
	"goredis":    "github.com/go-redsync/redsync/v4/redis/goredis/v9",
	"redislock":  "github.com/bsm/redislock",
	"mysql":      "github.com/fencekit/fencekit/storage/mysql",
	"pgsql":      "github.com/fencekit/fencekit/storage/pgsql",
	"election":   "github.com/fencekit/fencekit/election",
	"gorm":       "gorm.io/gorm",
	"sqlx":       "github.com/jmoiron/sqlx",
	"etcdlock":   "github.com/fencekit/fencekit/lock/etcdlock",
	"clientv3":   "go.etcd.io/etcd/client/v3",
}

// snippetParams are the names every fragment may use without declaring them.
const snippetParams = `ctx context.Context, locker *lock.Locker, client *redis.Client, pool *pgxpool.Pool, db *sql.DB, store *fkredis.Store, lease *lock.Lease, f fence.Fence`

// snippetPreambles declares, per snippet (keyed by its first line, trimmed),
// the names it uses beyond snippetParams. They are statements placed before
// the snippet in its function.
var snippetPreambles = map[string]string{
	// README, Coming from redsync or redislock.
	`f, err := locker.FenceLock(ctx, mutex.Name(), mutex.Value()) // redsync, after mutex.Lock()`: `var mutex *redsync.Mutex`,
	// README, An ORM on database/sql: a GORM session on InTx's transaction.
	`return pgsql.InTx(ctx, db, nil, f, func(ctx context.Context, tx *sql.Tx) error { // db is gdb's *sql.DB`: `var gdb *gorm.DB
type Account struct{ ID, Balance int64 }
var id, amount int64`,
	// docs/recipes.md, MySQL: GORM and sqlx transactions.
	`err := gdb.WithContext(ctx).Transaction(func(tx *gorm.DB) error { // the outermost one, not a nested one`: `var gdb *gorm.DB
var dbx *sqlx.DB
type Account struct{ ID, Balance int64 }
var id, amount int64`,
}

// notGoLead lists the first words of doc-comment code blocks that are not Go
// (blocks that use × or − are formulas, and are skipped too):
// commands (the "go" command only with a subcommand after it) and SQL.
var notGoLead = []string{
	"go build", "go run", "go test", "go get", "go install", "go vet", "go mod", "go list", "go work",
	"goose", "psql", "redis-cli", "redis-server", "docker", "curl", "$",
	"SELECT", "INSERT", "UPDATE", "DELETE", "CREATE", "ALTER", "DROP", "WITH", "BEGIN",
}

// snippet is one code block found in the docs.
type snippet struct {
	file string // relative to the repository root, slash-separated
	line int    // of the block's first line
	code string
}

func (s snippet) String() string { return fmt.Sprintf("%s:%d", s.file, s.line) }

func (s snippet) firstLine() string {
	first, _, _ := strings.Cut(s.code, "\n")
	return strings.TrimSpace(first)
}

// markdownSnippets returns the ```go blocks of a Markdown file.
func markdownSnippets(file string, src []byte) []snippet {
	var out []snippet
	var cur *snippet
	var indent string
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimLeft(line, " \t")
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```go") && strings.TrimSpace(trimmed[len("```go"):]) == "":
			indent = line[:len(line)-len(trimmed)]
			cur = &snippet{file: file, line: n + 1}
		case cur != nil && strings.HasPrefix(trimmed, "```"):
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.code += strings.TrimPrefix(line, indent) + "\n"
		}
	}
	return out
}

// docSnippets returns the code blocks of a Go file's doc comments (the
// package's and its declarations'), skipping those that notGoLead marks as
// not Go.
func docSnippets(fset *token.FileSet, file string, f *ast.File) []snippet {
	var groups []*ast.CommentGroup
	ast.Inspect(f, func(n ast.Node) bool {
		var doc *ast.CommentGroup
		switch n := n.(type) {
		case *ast.File:
			doc = n.Doc
		case *ast.FuncDecl:
			doc = n.Doc
		case *ast.GenDecl:
			doc = n.Doc
		case *ast.TypeSpec:
			doc = n.Doc
		case *ast.ValueSpec:
			doc = n.Doc
		case *ast.Field:
			doc = n.Doc
		}
		if doc != nil {
			groups = append(groups, doc)
		}
		return true
	})
	var out []snippet
	var p comment.Parser
	for _, g := range groups {
		doc := p.Parse(g.Text())
		from := 0 // index in g.List to search from, so equal blocks get their own lines
		for _, b := range doc.Content {
			code, ok := b.(*comment.Code)
			if !ok || notGo(code.Text) {
				continue
			}
			first, _, _ := strings.Cut(code.Text, "\n")
			line := fset.Position(g.Pos()).Line
			for i := from; i < len(g.List); i++ {
				text := strings.TrimPrefix(g.List[i].Text, "//")
				if strings.TrimSpace(text) == strings.TrimSpace(first) && strings.TrimSpace(first) != "" {
					line, from = fset.Position(g.List[i].Pos()).Line, i+1
					break
				}
			}
			out = append(out, snippet{file: file, line: line, code: code.Text})
		}
	}
	return out
}

func notGo(code string) bool {
	first := strings.TrimSpace(code)
	if strings.ContainsAny(first, "×−") {
		return true // a formula, in the notation of arithmetic (× and −), not Go
	}
	for _, lead := range notGoLead {
		if first == lead || strings.HasPrefix(first, lead+" ") || strings.HasPrefix(first, lead+"\t") {
			return true
		}
	}
	return false
}

// repoSnippets walks the repository from root for the snippets of every
// Markdown file and every non-test Go file.
func repoSnippets(t *testing.T, root string) []snippet {
	t.Helper()
	var out []snippet
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasSuffix(path, ".md"):
			src, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			out = append(out, markdownSnippets(rel, src)...)
		case strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go"):
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
			if err != nil {
				return err
			}
			out = append(out, docSnippets(fset, rel, f)...)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// importsFor returns the import block for the package names that the parsed
// code uses as the left side of a selector (comments do not count).
func importsFor(code ast.Node, always ...string) string {
	names := slices.Clone(always)
	ast.Inspect(code, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok {
				if _, known := snippetImports[id.Name]; known && !slices.Contains(names, id.Name) {
					names = append(names, id.Name)
				}
			}
		}
		return true
	})
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("import (\n")
	for _, n := range names {
		fmt.Fprintf(&b, "\t%s %q\n", n, snippetImports[n])
	}
	b.WriteString(")\n")
	return b.String()
}

// snippetSource returns the Go file that compiles s, with //line directives
// that make the compiler's errors name the snippet's own file and line.
func snippetSource(s snippet) (string, error) {
	at := func(line int) string { return fmt.Sprintf("//line %s:%d\n", s.file, line) }
	if strings.HasPrefix(strings.TrimSpace(s.code), "package ") {
		return at(s.line) + s.code, nil
	}
	fset := token.NewFileSet()
	if decls, err := parser.ParseFile(fset, "", "package p\n"+s.code, 0); err == nil {
		return "package snippet\n\n" + importsFor(decls) + "\n" + at(s.line) + s.code, nil
	}
	pre := snippetPreambles[s.firstLine()]
	body, err := parser.ParseFile(fset, "", "package p\nfunc _() {\n"+pre+"\n"+s.code+"\n}\n", 0)
	if err != nil {
		return "", fmt.Errorf("parses neither as declarations nor as statements (with its preamble, if any): %v", err)
	}
	var b strings.Builder
	b.WriteString("package snippet\n\n")
	b.WriteString(importsFor(body, "context", "fence", "fkredis", "lock", "pgxpool", "redis", "sql"))
	fmt.Fprintf(&b, "\nfunc _(%s) error {\n", snippetParams)
	if pre != "" {
		fmt.Fprintf(&b, "//line snippetPreambles[%s:%d]:1\n%s\n", s.file, s.line, pre)
	}
	b.WriteString("{\n" + at(s.line) + s.code + "\n}\nreturn nil\n}\n")
	return b.String(), nil
}

// buildSnippets compiles every snippet, each as a package of its own in a
// directory of this module that exists only in go build's overlay (nothing
// is written into the repository), and
// returns go build's output and whether it failed. Snippets that cannot be
// turned into a file are reported in the output too.
func buildSnippets(t *testing.T, snippets []snippet) (string, bool) {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	overlay := map[string]string{}
	var pkgs []string
	var msgs []string
	for i, s := range snippets {
		src, err := snippetSource(s)
		if err != nil {
			msgs = append(msgs, fmt.Sprintf("%s: %v", s, err))
			continue
		}
		dir := fmt.Sprintf("zz_docsnippet%03d", i)
		file := filepath.Join(tmp, dir+".go")
		if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		overlay[filepath.Join(wd, dir, "snippet.go")] = file
		pkgs = append(pkgs, "./"+dir)
	}
	js, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	ov := filepath.Join(tmp, "overlay.json")
	if err := os.WriteFile(ov, js, 0o644); err != nil {
		t.Fatal(err)
	}
	// go build discards what it builds when given several packages; one
	// main package alone it would write to the working directory. (-o with a
	// directory would skip every non-main package.)
	args := []string{"build", "-gcflags=-e", "-overlay=" + ov}
	if len(pkgs) == 1 {
		args = append(args, "-o", os.DevNull)
	}
	out, err := exec.Command("go", append(args, pkgs...)...).CombinedOutput()
	// go build prints each package's import path before its errors; the
	// file:line in the errors is what names the snippet.
	failed := err != nil || len(msgs) > 0
	return strings.Join(append(msgs, string(out)), "\n"), failed
}

// TestDocSnippetsCompile compiles every Go snippet of the repository's
// Markdown files and doc comments.
func TestDocSnippetsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every snippet with go build")
	}
	snippets := repoSnippets(t, filepath.Join("..", ".."))
	// The README's quick start (a whole program) and its fragments must be
	// found, or the extraction is broken and the test would pass on nothing.
	var whole, fragments int
	for _, s := range snippets {
		if s.file != "README.md" {
			continue
		}
		if strings.HasPrefix(s.code, "package ") {
			whole++
		} else {
			fragments++
		}
	}
	if whole == 0 || fragments == 0 {
		t.Fatalf("found %d whole files and %d fragments among README.md's go blocks; the extraction is broken", whole, fragments)
	}
	for _, s := range snippets {
		t.Logf("%s: %s", s, s.firstLine())
	}
	if out, failed := buildSnippets(t, snippets); failed {
		t.Errorf("snippets that do not compile:\n%s\n%s", out, snippetHowTo)
	}
}

// droppedErrors returns the positions in body where an error is assigned to
// err and then only inspected with errors.Is or errors.As before err is
// assigned again or the block ends: every error the checks do not name falls
// through, as in "if errors.Is(err, lock.ErrNotHeld) { return err }" with
// Redis down. Uses inside function literals belong to their own err.
func droppedErrors(body *ast.BlockStmt) []token.Pos {
	var out []token.Pos
	ast.Inspect(body, func(n ast.Node) bool {
		var list []ast.Stmt
		switch n := n.(type) {
		case *ast.BlockStmt:
			list = n.List
		case *ast.CaseClause:
			list = n.Body
		case *ast.CommClause:
			list = n.Body
		default:
			return true
		}
		for i, st := range list {
			as, ok := st.(*ast.AssignStmt)
			if !ok || !assignsErr(as) || makesError(as) {
				continue
			}
			inspected, handled := 0, false
			for _, next := range list[i+1:] {
				if a, ok := next.(*ast.AssignStmt); ok && assignsErr(a) && !usesErr(a.Rhs) {
					break
				}
				ins, other := errUses(next)
				inspected += ins
				handled = handled || other > 0
			}
			if !handled && inspected > 0 {
				out = append(out, as.Pos())
			}
		}
		return true
	})
	return out
}

// makesError reports whether as builds an error (fmt.Errorf, errors.New,
// errors.Join) rather than receives one from a call that can fail.
func makesError(as *ast.AssignStmt) bool {
	if len(as.Rhs) != 1 {
		return false
	}
	call, ok := as.Rhs[0].(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	pkg, ok := sel.X.(*ast.Ident)
	return ok && (pkg.Name == "fmt" && sel.Sel.Name == "Errorf" || pkg.Name == "errors" && (sel.Sel.Name == "New" || sel.Sel.Name == "Join"))
}

func assignsErr(as *ast.AssignStmt) bool {
	for _, l := range as.Lhs {
		if id, ok := l.(*ast.Ident); ok && id.Name == "err" {
			return true
		}
	}
	return false
}

func usesErr(exprs []ast.Expr) bool {
	for _, e := range exprs {
		if ins, other := errUses(e); ins+other > 0 {
			return true
		}
	}
	return false
}

// errUses counts the uses of err in n outside function literals: those that
// are the first argument of errors.Is or errors.As, and all others. The body
// of an if or a case whose condition only inspects err is that case's
// handling, not the other errors', so it does not count.
func errUses(n ast.Node) (inspected, other int) {
	skip := map[*ast.Ident]bool{}
	ast.Inspect(n, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.IfStmt:
			ins, oth := errUses(n.Cond)
			if ins == 0 || oth > 0 {
				return true
			}
			inspected += ins
			if n.Init != nil {
				i, o := errUses(n.Init)
				inspected, other = inspected+i, other+o
			}
			if n.Else != nil {
				i, o := errUses(n.Else)
				inspected, other = inspected+i, other+o
			}
			return false
		case *ast.CaseClause:
			var ins, oth int
			for _, e := range n.List {
				i, o := errUses(e)
				ins, oth = ins+i, oth+o
			}
			if ins == 0 || oth > 0 {
				return true
			}
			inspected += ins
			return false
		case *ast.CallExpr:
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && len(n.Args) > 0 {
				if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "errors" && (sel.Sel.Name == "Is" || sel.Sel.Name == "As") {
					if id, ok := n.Args[0].(*ast.Ident); ok && id.Name == "err" {
						skip[id] = true
						inspected++
					}
				}
			}
		case *ast.Ident:
			if n.Name == "err" && !skip[n] {
				other++
			}
		}
		return true
	})
	return inspected, other
}

// exampleBodies returns the Example functions of the repository's test files:
// go doc shows them with the package, so they are docs as much as snippets.
func exampleBodies(t *testing.T, root string) (fset *token.FileSet, names []string, bodies []*ast.BlockStmt) {
	t.Helper()
	fset = token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && strings.HasPrefix(fn.Name.Name, "Example") && fn.Body != nil {
				names = append(names, filepath.ToSlash(rel)+":"+fn.Name.Name)
				bodies = append(bodies, fn.Body)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fset, names, bodies
}

// examplesDroppingErrors are Example functions known to drop errors, in
// packages whose owners fix them; the test fails once one is fixed, so that
// its line goes too.
var examplesDroppingErrors = map[string]bool{}

// TestDocSnippetsHandleErrors: no snippet and no Example function tests an
// error for one sentinel and lets every other error fall through.
func TestDocSnippetsHandleErrors(t *testing.T) {
	const how = "after the cases it names, handle every other error too (if err != nil { return err }, or a switch with case err != nil)"
	root := filepath.Join("..", "..")
	for _, s := range repoSnippets(t, root) {
		src, err := snippetSource(s)
		if err != nil {
			continue // TestDocSnippetsCompile reports it
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, s.file, src, parser.ParseComments)
		if err != nil {
			continue
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Body != nil {
				for _, pos := range droppedErrors(fn.Body) {
					p := fset.Position(pos)
					t.Errorf("%s:%d: the error assigned here is only tested with errors.Is/As: %s", p.Filename, p.Line, how)
				}
			}
		}
	}
	fset, names, bodies := exampleBodies(t, root)
	for i, body := range bodies {
		drops := droppedErrors(body)
		switch {
		case len(drops) > 0 && !examplesDroppingErrors[names[i]]:
			for _, pos := range drops {
				p := fset.Position(pos)
				rel, _ := filepath.Rel(root, p.Filename)
				t.Errorf("%s:%d (%s): the error assigned here is only tested with errors.Is/As: %s", filepath.ToSlash(rel), p.Line, names[i], how)
			}
		case len(drops) == 0 && examplesDroppingErrors[names[i]]:
			t.Errorf("%s handles its errors now: remove it from examplesDroppingErrors", names[i])
		}
	}
}

// TestDocSnippetsCatchErrors shows that the harness fails on a snippet that
// does not compile and names the snippet's file and line, for Markdown and
// doc comments alike, and that it accepts the shapes the docs use.
func TestDocSnippetsCatchErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("builds snippets with go build")
	}
	md := "# t\n\ntext\n\n```go\nlease, err := locker.Acquire(ctx, \"r\", 1)\nif err != nil {\n\treturn err\n}\nreturn lease.Release(ctx, 7)\n```\n\n" +
		"```go\nfunc helper() int { return \"x\" }\n```\n\n```go\nerr := store.Nope()\n```\n"
	got := markdownSnippets("docs/t.md", []byte(md))
	if len(got) != 3 || got[0].line != 6 || got[1].line != 14 || got[2].line != 18 {
		t.Fatalf("markdownSnippets = %+v", got)
	}
	src := `// Package p shows a code block.
//
//	go test ./...
//
// And Go:
//
//	x := lock.DefaultPrefix + 1
package p
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	doc := docSnippets(fset, "p/doc.go", f)
	if len(doc) != 1 || doc[0].line != 7 {
		t.Fatalf("docSnippets = %+v, want the Go block on line 7 only", doc)
	}
	out, failed := buildSnippets(t, append(got, doc...))
	if !failed {
		t.Fatalf("broken snippets built:\n%s", out)
	}
	for _, want := range []string{"docs/t.md:10:", "docs/t.md:14:", "docs/t.md:18:", "p/doc.go:7:"} {
		if !strings.Contains(out, want) {
			t.Errorf("output does not name %s:\n%s", want, out)
		}
	}

	good := []snippet{
		{file: "g.md", line: 1, code: "package main\n\nfunc main() {}\n"},
		{file: "g.md", line: 9, code: "func helper(ctx context.Context) error { return ctx.Err() }\n"},
		{file: "g.md", line: 20, code: "lease, err := locker.TryAcquire(ctx, \"r\", time.Second)\nif err != nil {\n\treturn err\n}\nreturn lease.Release(ctx)\n"},
	}
	if out, failed := buildSnippets(t, good); failed {
		t.Fatalf("good snippets failed:\n%s", out)
	}
}

// TestDroppedErrors: the error check flags the pattern (one sentinel
// tested, every other error falling through) and passes the handled shapes.
func TestDroppedErrors(t *testing.T) {
	for _, c := range []struct {
		code  string
		drops bool
	}{
		{"f, err := locker.FenceLock(ctx, \"r\", \"v\")\nif errors.Is(err, lock.ErrNotHeld) {\n\treturn err\n}\n_ = f\n", true},
		{"err := lease.Release(ctx)\nif errors.Is(err, lock.ErrNotHeld) {\n\tlog.Print(err)\n}\n", true},
		{"err := lease.Release(ctx)\nswitch {\ncase errors.Is(err, lock.ErrNotHeld):\n\treturn err\n}\n", true},
		{"f, err := locker.FenceLock(ctx, \"r\", \"v\")\nif err != nil {\n\treturn err\n}\n_ = f\n", false},
		{"err := lease.Release(ctx)\nif errors.Is(err, lock.ErrNotHeld) {\n\treturn nil\n} else if err != nil {\n\treturn err\n}\n", false},
		{"err := lease.Release(ctx)\nif errors.Is(err, lock.ErrNotHeld) {\n\treturn nil\n}\nreturn err\n", false},
		{"err := lease.Release(ctx)\nswitch {\ncase errors.Is(err, lock.ErrNotHeld):\ncase err != nil:\n\treturn err\n}\n", false},
		{"err := fmt.Errorf(\"x: %w\", lock.ErrNotHeld)\nif errors.Is(err, lock.ErrNotHeld) {\n\tlog.Print(\"built\")\n}\n", false},
	} {
		src, err := snippetSource(snippet{file: "t.md", line: 1, code: c.code})
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(token.NewFileSet(), "", src, 0)
		if err != nil {
			t.Fatal(err)
		}
		var drops int
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok {
				drops += len(droppedErrors(fn.Body))
			}
		}
		if (drops > 0) != c.drops {
			t.Errorf("droppedErrors found %d in\n%s\nwant drops=%v", drops, c.code, c.drops)
		}
	}
}
