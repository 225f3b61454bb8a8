package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"go.etcd.io/bbolt"
)

// txLog is a BeginTx, BeforeCommit and EndTx that log what ran, in
// order: "b" begin, "c" before commit, "e" end. BeforeCommit writes the
// key "flushed" and fails when the transaction holds the key "poison".
// They do nothing until the log is on (not in openTest's transaction).
type txLog struct {
	mu  sync.Mutex
	on  bool
	log string
}

func (l *txLog) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.on = true
}

// note logs ev and reports whether the log is on.
func (l *txLog) note(ev string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.on {
		l.log += ev
	}
	return l.on
}

func (l *txLog) begin(*bbolt.Tx) { l.note("b") }
func (l *txLog) end(*bbolt.Tx)   { l.note("e") }

func (l *txLog) beforeCommit(tx *bbolt.Tx) error {
	if !l.note("c") {
		return nil
	}
	b := tx.Bucket([]byte("b"))
	if b.Get([]byte("poison")) != nil {
		return errors.New("poisoned")
	}
	return b.Put([]byte("flushed"), nil)
}

// since returns the log of each transaction begun after the first n.
func (l *txLog) since(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	txs := strings.SplitAfter(l.log, "e")
	return txs[n : len(txs)-1] // the last is empty
}

// TestTxHooks: BeginTx runs first in every transaction (a batch's and
// each op's own after an abort), BeforeCommit last in every one about to
// commit, whether an op succeeded or not, with its writes committed, and
// EndTx once each has ended; BeforeCommit's error aborts the batch as an
// op's Abort does.
func TestTxHooks(t *testing.T) {
	refuse := func(*bbolt.Tx) error { return errors.New("refused") }
	abort := func(tx *bbolt.Tx) error { put("z")(tx); return Abort(errors.New("aborted")) }
	cases := []struct {
		name    string
		ops     []func(*bbolt.Tx) error
		errs    []string // each op's error; "" for none
		log     []string // per transaction, in order
		flushed bool     // "flushed" is committed
	}{
		{name: "a batch commits", ops: []func(*bbolt.Tx) error{put("k1"), refuse, put("k2")},
			errs: []string{"", "refused", ""}, log: []string{"bce"}, flushed: true},
		{name: "every op fails", ops: []func(*bbolt.Tx) error{refuse, refuse},
			errs: []string{"refused", "refused"}, log: []string{"bce"}, flushed: true},
		{name: "an op aborts", ops: []func(*bbolt.Tx) error{put("k1"), abort, put("k2")},
			errs: []string{"", "aborted", ""}, log: []string{"be", "bce", "bce", "be"}, flushed: true},
		{name: "before commit fails", ops: []func(*bbolt.Tx) error{put("k1"), put("poison")},
			errs: []string{"", "store: before commit: poisoned"}, log: []string{"bce", "bce", "bce"}, flushed: true},
		{name: "before commit fails alone", ops: []func(*bbolt.Tx) error{put("poison")},
			errs: []string{"store: before commit: poisoned"}, log: []string{"bce"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := &txLog{}
			d := openTest(t, Options{BeginTx: l.begin, BeforeCommit: l.beforeCommit, EndTx: l.end})
			l.start()
			var errs []error
			if len(tc.ops) == 1 {
				errs = []error{d.Update(context.Background(), tc.ops[0])}
			} else {
				errs = inOneBatch(t, d, tc.ops...)
			}
			for i, err := range errs {
				if got := fmt.Sprint(err); tc.errs[i] == "" && err != nil || tc.errs[i] != "" && !strings.HasPrefix(got, tc.errs[i]) {
					t.Errorf("op %d: %v, want %q", i, err, tc.errs[i])
				}
			}
			skip := 0
			if len(tc.ops) > 1 {
				skip = 1 // inOneBatch's blocker
			}
			// inOneBatch queues the ops in any order: so do the
			// transactions of ops run alone.
			got := l.since(skip)
			slices.Sort(got[min(1, len(got)):])
			if fmt.Sprint(got) != fmt.Sprint(tc.log) {
				t.Errorf("transactions ran %v, want %v", got, tc.log)
			}
			stored := keys(t, d)
			if stored["flushed"] != tc.flushed || stored["z"] || stored["poison"] {
				t.Errorf("committed %v, want flushed %v", stored, tc.flushed)
			}
		})
	}
}
