package integration

// The README's snippets use these packages; importing them here keeps them in
// this module's go.mod (go mod tidy sees only real imports), so that
// TestDocSnippetsCompile can build the snippets.
import (
	_ "github.com/fencekit/fencekit/lock/etcdlock"
	_ "github.com/jmoiron/sqlx"
	_ "go.etcd.io/etcd/client/v3"
	_ "gorm.io/gorm"
)
