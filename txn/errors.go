package txn

import "fmt"

// Error is a refusal of a transaction step that the caller reports to the
// agent as a result: Class is one of the kernel's error classes.
type Error struct {
	Class   string
	Message string
}

func (e *Error) Error() string { return e.Class + ": " + e.Message }

// Error classes this package produces.
const (
	ClassConflict     = "idempotency_conflict"
	ClassInFlight     = "idempotency_in_flight"
	ClassPrecondition = "precondition_failed"
	ClassBudget       = "budget_exceeded"
	ClassInvalidArgs  = "invalid_args"
)

func refuse(class, format string, args ...any) *Error {
	return &Error{Class: class, Message: fmt.Sprintf(format, args...)}
}
