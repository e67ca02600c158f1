package sqlguard

// Columns are the columns of a fenced table that the adapters' Table
// methods manage, after defaults.
type Columns struct {
	Key, Token, Holder, Version string
}

// Dialect is how one SQL server names a table's columns.
type Dialect struct {
	// Check refuses a name the server cannot hold; what says which name it
	// is ("key column", "value column").
	Check func(what, name string) error
	// Kept is the name the server compares for name: two names with the
	// same Kept are one column.
	Kept func(name string) string
	// Clash is the error for two managed roles given one column, name.
	Clash func(first, second, name string) error
}

// CheckColumns checks, before anything is sent, that c's key, token, holder
// and version name four different columns and that each value column is
// another column, named once: otherwise a fenced write could put the token
// into the key, or a versioned update bump it. Names are checked in order,
// managed columns first, and the first problem is returned. table names the
// table in messages.
func (s *Store) CheckColumns(table string, c Columns, values []string, d Dialect) error {
	managed := [...]struct{ role, col string }{
		{"key", c.Key}, {"token", c.Token}, {"holder", c.Holder}, {"version", c.Version},
	}
	role := make(map[string]string, len(managed)+len(values))
	for _, m := range managed {
		if err := d.Check(m.role+" column", m.col); err != nil {
			return err
		}
		if other, ok := role[d.Kept(m.col)]; ok {
			return d.Clash(other, m.role, m.col)
		}
		role[d.Kept(m.col)] = m.role
	}
	for _, v := range values {
		if err := d.Check("value column", v); err != nil {
			return err
		}
		if other, ok := role[d.Kept(v)]; ok {
			return s.Invalid("table %q: column %q is set twice or is the %s column", table, v, other)
		}
		role[d.Kept(v)] = "value"
	}
	return nil
}
