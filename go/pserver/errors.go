package pserver

// #include <stdlib.h>
// #include "pserver.h"
import "C"

import (
	"context"
	"errors"
	"fmt"
)

// Code is a status code, numbered like absl::StatusCode and gRPC's codes
// (pserver_code_t in pserver.h).
type Code int32

// The status codes.
const (
	OK                 Code = 0
	Canceled           Code = 1
	Unknown            Code = 2
	InvalidArgument    Code = 3
	DeadlineExceeded   Code = 4
	NotFound           Code = 5
	AlreadyExists      Code = 6
	PermissionDenied   Code = 7
	ResourceExhausted  Code = 8
	FailedPrecondition Code = 9
	Aborted            Code = 10
	OutOfRange         Code = 11
	Unimplemented      Code = 12
	Internal           Code = 13
	Unavailable        Code = 14
	DataLoss           Code = 15
	Unauthenticated    Code = 16
)

// String is the code's name: "INVALID_ARGUMENT", "NOT_FOUND", ...
func (c Code) String() string { return C.GoString(C.pserver_code_name(C.int32_t(c))) }

// Error is a failed call: its code and the library's message. Match it with
// errors.Is against the Err* sentinels (which compare codes) or with
// errors.As to read Code and Msg:
//
//	if errors.Is(err, pserver.ErrNotFound) { ... }
type Error struct {
	Code Code
	Msg  string

	cause error // context.DeadlineExceeded or context.Canceled, for errors.Is
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return e.Code.String()
	}
	return e.Code.String() + ": " + e.Msg
}

// Is reports whether target is an *Error with the same code; a target with a
// message (ErrClosed) must match it too.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	return t.Code == e.Code && (t.Msg == "" || t.Msg == e.Msg)
}

// Unwrap gives the context error behind a DEADLINE_EXCEEDED or CANCELLED
// that came from a call's ctx, so errors.Is(err, context.DeadlineExceeded)
// holds too.
func (e *Error) Unwrap() error { return e.cause }

// Sentinels for errors.Is: each matches every *Error of its code.
var (
	ErrCanceled           = &Error{Code: Canceled}
	ErrUnknown            = &Error{Code: Unknown}
	ErrInvalidArgument    = &Error{Code: InvalidArgument}
	ErrDeadlineExceeded   = &Error{Code: DeadlineExceeded}
	ErrNotFound           = &Error{Code: NotFound}
	ErrAlreadyExists      = &Error{Code: AlreadyExists}
	ErrPermissionDenied   = &Error{Code: PermissionDenied}
	ErrResourceExhausted  = &Error{Code: ResourceExhausted}
	ErrFailedPrecondition = &Error{Code: FailedPrecondition}
	ErrAborted            = &Error{Code: Aborted}
	ErrOutOfRange         = &Error{Code: OutOfRange}
	ErrUnimplemented      = &Error{Code: Unimplemented}
	ErrInternal           = &Error{Code: Internal}
	ErrUnavailable        = &Error{Code: Unavailable}
	ErrDataLoss           = &Error{Code: DataLoss}
	ErrUnauthenticated    = &Error{Code: Unauthenticated}

	// ErrAlreadyInitialized: a second init of a parameter
	// ("pserver already initialized"); an ALREADY_EXISTS.
	ErrAlreadyInitialized = ErrAlreadyExists
	// ErrUninitialized: a read or gradient before FinishInit
	// ("pserver not fully initialized"); a FAILED_PRECONDITION.
	ErrUninitialized = ErrFailedPrecondition
	// ErrClosed: a method called after Close. It is a FAILED_PRECONDITION
	// too, but only errors.Is(err, ErrClosed) tells it apart.
	ErrClosed = &Error{Code: FailedPrecondition, Msg: "pserver: handle is closed"}
)

// statusError turns a pserver_status_t into nil or an *Error.
func statusError(st *C.pserver_status_t) error {
	code := Code(C.pserver_status_code(st))
	if code == OK {
		return nil
	}
	return &Error{Code: code, Msg: C.GoString(C.pserver_status_message(st))}
}

// contextError is the *Error for a call whose ctx ended first.
func contextError(err error) error {
	code := Canceled
	if errors.Is(err, context.DeadlineExceeded) {
		code = DeadlineExceeded
	}
	return &Error{Code: code, Msg: err.Error(), cause: err}
}

func invalidArgument(format string, args ...interface{}) error {
	return &Error{Code: InvalidArgument, Msg: fmt.Sprintf(format, args...)}
}

// cCall runs f with a fresh status and returns its error.
func cCall(f func(st *C.pserver_status_t)) error {
	st := C.pserver_status_new()
	defer C.pserver_status_delete(st)
	f(st)
	return statusError(st)
}
