package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/capkernel/capkernel/sandbox"
)

// checkReadOnly refuses a `run --ro` path that would show the agent what
// only the kernel may read: a path that is, holds or lies in the kernel's
// data dir (data, "" for --server: its keys, its admin credential, its
// control socket, which acts as the admin for a request without a
// credential), or that is or holds the token file (tokenFile, "-" for
// stdin). Paths are compared with their links resolved, relative ones
// against the working directory. The sandbox itself refuses and hides
// the rest (secret names, sockets, fifos, devices, "/": sandbox.Profile).
func checkReadOnly(paths []string, data, tokenFile string) error {
	var dataReal, tokenReal string
	var err error
	if data != "" {
		if dataReal, err = resolve(data); err != nil {
			return fmt.Errorf("run: --data: %w", err)
		}
	}
	if tokenFile != "" && tokenFile != "-" {
		if tokenReal, err = resolve(tokenFile); err != nil {
			return fmt.Errorf("run: --token: %w", err)
		}
	}
	// Where they are visible, through mounts too (a bind mount of the
	// data dir, or of a file in it, elsewhere: sandbox.VisibleAt).
	var dataSeen, tokenSeen []string
	if dataReal != "" {
		dataSeen = sandbox.VisibleAt(dataReal)
	}
	if tokenReal != "" {
		tokenSeen = sandbox.VisibleAt(tokenReal)
	}
	// What the sandbox shows every agent whole (/usr and the like) is
	// read-only to it as --ro paths are.
	for _, sys := range systemDirs() {
		for _, at := range dataSeen {
			if inside(at, sys) {
				return usagef("run: the kernel's data dir %s is seen at %s, in %s, which the sandbox shows every agent: the agent would read its keys and admin credential; move the data dir out", data, at, sys)
			}
		}
		for _, at := range tokenSeen {
			if inside(at, sys) {
				return usagef("run: the token file %s is seen at %s, in %s, which the sandbox shows every agent: move it out", tokenFile, at, sys)
			}
		}
	}
	for _, ro := range paths {
		real, err := resolve(ro)
		if err != nil {
			return usagef("run: --ro %s: %v", ro, err)
		}
		// A mount of it (besides its own path), holding the --ro path or
		// held by it.
		dataHere, tokenHere := false, false
		for _, at := range dataSeen[min(1, len(dataSeen)):] {
			dataHere = dataHere || inside(at, real) || inside(real, at)
		}
		for _, at := range tokenSeen[min(1, len(tokenSeen)):] {
			tokenHere = tokenHere || inside(at, real)
		}
		switch {
		case dataHere:
			return usagef("run: --ro %s reaches a mount of the kernel's data dir %s: the agent would read its keys and admin credential", ro, data)
		case tokenHere:
			return usagef("run: --ro %s holds a mount of the token file %s: the agent reaches the kernel through the channel alone", ro, tokenFile)
		case dataReal != "" && (inside(real, dataReal) || inside(dataReal, real)):
			what := "holds"
			if inside(real, dataReal) {
				what = "is in"
			}
			return usagef("run: --ro %s %s the kernel's data dir %s: the agent would read its keys and admin credential and reach its control socket", ro, what, data)
		case tokenReal != "" && inside(tokenReal, real):
			return usagef("run: --ro %s holds the token file %s: the agent reaches the kernel through the channel alone, never with a token of its own", ro, tokenFile)
		}
	}
	return nil
}

// resolve is path made absolute, with its links resolved.
func resolve(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	return filepath.EvalSymlinks(abs)
}

// inside reports whether p is dir or lies under it (both clean, absolute).
func inside(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// systemDirs is sandbox.SystemDirs (a test stands another in).
var systemDirs = sandbox.SystemDirs
