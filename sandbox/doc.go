// Package sandbox runs a command under bubblewrap with writes to its
// read-write roots staged, for proc.exec. (Full documentation below.)
package sandbox
