package mysqllock

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/fencekit/fencekit/election"
	"github.com/fencekit/fencekit/fence"
	"github.com/fencekit/fencekit/internal/harness/electionmodel"
	"github.com/fencekit/fencekit/internal/harness/testenv"
	"github.com/fencekit/fencekit/internal/lockbackend"
)

// The election model (internal/harness/electionmodel) on MariaDB. Each run
// has a database of its own, where triggers on fencekit_lock (the lock's
// row, which holds the leader record beside it) log every write of the row
// with the server's clock: the grants, the releases and the record writes,
// each with the lock's holder at that instant. The candidates reach the
// server through a fault proxy each (the nemesis cuts the leader off; a
// held record write blocks its candidate past the TTL), and their sessions
// are killed now and then (KILL).

const myModelTTL = 400 * time.Millisecond

// myStepDownFloor is the least gap the judge accepts between a lost term's
// end and the lock's next grant: a fifth of the documented default margin.
const myStepDownFloor = myModelTTL / election.StepDownDivisor / 5

// myLeaseFloor is the least gap the judge accepts between a lost term's
// last act admitted by Leading and its lease's end on the server: half the
// default margin, as on PostgreSQL.
const myLeaseFloor = myModelTTL / election.StepDownDivisor / 2

// myModelAudit logs every write of the lock's row, in the order the row
// lock imposes, with the server's clock at the write (µs).
var myModelAudit = []string{
	`CREATE TABLE elmodel_audit (
    seq BIGINT AUTO_INCREMENT PRIMARY KEY,
    at_us BIGINT NOT NULL,
    old_holder VARBINARY(255), old_token BIGINT, old_expires BIGINT, old_rec_token BIGINT, old_rec_holder VARBINARY(255), old_rec_value MEDIUMBLOB,
    new_holder VARBINARY(255), new_token BIGINT, new_expires BIGINT, new_rec_token BIGINT, new_rec_holder VARBINARY(255), new_rec_value MEDIUMBLOB)`,
	`CREATE TRIGGER elmodel_audit_ins AFTER INSERT ON fencekit_lock FOR EACH ROW
    INSERT INTO elmodel_audit (at_us, new_holder, new_token, new_expires, new_rec_token, new_rec_holder, new_rec_value)
    VALUES (` + nowUS + `, NEW.holder, NEW.token, NEW.expires_us, NEW.record_token, NEW.record_holder, NEW.record_value)`,
	`CREATE TRIGGER elmodel_audit_upd AFTER UPDATE ON fencekit_lock FOR EACH ROW
    INSERT INTO elmodel_audit (at_us, old_holder, old_token, old_expires, old_rec_token, old_rec_holder, old_rec_value,
        new_holder, new_token, new_expires, new_rec_token, new_rec_holder, new_rec_value)
    VALUES (` + nowUS + `, OLD.holder, OLD.token, OLD.expires_us, OLD.record_token, OLD.record_holder, OLD.record_value,
        NEW.holder, NEW.token, NEW.expires_us, NEW.record_token, NEW.record_holder, NEW.record_value)`,
}

// myModelRun is one run's variant.
type myModelRun struct {
	unfenced bool
	stepDown time.Duration // a step-down margin, or 0 for the default
	edits    []modelEdit   // a broken fencekit_lock_set_record
	// calm is the checker's pace (the controls keep the harsher one): the
	// nemesis's cuts and the sessions killed come twice as far apart, and
	// one term in three resigns within a TTL (electionmodel.Config's
	// ShortTerms). The MySQL lock hands over by its waiters' reads (a
	// second at most), so at the controls' pace nearly every term was cut
	// or killed before it could resign (1 resignation in 6 runs of 3 s, in
	// half the checker's runs even on a quiet machine).
	calm bool
}

// The checks the record controls take out of fencekit_lock_set_record.
var (
	recordHolderCheck = modelEdit{"fencekit_lock_set_record",
		"IF done OR NOT (r_holder <=> p_holder) OR r_token <> p_token OR r_expires <= t_now THEN",
		"IF done THEN"}
	recordNewerCheck = modelEdit{"fencekit_lock_set_record",
		"ELSEIF rec_token > p_token OR (rec_token = p_token AND rec_holder <> p_holder) THEN",
		"ELSEIF FALSE THEN"}
	recordTwinCheck = modelEdit{"fencekit_lock_set_record",
		"ELSEIF rec_token > p_token OR (rec_token = p_token AND rec_holder <> p_holder) THEN",
		"ELSEIF rec_token > p_token THEN"}
)

// runMyModel makes one run of the model with cfg and judges it.
func runMyModel(t *testing.T, cfg myModelRun, seed uint64, budget time.Duration) *electionmodel.Verdict {
	t.Helper()
	var cleanups []func()
	defer func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}()
	dbCfg := migratedConfig(t)
	admin := testenv.OpenMySQL(t, dbCfg.Clone())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, s := range myModelAudit {
		if _, err := admin.ExecContext(ctx, s); err != nil {
			t.Fatalf("audit trigger: %v", err)
		}
	}
	if len(cfg.edits) > 0 {
		installControl(t, admin, "record control", cfg.edits)
	}
	opts := []election.Option{election.WithTTL(myModelTTL)}
	if cfg.stepDown != 0 {
		opts = append(opts, election.WithStepDown(cfg.stepDown))
	}
	open := func(c *mysql.Config) *sql.DB {
		conn, err := mysql.NewConnector(c)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(conn)
		db.SetMaxOpenConns(3)
		cleanups = append(cleanups, func() { _ = db.Close() })
		return db
	}
	const candidates = 3
	backends := make([]*backend, candidates)
	newElection := func(db *sql.DB, extra config) (*election.Election, *backend) {
		l, err := newWith(db, extra)
		if err != nil {
			t.Fatal(err)
		}
		cleanups = append(cleanups, l.Close)
		e, err := election.New(l, "model", opts...)
		if err != nil {
			t.Fatal(err)
		}
		return e, lockbackend.Of(l).(*backend)
	}
	obs, _ := newElection(open(dbCfg.Clone()), config{})
	advancer, err := newWith(open(dbCfg.Clone()), config{})
	if err != nil {
		t.Fatal(err)
	}
	cleanups = append(cleanups, advancer.Close)
	nemesisEvery, killEvery := myModelTTL, 2*myModelTTL
	if cfg.calm {
		nemesisEvery, killEvery = 2*myModelTTL, 4*myModelTTL
	}
	mc := electionmodel.Config{
		Backend:    "mysql",
		TTL:        myModelTTL,
		Candidates: candidates,
		Budget:     budget,
		Seed:       seed,
		Unfenced:   cfg.unfenced,
		// A cut-off elector stops knowing at the cut, and the next term
		// begins only after the server's expiry and the doorbell's read
		// (a second at most): a belief of one TTL past the last it knew
		// has often ended by then, so the unfenced elector believes three.
		UnfencedFor: 3 * myModelTTL,
		// A held record write, now and then, with the others cut off
		// too: it lands after its lease ran out, the lock still free.
		HoldAlone:    true,
		NemesisEvery: nemesisEvery,
		ShortTerms:   cfg.calm,
		// Observe reads the record every 250 ms: no notification.
		ObserveEvery: watchEvery,
		NewCandidate: func(i int, beforeRecord func()) electionmodel.Candidate {
			p := testenv.StartProxy(t, dbCfg.Addr)
			c := dbCfg.Clone()
			c.Addr = p.Addr()
			c.Timeout = 2 * time.Second
			e, b := newElection(open(c), config{onRecord: beforeRecord})
			backends[i] = b
			return electionmodel.Candidate{Election: e, Cut: p.Block, Uncut: p.Unblock}
		},
		Observer: obs,
		// A record with a token above every term's (5 s of the server's
		// clock ahead), as a server whose clock went back would leave:
		// candidates must advance past it, never write under it.
		Plant: func(ctx context.Context) bool {
			res, err := admin.ExecContext(ctx, `UPDATE fencekit_lock SET record_token = record_token + 5000000,
				record_holder = 'planted-holder', record_value = 'planted'
				WHERE record_token IS NOT NULL AND record_holder <> 'planted-holder'`)
			if err != nil {
				return false
			}
			n, _ := res.RowsAffected()
			return n > 0
		},
		// A twin: the counter raised (Advance) to just below a token 5 s
		// ahead, and a record of another holder with that token, which
		// the next grant is then issued: it must advance past the
		// record, never take it as its own or write over it. Neither
		// planter writes while a planted record stands, so that a twin
		// stays until its grant meets it.
		Twin: func(ctx context.Context) bool {
			var x int64
			if err := admin.QueryRowContext(ctx, `SELECT GREATEST(token,
				TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))) + 5000000
				FROM fencekit_lock WHERE resource = 'model' AND NOT (record_holder <=> 'planted-holder')`).Scan(&x); err != nil {
				return false
			}
			if err := advancer.Advance(ctx, "model", fence.Token(x)); err != nil {
				return false
			}
			res, err := admin.ExecContext(ctx, `UPDATE fencekit_lock SET record_token = ?,
				record_holder = 'planted-holder', record_value = 'planted'
				WHERE resource = 'model' AND NOT (record_holder <=> 'planted-holder')`, x+1)
			if err != nil {
				return false
			}
			n, _ := res.RowsAffected()
			return n > 0
		},
		Faults: []electionmodel.Fault{{
			Name:  "sessions killed",
			Every: killEvery,
			Do: func(ctx context.Context, leader int) bool {
				i := leader
				if i < 0 || rand.IntN(2) == 0 {
					i = rand.IntN(candidates)
				}
				b := backends[i]
				if b == nil {
					return false
				}
				killed := false
				b.sessions.Range(func(_, v any) bool {
					if _, err := admin.ExecContext(ctx, "KILL "+strconv.FormatUint(v.(sessionInfo).id, 10)); err == nil {
						killed = true
					}
					return true
				})
				return killed
			},
		}},
	}
	h := electionmodel.Run(ctx, mc)
	log := myServerLog(t, admin)
	log.OffsetLow = myClockOffsetLow(t, admin)
	return electionmodel.Judge(h, log, myStepDownFloor)
}

// myClockOffsetLow returns the least the server's clock can be ahead of
// the local one.
func myClockOffsetLow(t *testing.T, db *sql.DB) time.Duration {
	t.Helper()
	low := time.Duration(-1 << 62)
	for range 20 {
		us := serverMicros(t, db)
		low = max(low, time.Until(time.UnixMicro(us)))
	}
	return low
}

// myServerLog reads the audit log into the model's events.
func myServerLog(t *testing.T, db *sql.DB) *electionmodel.ServerLog {
	t.Helper()
	rows, err := db.Query(`SELECT at_us, old_holder, old_token, old_expires, old_rec_token, old_rec_holder, old_rec_value,
		new_holder, new_token, new_expires, new_rec_token, new_rec_holder, new_rec_value FROM elmodel_audit ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	s := &electionmodel.ServerLog{ReleasesKnown: true, LeaseFloor: myLeaseFloor}
	granted := map[string]fence.Token{}
	for rows.Next() {
		var atUS int64
		var oh, orh, orv, nh, nrh, nrv sql.NullString
		var ot, oe, ort, nt, ne, nrt sql.NullInt64
		if err := rows.Scan(&atUS, &oh, &ot, &oe, &ort, &orh, &orv, &nh, &nt, &ne, &nrt, &nrh, &nrv); err != nil {
			t.Fatal(err)
		}
		at := time.UnixMicro(atUS)
		oldAlive := oh.Valid && oe.Valid && oe.Int64 > atUS
		newAlive := nh.Valid && ne.Valid && ne.Int64 > atUS
		if nh.Valid && (!oh.Valid || oh.String != nh.String) {
			if oldAlive {
				s.Events = append(s.Events, electionmodel.Event{Kind: electionmodel.Released, At: at, Holder: oh.String})
			}
			granted[nh.String] = fence.Token(nt.Int64)
			e := electionmodel.Event{Kind: electionmodel.Granted, At: at, Holder: nh.String, Token: fence.Token(nt.Int64)}
			if ne.Valid {
				e.Expires = time.UnixMicro(ne.Int64)
			}
			s.Events = append(s.Events, e)
		} else if !nh.Valid && oldAlive {
			s.Events = append(s.Events, electionmodel.Event{Kind: electionmodel.Released, At: at, Holder: oh.String})
		} else if nh.Valid && ne.Valid && (!oe.Valid || oe.Int64 != ne.Int64) {
			s.Events = append(s.Events, electionmodel.Event{Kind: electionmodel.Extended, At: at, Holder: nh.String, Expires: time.UnixMicro(ne.Int64)})
		}
		if nrt.Valid && (!ort.Valid || ort.Int64 != nrt.Int64 || orh != nrh || orv != nrv) {
			e := electionmodel.Event{Kind: electionmodel.Recorded, At: at, Token: fence.Token(nrt.Int64), Holder: nrh.String,
				Value: nrv.String, Planted: nrh.String == "planted-holder"}
			if newAlive {
				e.LockHolder, e.LockToken = nh.String, granted[nh.String]
			}
			if ort.Valid {
				e.Replaced = &electionmodel.Record{Token: fence.Token(ort.Int64), Holder: orh.String}
			}
			s.Events = append(s.Events, e)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestElectionModelMySQL runs the election model on MariaDB, under its
// faults, and requires no violation and enough judged of each kind, over
// up to six runs.
func TestElectionModelMySQL(t *testing.T) {
	testenv.Slow(t)
	t.Parallel()
	budget := electionmodel.Budget(t, 4*time.Second)
	floors := map[string]int{
		"terms": 4, "terms lost": 1, "terms resigned": 2, "acts": 50,
		"pairs judged (one believer)": 5, "pairs judged (tokens)": 5, "terms judged (observer)": 5,
		"record writes judged (holder)": 4, "record writes judged (token)": 2,
		"record writes held past the TTL": 1, "record writes held past the TTL alone": 1,
		"records planted": 1, "records planted (twin)": 1,
		"terms run out (step-down gap judged)": 1, "faults: sessions killed": 1,
	}
	electionmodel.Check(t, "mysql", floors, 6, func(seed uint64) *electionmodel.Verdict {
		return runMyModel(t, myModelRun{calm: true}, seed, budget)
	})
}

// myControl runs a broken variant over three seeds, each for up to three
// runs until it goes wrong: the judge must reject it with a violation of
// kind in most of them.
func myControl(t *testing.T, name, kind string, cfg myModelRun) {
	testenv.Slow(t)
	t.Parallel()
	budget := electionmodel.Budget(t, 4*time.Second)
	electionmodel.Rejects(t, "mysql", name, kind, 3, 3, func(seed uint64) *electionmodel.Verdict {
		return runMyModel(t, cfg, seed, budget)
	})
}

// An elector that believes it leads for a TTL after it last knew is caught
// electing two leaders at once.
func TestElectionModelMySQLRejectsUnfenced(t *testing.T) {
	myControl(t, "unfenced elector", "one believer", myModelRun{unfenced: true})
}

// A leader that steps down at the end of its lease's validity less the
// drift allowance alone is caught by the step-down gap.
func TestElectionModelMySQLRejectsLateStepDown(t *testing.T) {
	myControl(t, "step-down within the drift allowance", "step-down", myModelRun{stepDown: election.Drift(myModelTTL)})
}

// A record procedure without the holder check lets a candidate whose
// write was held past its lease record itself while another holds the
// lock.
func TestElectionModelMySQLRejectsPhantomRecord(t *testing.T) {
	myControl(t, "record written without the holder check", "record holder", myModelRun{edits: []modelEdit{recordHolderCheck}})
}

// A record procedure that takes a lower token over a newer record (the
// planted one) is caught by the record-token check.
func TestElectionModelMySQLRejectsLowerRecord(t *testing.T) {
	myControl(t, "record admitted below a newer one", "record token", myModelRun{edits: []modelEdit{recordNewerCheck}})
}

// A record procedure that lets another holder write over a record of its
// own token (the twin) is caught by the record-token check.
func TestElectionModelMySQLRejectsTwinRecord(t *testing.T) {
	myControl(t, "record admitted over a twin", "record token", myModelRun{edits: []modelEdit{recordTwinCheck}})
}
