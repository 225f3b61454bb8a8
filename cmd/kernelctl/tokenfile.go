package main

import (
	"errors"
	"fmt"
	"strings"
)

// readToken reads the capability token in the file given to flag ("-" is
// standard input) and checks its form, so that a file holding something
// else (token mint --json's output, the admin credential, a token broken
// over lines) is refused naming the flag and the file and saying what it
// holds, before it reaches an HTTP header or the kernel. Surrounding white
// space is trimmed, as readSecret does.
func readToken(flag, path string) (string, error) {
	name := path
	if path == "-" {
		name = "- (standard input)"
	}
	tok, err := readSecret(path)
	if err != nil {
		return "", fmt.Errorf("%s %s: %w", flag, name, unwrapPath(err))
	}
	if err := tokenForm(tok); err != nil {
		return "", fmt.Errorf("%s %s is not a capability token: %w", flag, name, err)
	}
	return tok, nil
}

// tokenForm checks that tok has the form of a capability token: one
// compact JWS, three base64url parts joined by dots and nothing else. Its
// error says what tok is instead.
func tokenForm(tok string) error {
	switch {
	case strings.HasPrefix(tok, "{"):
		return errors.New("it holds JSON, not the token alone (token mint --json prints JSON; save what token mint prints without --json)")
	case looksLikeAdmin(tok):
		return errors.New("it holds the admin credential, which makes no calls; give a capability token, what token mint prints (the verbs that take the admin credential take it with --admin-token FILE or env " + envAdmin + ")")
	}
	for i, r := range tok {
		if !isBase64URL(r) && r != '.' {
			what := fmt.Sprintf("%q", r)
			if r == '\n' || r == '\r' {
				what = "a line break"
			}
			return fmt.Errorf("a compact JWS is one line of base64url parts joined by dots, and it holds %s at byte %d (save what token mint prints, without --json)", what, i)
		}
	}
	if n := strings.Count(tok, ".") + 1; n != 3 {
		return fmt.Errorf("a compact JWS has 3 parts joined by dots, and it has %d", n)
	}
	return nil
}

// isBase64URL reports whether r is a character of unpadded base64url.
func isBase64URL(r rune) bool {
	return 'A' <= r && r <= 'Z' || 'a' <= r && r <= 'z' || '0' <= r && r <= '9' || r == '-' || r == '_'
}
