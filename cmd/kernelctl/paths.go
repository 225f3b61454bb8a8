package main

import (
	"os"
	"path/filepath"
)

// bundleDir resolves the policy bundle dir given to flag (a flag name, or
// "" for an argument) against the working directory, as every relative
// path on kernelctl's command line is, and checks it is a directory. Its
// errors name the path as given and as resolved. An empty dir (the default
// bundle) is returned as it is.
func bundleDir(flag, dir string) (string, error) {
	if dir == "" {
		return "", nil
	}
	if flag != "" {
		flag += " "
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", usagef("%s%s: %v", flag, dir, err)
	}
	fi, err := os.Stat(abs)
	switch {
	case err != nil:
		return "", usagef("%s%s (%s, from the working directory): %v", flag, dir, abs, unwrapPath(err))
	case !fi.IsDir():
		return "", usagef("%s%s (%s): not a directory; give the bundle's directory", flag, dir, abs)
	}
	return abs, nil
}

// unwrapPath drops the path an *os.PathError repeats, keeping its cause.
func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}
