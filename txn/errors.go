package txn

import (
	"errors"
	"fmt"
)

// Error is a refusal of a transaction step that the caller reports to the
// agent as a result: Class is one of the kernel's error classes.
type Error struct {
	Class   string
	Message string
	cause   error // what errors.Is finds besides the Error itself
}

func (e *Error) Error() string { return e.Class + ": " + e.Message }

// Unwrap returns the refusal's cause, such as ErrOperationUsed.
func (e *Error) Unwrap() error { return e.cause }

// ErrOperationUsed is the cause of the refusal of a call naming an
// operation id another call's record or intent has: the refusal must not
// be recorded under that id.
var ErrOperationUsed = errors.New("operation_id is already used")

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
