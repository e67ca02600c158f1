package integration

// The README's snippets use these packages; importing them here keeps them in
// this module's go.mod (go mod tidy sees only real imports), so that
// TestDocSnippetsCompile can build the snippets.
import (
	_ "github.com/jmoiron/sqlx"
	_ "gorm.io/gorm"
)
