package pserver

// #include <stdlib.h>
// #include <string.h>
// #include "pserver.h"
import "C"

import (
	"fmt"
	"unsafe"
)

// DType is a parameter's element type, numbered like pserver_dtype_t (and
// the wire and checkpoint format).
type DType int32

// The element types parameters can have.
const (
	Int32   DType = 1
	Uint32  DType = 2
	Int64   DType = 3
	Uint64  DType = 4
	Float32 DType = 5
	Float64 DType = 6
)

// String is "float32", "int64", ...; "unknown" for anything else.
func (d DType) String() string { return C.GoString(C.pserver_dtype_name(C.int32_t(d))) }

// Size is the bytes per element; 0 for a type parameters cannot have.
func (d DType) Size() int { return int(C.pserver_dtype_size(C.int32_t(d))) }

// Element is a Go type a parameter's elements can have.
type Element interface {
	float32 | float64 | int32 | uint32 | int64 | uint64
}

// DTypeOf is the DType of T.
func DTypeOf[T Element]() DType {
	var zero T
	switch any(zero).(type) {
	case float32:
		return Float32
	case float64:
		return Float64
	case int32:
		return Int32
	case uint32:
		return Uint32
	case int64:
		return Int64
	default:
		return Uint64
	}
}

// Tensor is a dense, row-major array: a typed Go slice ([]float32,
// []float64, []int32, []uint32, []int64 or []uint64) and its shape. A
// Tensor is a plain value: one goroutine at a time.
type Tensor struct {
	dtype DType
	shape []int64
	value interface{}
}

// NewTensor wraps values (not copied) with the given shape; no shape means
// a vector of len(values). INVALID_ARGUMENT when the shape does not hold
// exactly len(values) elements.
func NewTensor[T Element](values []T, shape ...int64) (*Tensor, error) {
	if len(shape) == 0 {
		shape = []int64{int64(len(values))}
	}
	n, err := numElements(shape)
	if err != nil {
		return nil, err
	}
	if n != int64(len(values)) {
		return nil, invalidArgument("shape %v holds %d elements, got %d values", shape, n, len(values))
	}
	return &Tensor{dtype: DTypeOf[T](), shape: append([]int64(nil), shape...), value: values}, nil
}

// Vector is a tensor of shape [len(values)] holding values (not copied):
// NewTensor for the common case, which cannot fail.
//
//	g := pserver.Vector[float32](1, -1, 0.5)
func Vector[T Element](values ...T) *Tensor {
	return &Tensor{dtype: DTypeOf[T](), shape: []int64{int64(len(values))}, value: values}
}

// Scalar is a tensor of shape [] holding v.
func Scalar[T Element](v T) *Tensor {
	return &Tensor{dtype: DTypeOf[T](), shape: []int64{}, value: []T{v}}
}

// Values is t's elements as a []T (not copied); INVALID_ARGUMENT when t's
// type is not T.
func Values[T Element](t *Tensor) ([]T, error) {
	v, ok := t.value.([]T)
	if !ok {
		return nil, invalidArgument("tensor is %s, not %s", t.dtype, DTypeOf[T]())
	}
	return v, nil
}

// DType is the element type.
func (t *Tensor) DType() DType { return t.dtype }

// Shape is the dimensions (a copy); empty for a scalar.
func (t *Tensor) Shape() []int64 { return append([]int64{}, t.shape...) }

// Value is the typed slice ([]float32, ...), not copied.
func (t *Tensor) Value() interface{} { return t.value }

// NumElements is the product of the dimensions.
func (t *Tensor) NumElements() int { n, _ := numElements(t.shape); return int(n) }

// Bytes is a copy of the elements' memory (little-endian on every platform
// pserver runs on): the bytes the server and checkpoints hold.
func (t *Tensor) Bytes() []byte {
	p, n := t.mem()
	if n == 0 {
		return []byte{}
	}
	return append([]byte(nil), unsafe.Slice((*byte)(p), n)...)
}

func (t *Tensor) String() string {
	return fmt.Sprintf("Tensor(%s%v %v)", t.dtype, t.shape, t.value)
}

// mem is the address and byte size of the elements (nil, 0 when empty).
func (t *Tensor) mem() (unsafe.Pointer, int) {
	switch s := t.value.(type) {
	case []float32:
		return slicePtr(s), len(s) * 4
	case []float64:
		return slicePtr(s), len(s) * 8
	case []int32:
		return slicePtr(s), len(s) * 4
	case []uint32:
		return slicePtr(s), len(s) * 4
	case []int64:
		return slicePtr(s), len(s) * 8
	case []uint64:
		return slicePtr(s), len(s) * 8
	}
	return nil, 0
}

// cMem is mem() for a C call: the tensor's own memory, passed for the call
// only. cgo allows it (the elements hold no Go pointers and the library
// keeps none after the call); runtime.KeepAlive(t) once the call returns.
func (t *Tensor) cMem() (unsafe.Pointer, C.size_t) {
	p, n := t.mem()
	return p, C.size_t(n)
}

func slicePtr[T Element](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Pointer(&s[0])
}

func numElements(shape []int64) (int64, error) {
	n := int64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, invalidArgument("negative dimension in shape %v", shape)
		}
		n *= d
	}
	return n, nil
}

// newTensor allocates a zeroed tensor of dtype and shape.
func newTensor(dtype DType, shape []int64) (*Tensor, error) {
	n64, err := numElements(shape)
	if err != nil {
		return nil, err
	}
	n := int(n64)
	var v interface{}
	switch dtype {
	case Float32:
		v = make([]float32, n)
	case Float64:
		v = make([]float64, n)
	case Int32:
		v = make([]int32, n)
	case Uint32:
		v = make([]uint32, n)
	case Int64:
		v = make([]int64, n)
	case Uint64:
		v = make([]uint64, n)
	default:
		return nil, invalidArgument("unsupported element type %d", int32(dtype))
	}
	return &Tensor{dtype: dtype, shape: append([]int64{}, shape...), value: v}, nil
}

// cBuf is C memory holding a copy of a tensor (input) or room for one
// (output), so that C never sees Go memory it could keep.
type cBuf struct {
	p unsafe.Pointer
	n int
}

func (b cBuf) size() C.size_t { return C.size_t(b.n) }

func (b cBuf) free() { C.free(b.p) }

// cAlloc is n bytes of C memory (at least 1, so never NULL).
func cAlloc(n int) cBuf {
	m := n
	if m == 0 {
		m = 1
	}
	return cBuf{p: C.malloc(C.size_t(m)), n: n}
}

// cCopy is a C copy of t's elements.
func cCopy(t *Tensor) cBuf {
	p, n := t.mem()
	b := cAlloc(n)
	if n > 0 {
		C.memcpy(b.p, p, C.size_t(n))
	}
	return b
}

// copyTo copies the C buffer into t's elements (same byte size).
func (b cBuf) copyTo(t *Tensor) {
	p, n := t.mem()
	if n > 0 {
		C.memcpy(p, b.p, C.size_t(n))
	}
}

// cShape is a C copy of a shape (never NULL).
func cShape(shape []int64) (*C.int64_t, func()) {
	b := cAlloc(8 * len(shape))
	for i, d := range shape {
		*(*C.int64_t)(unsafe.Add(b.p, 8*i)) = C.int64_t(d)
	}
	return (*C.int64_t)(b.p), b.free
}

// infoFunc is pserver_client_param_info or pserver_checkpoint_reader_param_info.
type infoFunc func(dtype *C.int32_t, shape *C.int64_t, capacity C.size_t, ndim *C.size_t, st *C.pserver_status_t)

// paramInfo calls f, growing the shape array if the parameter has more
// than 8 dimensions. The outputs are C memory.
func paramInfo(f infoFunc) (DType, []int64, error) {
	out := cAlloc(4 + 8 + 8*8)
	defer out.free()
	dtype := (*C.int32_t)(out.p)
	ndim := (*C.size_t)(unsafe.Add(out.p, 8))
	capacity := 8
	shape := (*C.int64_t)(unsafe.Add(out.p, 16))
	var big cBuf
	defer func() {
		if big.p != nil {
			big.free()
		}
	}()
	for {
		if err := cCall(func(st *C.pserver_status_t) { f(dtype, shape, C.size_t(capacity), ndim, st) }); err != nil {
			return 0, nil, err
		}
		if int(*ndim) <= capacity {
			break
		}
		capacity = int(*ndim)
		big = cAlloc(8 * capacity)
		shape = (*C.int64_t)(big.p)
	}
	dims := make([]int64, int(*ndim))
	for i := range dims {
		dims[i] = int64(*(*C.int64_t)(unsafe.Add(unsafe.Pointer(shape), 8*i)))
	}
	return DType(*dtype), dims, nil
}
