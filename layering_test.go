package fencekit_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The module's packages fall in two groups. The library (fence, lock,
// storage/..., migrations and the packages directly under internal/) is what
// a user's program links; the harness (under internal/harness/) hands tests
// real servers and workloads and imports the library. Dependencies run one
// way only: a harness package may import the library, never the reverse, or
// test tooling would end up in users' binaries and in import cycles.

const modulePath = "github.com/fencekit/fencekit"

// importedBy maps a package's import path to the imports of each of its Go
// files, keyed by file name.
type importedBy map[string]map[string][]string

// TestImportDirection parses the import clauses of every package of the
// module (the nested modules aside) and fails on an import that runs
// against the layering.
func TestImportDirection(t *testing.T) {
	pkgs := moduleImports(t, ".")
	for _, want := range []string{
		"fence", "lock", "storage/postgres", "storage/mysql", "storage/redis",
		"migrations", "internal/telemetry", "internal/sqlguard", "internal/keyslot",
		"internal/harness/testenv",
		"internal/harness/workload",
	} {
		if _, ok := pkgs[modulePath+"/"+want]; !ok {
			t.Errorf("package %s was not found: the walk missed it", want)
		}
	}
	for _, v := range layeringViolations(pkgs) {
		t.Error(v)
	}
}

// TestImportDirectionCatchesViolations feeds the rules imports that break
// them, so that TestImportDirection cannot pass by checking nothing.
func TestImportDirectionCatchesViolations(t *testing.T) {
	m := modulePath + "/"
	pkgs := importedBy{
		m + "lock":               {"a.go": {m + "internal/harness/testenv"}},
		m + "storage/postgres":   {"b.go": {m + "lock"}, "b_test.go": {m + "internal/harness/testenv"}},
		m + "internal/telemetry": {"c_test.go": {m + "internal/harness/workload"}},
		m + "fence":              {"d.go": {"github.com/jackc/pgx/v5"}},
		m + "internal/harness/x": {"e.go": {m + "lock", m + "internal/harness/testenv"}},
		m + "internal/sqlguard":  {"f.go": {"github.com/go-sql-driver/mysql"}, "f_test.go": {"github.com/jackc/pgx/v5"}},
	}
	got := layeringViolations(pkgs)
	want := []string{
		m + "fence: d.go imports the driver github.com/jackc/pgx/v5",
		m + "internal/sqlguard: f.go imports the driver github.com/go-sql-driver/mysql",
		m + "internal/telemetry: c_test.go imports the harness package " + m + "internal/harness/workload",
		m + "lock: a.go imports the harness package " + m + "internal/harness/testenv",
		m + "storage/postgres: b.go imports " + m + "lock",
	}
	if !slices.Equal(got, want) {
		t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// layeringViolations lists, sorted, every import in pkgs that breaks a rule:
//   - no non-test file of a library package imports a harness package, and
//     no file at all of a library-internal package does;
//   - fence and internal/sqlguard (the SQL adapters' shared code) import
//     no database or Redis driver outside their tests;
//   - no storage adapter imports lock.
func layeringViolations(pkgs importedBy) []string {
	var out []string
	for pkg, files := range pkgs {
		if isHarness(pkg) {
			continue
		}
		internalPkg := strings.HasPrefix(pkg, modulePath+"/internal/")
		for file, imports := range files {
			test := strings.HasSuffix(file, "_test.go")
			for _, imp := range imports {
				switch {
				case isHarness(imp) && (!test || internalPkg):
					out = append(out, pkg+": "+file+" imports the harness package "+imp)
				case (pkg == modulePath+"/fence" || pkg == modulePath+"/internal/sqlguard") && !test && isDriver(imp):
					out = append(out, pkg+": "+file+" imports the driver "+imp)
				case strings.HasPrefix(pkg, modulePath+"/storage/") && !test && imp == modulePath+"/lock":
					out = append(out, pkg+": "+file+" imports "+imp)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

func isHarness(importPath string) bool {
	h := modulePath + "/internal/harness"
	return importPath == h || strings.HasPrefix(importPath, h+"/")
}

func isDriver(importPath string) bool {
	for _, d := range []string{"github.com/jackc/pgx", "github.com/go-sql-driver/mysql", "github.com/redis/go-redis"} {
		if importPath == d || strings.HasPrefix(importPath, d+"/") {
			return true
		}
	}
	return false
}

// moduleImports reads the import clauses of the Go files under root, which
// is the module's directory, leaving out nested modules, testdata and
// hidden directories.
func moduleImports(t *testing.T, root string) importedBy {
	t.Helper()
	pkgs := importedBy{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != root {
				if name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
					return filepath.SkipDir
				}
				if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(p))
		if err != nil {
			return err
		}
		pkg := modulePath
		if rel != "." {
			pkg = path.Join(modulePath, filepath.ToSlash(rel))
		}
		if pkgs[pkg] == nil {
			pkgs[pkg] = map[string][]string{}
		}
		var imports []string
		for _, spec := range f.Imports {
			imp, err := strconv.Unquote(spec.Path.Value)
			if err != nil {
				return err
			}
			imports = append(imports, imp)
		}
		pkgs[pkg][filepath.Base(p)] = imports
		return nil
	})
	if err != nil {
		t.Fatalf("reading the module's imports: %v", err)
	}
	return pkgs
}
