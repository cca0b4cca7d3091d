package pserver

// #include <stdlib.h>
// #include <string.h>
// #include "pserver.h"
import "C"

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"unsafe"
)

// CheckpointReader reads checkpoints as servers write them. Safe for
// concurrent use.
type CheckpointReader struct {
	r      *C.pserver_checkpoint_reader_t
	life   lifecycle
	paths  []string
	names  []string
	tables []string
}

// OpenCheckpoint opens path, one of: a checkpoint directory (ckpt-<seq>,
// holding a MANIFEST); a server's checkpoint directory (its newest
// checkpoint is opened); or a directory of such server directories, one per
// shard (parameters cut into blocks over several shards are put back
// together). Opening reads and checks the manifests only; reads verify the
// checksums of what they read. ErrNotFound when there is no checkpoint at
// path, ErrDataLoss for a damaged manifest or one that is not a regular file
// (a FIFO is refused, never waited on). Verify checks only the checkpoints
// opened (the newest good one per shard); VerifyCheckpoints checks them all.
func OpenCheckpoint(path string) (*CheckpointReader, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var r *C.pserver_checkpoint_reader_t
	if err := cCall(func(st *C.pserver_status_t) { r = C.pserver_checkpoint_reader_new(cpath, st) }); err != nil {
		return nil, fmt.Errorf("pserver: open checkpoint %q: %w", path, err)
	}
	cr := &CheckpointReader{r: r}
	for i := C.size_t(0); i < C.pserver_checkpoint_reader_num_checkpoints(r); i++ {
		cr.paths = append(cr.paths, C.GoString(C.pserver_checkpoint_reader_checkpoint_path(r, i)))
	}
	for i := C.size_t(0); i < C.pserver_checkpoint_reader_num_params(r); i++ {
		var n C.size_t
		p := C.pserver_checkpoint_reader_param_name(r, i, &n)
		cr.names = append(cr.names, C.GoStringN(p, C.int(n)))
	}
	for i := C.size_t(0); i < C.pserver_checkpoint_reader_num_tables(r); i++ {
		var n C.size_t
		p := C.pserver_checkpoint_reader_table_name(r, i, &n)
		cr.tables = append(cr.tables, C.GoStringN(p, C.int(n)))
	}
	runtime.SetFinalizer(cr, func(cr *CheckpointReader) { cr.Close() })
	return cr, nil
}

// Checkpoints is the directory of every checkpoint opened (one per shard).
func (cr *CheckpointReader) Checkpoints() []string { return append([]string(nil), cr.paths...) }

// Names is the parameters, sorted.
func (cr *CheckpointReader) Names() []string { return append([]string(nil), cr.names...) }

// Info is a parameter's element type and shape; ErrNotFound for an
// unknown name.
func (cr *CheckpointReader) Info(name string) (DType, []int64, error) {
	if err := cr.life.begin(); err != nil {
		return 0, nil, fmt.Errorf("pserver: checkpoint info %q: %w", name, err)
	}
	defer cr.life.end()
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	dtype, shape, err := paramInfo(func(d *C.int32_t, s *C.int64_t, capacity C.size_t, n *C.size_t, st *C.pserver_status_t) {
		C.pserver_checkpoint_reader_param_info(cr.r, cname, C.size_t(len(name)), d, s, capacity, n, st)
	})
	if err != nil {
		return 0, nil, fmt.Errorf("pserver: checkpoint info %q: %w", name, err)
	}
	return dtype, shape, nil
}

// Read reads a parameter (every block, every checksum verified) into a new
// tensor. ErrDataLoss for damaged data or missing blocks.
func (cr *CheckpointReader) Read(name string) (*Tensor, error) {
	dtype, shape, err := cr.Info(name)
	if err != nil {
		return nil, err
	}
	out, err := newTensor(dtype, shape)
	if err != nil {
		return nil, fmt.Errorf("pserver: read checkpoint %q: %w", name, err)
	}
	if err := cr.life.begin(); err != nil {
		return nil, fmt.Errorf("pserver: read checkpoint %q: %w", name, err)
	}
	defer cr.life.end()
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	_, n := out.mem()
	buf := cAlloc(n)
	defer buf.free()
	if err := cCall(func(st *C.pserver_status_t) {
		C.pserver_checkpoint_reader_read(cr.r, cname, C.size_t(len(name)), C.int32_t(dtype), buf.p, buf.size(), st)
	}); err != nil {
		return nil, fmt.Errorf("pserver: read checkpoint %q: %w", name, err)
	}
	buf.copyTo(out)
	return out, nil
}

// ReadAll reads every parameter.
func (cr *CheckpointReader) ReadAll() (map[string]*Tensor, error) {
	all := make(map[string]*Tensor, len(cr.names))
	for _, name := range cr.names {
		t, err := cr.Read(name)
		if err != nil {
			return nil, err
		}
		all[name] = t
	}
	return all, nil
}

// Tables is the tables in the checkpoints (sparse and KV tables), sorted.
func (cr *CheckpointReader) Tables() []string { return append([]string(nil), cr.tables...) }

// ReadTable reads table name's rows over every shard, sorted by key: the
// keys, and the values as a Float32 or Float64 tensor of shape
// [len(keys), dim]. ErrNotFound for an unknown table, ErrDataLoss for
// damaged data.
func (cr *CheckpointReader) ReadTable(name string) ([]uint64, *Tensor, error) {
	if err := cr.life.begin(); err != nil {
		return nil, nil, fmt.Errorf("pserver: read checkpoint table %q: %w", name, err)
	}
	defer cr.life.end()
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	info := cAlloc(24)
	defer info.free()
	dim, dtype, rows := (*C.uint32_t)(info.p), (*C.int32_t)(unsafe.Add(info.p, 4)), (*C.uint64_t)(unsafe.Add(info.p, 8))
	if err := cCall(func(st *C.pserver_status_t) {
		C.pserver_checkpoint_reader_table_info(cr.r, cname, C.size_t(len(name)), dim, dtype, rows, st)
	}); err != nil {
		return nil, nil, fmt.Errorf("pserver: read checkpoint table %q: %w", name, err)
	}
	n := int(*rows)
	values, err := newTensor(DType(*dtype), []int64{int64(n), int64(*dim)})
	if err != nil {
		return nil, nil, fmt.Errorf("pserver: read checkpoint table %q: %w", name, err)
	}
	kbuf := cAlloc(8 * n)
	defer kbuf.free()
	_, vn := values.mem()
	vbuf := cAlloc(vn)
	defer vbuf.free()
	if err := cCall(func(st *C.pserver_status_t) {
		C.pserver_checkpoint_reader_read_table(cr.r, cname, C.size_t(len(name)), (*C.uint64_t)(kbuf.p), kbuf.size(), vbuf.p, vbuf.size(), st)
	}); err != nil {
		return nil, nil, fmt.Errorf("pserver: read checkpoint table %q: %w", name, err)
	}
	keys := make([]uint64, n)
	if n > 0 {
		C.memcpy(unsafe.Pointer(&keys[0]), kbuf.p, C.size_t(8*n))
	}
	vbuf.copyTo(values)
	return keys, values, nil
}

// Verify checks every data file and chunk of every opened checkpoint;
// ErrDataLoss names the first damaged file.
func (cr *CheckpointReader) Verify() error {
	if err := cr.life.begin(); err != nil {
		return fmt.Errorf("pserver: verify checkpoint: %w", err)
	}
	defer cr.life.end()
	if err := cCall(func(st *C.pserver_status_t) { C.pserver_checkpoint_reader_verify(cr.r, st) }); err != nil {
		return fmt.Errorf("pserver: verify checkpoint: %w", err)
	}
	return nil
}

// CheckpointVerification is what verifying one checkpoint directory found.
type CheckpointVerification struct {
	Path string
	Err  error // nil when every checksum verified
}

// VerifyCheckpoints verifies every checkpoint at path, not only the newest of
// each shard: path itself if it is a checkpoint (holds a MANIFEST), else
// every ckpt-* directory in it, else every ckpt-* directory in each of its
// subdirectories (one per shard). Each result says whether that checkpoint
// verified; the error is for path itself (ErrNotFound when it holds no
// checkpoint, ErrFailedPrecondition when it is not a directory). Nothing is
// opened that might block: files that are not regular files (a FIFO) fail
// their checkpoint with ErrDataLoss, and ckpt-* symbolic links are not
// followed, as servers do.
func VerifyCheckpoints(path string) ([]CheckpointVerification, error) {
	paths, err := checkpointDirs(path)
	if err != nil {
		return nil, fmt.Errorf("pserver: verify checkpoints: %w", err)
	}
	results := make([]CheckpointVerification, 0, len(paths))
	for _, p := range paths {
		results = append(results, CheckpointVerification{Path: p, Err: verifyOne(p)})
	}
	return results, nil
}

func verifyOne(path string) error {
	r, err := OpenCheckpoint(path)
	if err != nil {
		return err
	}
	defer r.Close()
	return r.Verify()
}

var checkpointName = regexp.MustCompile(`^ckpt-[0-9]{20}$`)

// checkpointDirs is every checkpoint directory at path, sorted.
func checkpointDirs(path string) ([]string, error) {
	info, err := os.Stat(path) // a directory named by the caller may be a link
	if err != nil {
		if os.IsNotExist(err) {
			return nil, &Error{Code: NotFound, Msg: "no checkpoint at " + path + ": it does not exist"}
		}
		return nil, &Error{Code: FailedPrecondition, Msg: err.Error()}
	}
	if !info.IsDir() {
		return nil, &Error{Code: FailedPrecondition, Msg: path + " is not a directory"}
	}
	if _, err := os.Lstat(filepath.Join(path, "MANIFEST")); err == nil {
		return []string{path}, nil
	}
	own, err := checkpointsIn(path)
	if err != nil || len(own) > 0 {
		return own, err
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, &Error{Code: FailedPrecondition, Msg: err.Error()}
	}
	var all []string
	for _, e := range entries {
		if !e.IsDir() { // Lstat semantics: links are not followed
			continue
		}
		shard, err := checkpointsIn(filepath.Join(path, e.Name()))
		if err != nil {
			return nil, err
		}
		all = append(all, shard...)
	}
	if len(all) == 0 {
		return nil, &Error{Code: NotFound, Msg: "no checkpoint at " + path +
			": no MANIFEST, no ckpt-* directory in it or in its subdirectories"}
	}
	return all, nil
}

// checkpointsIn is the ckpt-<20 digits> directories in dir, oldest first.
func checkpointsIn(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, &Error{Code: FailedPrecondition, Msg: err.Error()}
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && checkpointName.MatchString(e.Name()) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	sort.Strings(out) // 20 digits: names sort as sequences
	return out, nil
}

// Close frees the reader; safe to call twice.
func (cr *CheckpointReader) Close() error {
	if cr.life.close(func() { C.pserver_checkpoint_reader_delete(cr.r); cr.r = nil }) {
		runtime.SetFinalizer(cr, nil)
	}
	return nil
}

// Version is the library's version, e.g. "0.5.0" (pserver.h's PSERVER_VERSION_*).
func Version() string { return C.GoString(C.pserver_version()) }

// ReshardCheckpoints rewrites the checkpoints a cluster of N servers wrote
// into from (its --checkpoint_dir, holding shard-0 .. shard-<N-1>) as the
// checkpoints a cluster of servers (M, 1 .. 4096) servers loads, into to
// (which must not exist or be an empty directory): every parameter block,
// table row with its optimizer state, and held-back BSP add goes where M
// servers look for it; workers' clocks are kept (the lowest where shards
// disagree); exactly-once sets are dropped, so restart the job's clients.
// Of each shard the newest checkpoint that verifies whole is read. On an
// error nothing is left at to. Progress lines go to progress (nil: none).
// ErrFailedPrecondition for a missing shard, checkpoints of different
// clusters or server counts, or a to that is not empty; ErrNotFound when
// from holds no checkpoint; ErrDataLoss when no checkpoint of a shard
// verifies; ErrInvalidArgument for a bad count or to == from.
func ReshardCheckpoints(from, to string, servers int, progress io.Writer) error {
	count := C.uint32_t(0) // out of range: the library names it
	if servers > 0 && servers <= math.MaxUint32 {
		count = C.uint32_t(servers)
	}
	cfrom := C.CString(from)
	defer C.free(unsafe.Pointer(cfrom))
	cto := C.CString(to)
	defer C.free(unsafe.Pointer(cto))
	err := withProgress(progress, func(fd C.int32_t) error {
		return cCall(func(st *C.pserver_status_t) { C.pserver_checkpoint_reshard(cfrom, cto, count, fd, st) })
	})
	if err != nil {
		return fmt.Errorf("pserver: reshard %q to %d servers: %w", from, servers, err)
	}
	return nil
}

// withProgress runs call with a file descriptor whose lines are copied to
// progress (-1 when progress is nil), and waits until all are copied.
func withProgress(progress io.Writer, call func(fd C.int32_t) error) error {
	if progress == nil {
		return call(-1)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	copied := make(chan error, 1)
	go func() {
		_, err := io.Copy(progress, r)
		r.Close()
		copied <- err
	}()
	err = call(C.int32_t(w.Fd()))
	w.Close()
	<-copied
	return err
}
