// Package chaos holds capkernel's fault-injection suite (chaos_test.go):
// kernelctl serve runs under strace's syscall tampering (-e inject=…),
// which makes fdatasync, pwrite64, write, renameat or syncfs fail with EIO
// or ENOSPC at varying points while clients send mutating calls; then the
// kernel restarts without injection and the suite checks that nothing
// acknowledged was lost, no idempotency key committed twice, no answer
// contradicts the ledger, no staging file or in-flight key was left, and
// that kernelctl ledger verify, replay verify and workspace verify pass.
// `make test` runs a short version, `make chaos` the long one
// (go test ./internal/chaos -args -chaos.long).
package chaos
