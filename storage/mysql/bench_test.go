package mysql_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/storage/mysql"
)

const benchUpdate = `UPDATE counter SET n = n + 1 WHERE id = ?`

// benchDSNs are the two ways go-sql-driver sends a statement with
// arguments: prepared on the server (the driver's default, two round trips
// a statement) or with the arguments interpolated by the client (one).
var benchDSNs = []struct {
	name        string
	interpolate bool
}{
	{"prepared", false},
	{"interpolateParams", true},
}

func benchDB(b *testing.B, interpolate bool) (context.Context, *sql.DB) {
	cfg := testenv.MySQLConfig(b)
	cfg.InterpolateParams = interpolate
	return setupWith(b, cfg)
}

// BenchmarkPlainUpdate is the reference: one UPDATE in autocommit, no
// fencing.
func BenchmarkPlainUpdate(b *testing.B) {
	for _, d := range benchDSNs {
		b.Run(d.name, func(b *testing.B) {
			ctx, db := benchDB(b, d.interpolate)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := db.ExecContext(ctx, benchUpdate, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkTxUpdate is the same UPDATE in an explicit transaction without a
// guard (BEGIN, UPDATE, COMMIT): what the transaction costs by itself.
func BenchmarkTxUpdate(b *testing.B) {
	for _, d := range benchDSNs {
		b.Run(d.name, func(b *testing.B) {
			ctx, db := benchDB(b, d.interpolate)
			b.ReportAllocs()
			for b.Loop() {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := tx.ExecContext(ctx, benchUpdate, 1); err != nil {
					b.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFencedUpdate is the fenced write: InTx with BEGIN, the guard,
// the UPDATE and COMMIT.
func BenchmarkFencedUpdate(b *testing.B) {
	for _, d := range benchDSNs {
		b.Run(d.name, func(b *testing.B) {
			ctx, db := benchDB(b, d.interpolate)
			f := fenceOf("counter", 1, "h")
			fn := func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, benchUpdate, 1)
				return err
			}
			if err := mysql.InTx(ctx, db, nil, f, fn); err != nil { // the guard row exists from here on
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := mysql.InTx(ctx, db, nil, f, fn); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
