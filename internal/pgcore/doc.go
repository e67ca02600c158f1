// Package pgcore holds what the two PostgreSQL storage adapters
// (storage/postgres over pgx, storage/pgsql over database/sql) share: the
// SQL of the guard table, the completion table and the catalog lookups, the
// SQLSTATEs they interpret, how a server error is read whichever driver
// returned it, and the hints their messages give. Sharing the SQL is what
// makes a database guarded through both packages at once keep one mark per
// resource.
//
// It imports pgx only for its error type; the adapters keep their driver's
// calls and their own error values.
package pgcore
