package main

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/capkernel/capkernel/digest"
	"github.com/capkernel/capkernel/kernel"
	"github.com/capkernel/capkernel/ledger"
)

// seenCheckpoint is a checkpoint ledger checkpoint remembers.
type seenCheckpoint struct {
	// Origin is the checkpoint's origin, in a record kept per signing key
	// (a record kept per origin is named after it and leaves it out).
	Origin string `json:"origin,omitempty"`
	Note   string `json:"note"`
	SeenAt string `json:"seen_at"`
}

func defaultStateDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "capkernel", "checkpoints")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".local", "state", "capkernel", "checkpoints")
}

// url64 names a state file after an origin without path separators.
func url64(origin string) string {
	return strings.NewReplacer("/", "_", "\\", "_", "..", "__").Replace(origin) + ".json"
}

// keyFingerprint is the RFC 7638 JWK thumbprint (SHA-256, base64url) of
// pub: the kid the kernel's JWKS gives the key.
func keyFingerprint(pub ed25519.PublicKey) string {
	sum := sha256.Sum256([]byte(`{"crv":"Ed25519","kty":"OKP","x":"` + base64.RawURLEncoding.EncodeToString(pub) + `"}`))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// checkpointState is what ledger checkpoint remembers in dir: the last
// checkpoint verified per origin (<origin>.json, the layout kernelctl has
// always kept) and per signing key (keys/<kid>.json, with its origin). A
// key signs one log: a checkpoint it signed under another origin than the
// one remembered for it, or that is not an extension of what it signed
// before, is refused.
type checkpointState struct{ dir string }

func (s checkpointState) originPath(origin string) string { return filepath.Join(s.dir, url64(origin)) }

func (s checkpointState) keyPath(pub ed25519.PublicKey) string {
	return filepath.Join(s.dir, "keys", keyFingerprint(pub)+".json")
}

// check proves cp, signed by pub, consistent with the checkpoints
// remembered for its origin and for pub, and says how; older reports that
// cp is a proven prefix of one of them, which it must not replace.
func (s checkpointState) check(ctx context.Context, h history, cp ledger.Checkpoint, pub ed25519.PublicKey) (how string, older bool, err error) {
	byKey, keyFile, err := s.seenByKey(pub)
	if err != nil {
		return "", false, err
	}
	if byKey != nil && byKey.Origin != cp.Origin {
		old, _ := ledger.PeekCheckpoint([]byte(byKey.Note))
		return "", false, fmt.Errorf("ORIGIN CHANGED: key %s signed the checkpoint of origin %q (size %d) seen at %s, and now one of origin %q (size %d): "+
			"a key signs one ledger, so this is another history under a new name (remove %s to accept it as a new ledger)",
			keyFingerprint(pub), byKey.Origin, old.Size, byKey.SeenAt, cp.Origin, cp.Size, keyFile)
	}
	originFile := s.originPath(cp.Origin)
	byOrigin, err := loadSeen(originFile)
	if err != nil {
		return "", false, err
	}
	how = "first checkpoint seen for this origin and key"
	for _, seen := range []*seenCheckpoint{byOrigin, byKey} {
		if seen == nil || (seen == byKey && byOrigin != nil && byOrigin.Note == byKey.Note) {
			continue
		}
		file := originFile
		if seen == byKey {
			file = keyFile
		}
		got, err := checkAgainstSeen(ctx, h, file, seen, cp, pub)
		if errors.Is(err, errOlder) {
			older = true
		} else if err != nil {
			return "", false, err
		}
		if seen == byOrigin || byOrigin == nil {
			how = got
		}
	}
	return how, older, nil
}

// seenByKey returns the checkpoint remembered for pub and its file, or
// nil. State written before checkpoints were remembered per key has none:
// then every checkpoint remembered per origin that pub signed stands for
// it, one of another origin first, so that upgrading keeps a key to the
// origin it was seen under.
func (s checkpointState) seenByKey(pub ed25519.PublicKey) (*seenCheckpoint, string, error) {
	file := s.keyPath(pub)
	seen, err := loadSeen(file)
	if err != nil || seen != nil {
		return seen, file, err
	}
	files, err := filepath.Glob(filepath.Join(s.dir, "*.json"))
	if err != nil {
		return nil, "", err
	}
	var found *seenCheckpoint
	for _, f := range files {
		old, err := loadSeen(f)
		if err != nil {
			return nil, "", err
		}
		if old == nil {
			continue // removed meanwhile
		}
		peek, err := ledger.PeekCheckpoint([]byte(old.Note))
		if err != nil || f != s.originPath(peek.Origin) {
			continue // not a checkpoint remembered for its origin
		}
		if _, err := openSigned(kernel.SignedCheckpoint{Origin: peek.Origin, Note: old.Note}, pub); err != nil {
			continue // another key's
		}
		old.Origin = peek.Origin
		if found == nil || found.Origin == old.Origin {
			found, file = old, f
		} else {
			return nil, "", fmt.Errorf("ORIGIN CHANGED: key %s signed the remembered checkpoints of origins %q (%s) and %q (%s); remove the one that is not this ledger's",
				keyFingerprint(pub), found.Origin, file, old.Origin, f)
		}
	}
	return found, file, nil
}

// save remembers the checkpoint note of cp for its origin and its key.
func (s checkpointState) save(cp ledger.Checkpoint, note string, pub ed25519.PublicKey) error {
	now := time.Now().UTC().Format(time.RFC3339)
	if err := saveSeen(s.keyPath(pub), seenCheckpoint{Origin: cp.Origin, Note: note, SeenAt: now}); err != nil {
		return err
	}
	return saveSeen(s.originPath(cp.Origin), seenCheckpoint{Note: note, SeenAt: now})
}

// loadSeen reads the checkpoint remembered in path, or nil if none is.
func loadSeen(path string) (*seenCheckpoint, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var seen seenCheckpoint
	if err := json.Unmarshal(b, &seen); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &seen, nil
}

// errOlder is checkAgainstSeen's answer for a checkpoint consistent with
// the one remembered but older, which is not remembered in its place.
var errOlder = errors.New("older than the checkpoint remembered")

// checkAgainstSeen proves cp consistent with seen, the checkpoint
// remembered in path, and says how (with errOlder when cp is a proven
// prefix of seen).
func checkAgainstSeen(ctx context.Context, h history, path string, seen *seenCheckpoint, cp ledger.Checkpoint, pub ed25519.PublicKey) (string, error) {
	old, err := openSigned(kernel.SignedCheckpoint{Origin: cp.Origin, Note: seen.Note}, pub)
	if err != nil {
		return "", fmt.Errorf("remembered checkpoint %s: %w", path, err)
	}
	switch {
	case cp.Size < old.Size:
		// An older checkpoint (the stable one after the latest, or a
		// cached answer): it must be a prefix of the one seen, which the
		// kernel proves; a truncated or rewritten ledger cannot.
		p, err := h.ProveConsistency(ctx, cp.Size, old.Size)
		var unreachable *url.Error
		if errors.As(err, &unreachable) {
			return "", err // no answer, no evidence either way
		}
		if err != nil {
			return "", fmt.Errorf("INCONSISTENT: the checkpoint has %d entries, fewer than the %d of the checkpoint seen at %s, and the kernel proves no extension of it to that one (truncated or rewritten): %v", cp.Size, old.Size, seen.SeenAt, err)
		}
		if err := p.VerifySizes(cp.Size, old.Size, cp.Root, old.Root); err != nil {
			return "", fmt.Errorf("INCONSISTENT: the checkpoint of size %d is no prefix of the checkpoint of size %d seen at %s (rewritten): %w", cp.Size, old.Size, seen.SeenAt, err)
		}
		return fmt.Sprintf("older than the checkpoint of size %d seen at %s, which is proved an extension of it (%d hashes); that one stays remembered", old.Size, seen.SeenAt, len(p.Proof)), errOlder
	case cp.Size == old.Size:
		if cp.Root != old.Root {
			return "", fmt.Errorf("FORK: two signed checkpoints of size %d with roots %s (seen at %s) and %s", cp.Size, digest.Format(old.Root), seen.SeenAt, digest.Format(cp.Root))
		}
		return fmt.Sprintf("same as the checkpoint seen at %s", seen.SeenAt), nil
	}
	p, err := h.ProveConsistency(ctx, old.Size, cp.Size)
	if err != nil {
		return "", err
	}
	if err := p.VerifySizes(old.Size, cp.Size, old.Root, cp.Root); err != nil {
		return "", fmt.Errorf("INCONSISTENT with the checkpoint of size %d seen at %s: %w", old.Size, seen.SeenAt, err)
	}
	return fmt.Sprintf("proved an extension of the checkpoint of size %d seen at %s (%d hashes)", old.Size, seen.SeenAt, len(p.Proof)), nil
}

func saveSeen(path string, seen seenCheckpoint) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	b, _ := json.Marshal(seen)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
