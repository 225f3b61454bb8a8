package txn

import (
	"fmt"
	"strings"

	"go.etcd.io/bbolt"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/ledger"
	"github.com/capkernel/capkernel/syscalls"
)

// Precondition is one precondition ref of a call envelope. Its forms:
//
//	{"ref":"fs:<path>","hash":"blake3:<hex>"}  the file's content has this digest
//	{"ref":"fs:<path>","absent":true}          nothing exists at path
//	{"ref":"kv:<key>","version":N}             the key's version is N (0: never written)
//	{"ref":"kv:<key>","absent":true}           the key was never written
//	{"ref":"ledger:head","seq":N}              the newest ledger entry has seq N
//
// Preconditions are checked at prepare and again at commit, while the call
// holds the locks of every path it touches.
type Precondition struct {
	Ref     string  `json:"ref"`
	Hash    string  `json:"hash,omitempty"`
	Absent  bool    `json:"absent,omitempty"`
	Version *uint64 `json:"version,omitempty"`
	Seq     *uint64 `json:"seq,omitempty"`
}

// Kinds of precondition target.
const (
	RefFS     = "fs"
	RefKV     = "kv"
	RefLedger = "ledger"
)

// Target splits Ref into its kind and its path or key.
func (p Precondition) Target() (kind, name string) {
	kind, name, _ = strings.Cut(p.Ref, ":")
	return kind, name
}

// Validate checks that p has exactly one of the forms above.
func (p Precondition) Validate() error {
	kind, name := p.Target()
	bad := func(why string) error { return fmt.Errorf("precondition %q: %s", p.Ref, why) }
	switch kind {
	case RefFS:
		if name == "" {
			return bad("empty path")
		}
		if p.Version != nil || p.Seq != nil || (p.Hash == "") == !p.Absent {
			return bad(`fs refs take exactly one of "hash" or "absent":true`)
		}
		if p.Hash != "" {
			if _, err := digest.Parse(p.Hash); err != nil {
				return bad(err.Error())
			}
		}
	case RefKV:
		if name == "" {
			return bad("empty key")
		}
		if p.Hash != "" || p.Seq != nil || (p.Version == nil) == !p.Absent {
			return bad(`kv refs take exactly one of "version" or "absent":true`)
		}
	case RefLedger:
		if name != "head" || p.Seq == nil || p.Hash != "" || p.Absent || p.Version != nil {
			return bad(`the ledger ref is {"ref":"ledger:head","seq":N}`)
		}
	default:
		return bad("unknown ref kind (want fs:, kv: or ledger:head)")
	}
	return nil
}

// CheckFile checks an fs precondition against the resolved resource r.
func CheckFile(p Precondition, r *syscalls.Resource) error {
	got, _, err := hashFile(r.Root, r.Rel)
	switch {
	case err != nil:
		return refuse(ClassPrecondition, "%s: %v", p.Ref, err)
	case p.Absent && got != "":
		return refuse(ClassPrecondition, "%s: exists, expected absent", p.Ref)
	case !p.Absent && got == "":
		return refuse(ClassPrecondition, "%s: file does not exist", p.Ref)
	case !p.Absent && got != p.Hash:
		return refuse(ClassPrecondition, "%s: content is %s, expected %s", p.Ref, got, p.Hash)
	}
	return nil
}

// checkStored checks the kv and ledger preconditions of ps in tx; fs ones are
// skipped (the kernel checks them with CheckFile under its path locks).
func checkStored(tx *bbolt.Tx, ps []Precondition) error {
	for _, p := range ps {
		kind, name := p.Target()
		switch kind {
		case RefKV:
			v, err := kvGet(tx, name)
			if err != nil {
				return err
			}
			want := uint64(0)
			if p.Version != nil {
				want = *p.Version
			}
			switch {
			case v.Version != want && want == 0:
				return refuse(ClassPrecondition, "%s: the key exists (version %d), expected absent", p.Ref, v.Version)
			case v.Version != want:
				return refuse(ClassPrecondition, "%s: version is %d, expected %d", p.Ref, v.Version, want)
			}
		case RefLedger:
			h, err := ledger.HeadOf(tx)
			if err != nil {
				return err
			}
			if h.Size == 0 || h.Size-1 != *p.Seq {
				return refuse(ClassPrecondition, "%s: head is seq %d, expected %d", p.Ref, int64(h.Size)-1, *p.Seq)
			}
		}
	}
	return nil
}
