module github.com/fencekit/fencekit/bench

go 1.26.0

require (
	github.com/bsm/redislock v0.9.4
	github.com/fencekit/fencekit v0.0.0-20261207204707-b7ec5d827383
	github.com/go-redsync/redsync/v4 v4.18.1
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/rueidis v1.0.80
)

require (
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/mfridman/interpolate v0.0.2 // indirect
	github.com/pressly/goose/v3 v3.26.0 // indirect
	github.com/sethvargo/go-retry v0.5.0 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel v1.47.0 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/fencekit/fencekit/lock/rueidisfence v0.0.0-00010101000000-000000000000
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/redis/go-redis/v9 v9.23.0
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/text v0.44.0 // indirect
)

// The suite measures the fencekit in this repository, also with GOWORK=off.
replace github.com/fencekit/fencekit => ../

// The module proxy refuses rueidiscompat v1.0.79, which redsync's own tests
// reach (rueidis v1.0.79 itself downloads and is the one the suite runs);
// v1.0.78 is the newest it serves.
replace github.com/redis/rueidis/rueidiscompat => github.com/redis/rueidis/rueidiscompat v1.0.78

replace github.com/fencekit/fencekit/lock/rueidisfence => ../lock/rueidisfence
