package pserver

// #include <stdlib.h>
// #include "pserver.h"
// #include "pserver_cluster.h"
import "C"

import (
	"fmt"
	"io"
	"math"
	"time"
)

// ScaleResult is what ScaleCluster did.
type ScaleResult struct {
	From        int    `json:"from"`    // the server count before
	To          int    `json:"to"`      // the server count now
	Version     uint64 `json:"version"` // the stable placement's, now in etcd
	BlocksMoved uint64 `json:"blocks_moved"`
	BytesMoved  uint64 `json:"bytes_moved"` // values and optimizer state handed over
}

// ScaleCluster moves the running cluster found in etcd (opts.Etcd,
// opts.Cluster) to servers (1 .. 4096) servers while its trainers run
// (docs/elastic.md): /placement moving, the new servers (start them with
// --etcd and --placement_redirects) registered, every old owner's leaving
// dense blocks handed to their new owner, /placement stable; servers left
// out exit. On a secured cluster it presents opts.TLS and opts.Token (an
// admin's: a server that refuses them fails the call with
// ErrPermissionDenied or ErrUnauthenticated before anything is written)
// and speaks to etcd with opts.EtcdTLS; the other options are not used.
// Safe to run again after it failed midway. Progress lines go to progress
// (nil: none). ErrInvalidArgument for a bad count or no opts.Etcd;
// ErrFailedPrecondition when no server has started or a move to another
// count is under way; ErrDeadlineExceeded when the new servers did not
// register within timeout.
func ScaleCluster(opts Options, servers int, timeout time.Duration,
	progress io.Writer) (ScaleResult, error) {
	if opts.Etcd == "" {
		return ScaleResult{}, invalidArgument("ScaleCluster needs Options.Etcd: the placement lives there")
	}
	count := C.uint32_t(0) // out of range: the library names it
	if servers > 0 && servers <= math.MaxUint32 {
		count = C.uint32_t(servers)
	}
	copts, err := opts.toC()
	if err != nil {
		return ScaleResult{}, err
	}
	defer C.pserver_client_options_delete(copts)
	var from C.uint32_t
	var version, blocks, bytes C.uint64_t
	err = withProgress(progress, func(fd C.int32_t) error {
		return cCall(func(st *C.pserver_status_t) {
			C.pserver_cluster_scale_with(copts, count, C.int64_t(timeout.Milliseconds()), fd,
				&from, &version, &blocks, &bytes, st)
		})
	})
	if err != nil {
		return ScaleResult{}, fmt.Errorf("pserver: scale cluster %q to %d servers: %w", opts.Cluster, servers, err)
	}
	return ScaleResult{From: int(from), To: servers, Version: uint64(version),
		BlocksMoved: uint64(blocks), BytesMoved: uint64(bytes)}, nil
}
