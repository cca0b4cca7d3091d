package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/pserver-project/pserver/go/pserver"
)

// cmdScale is psctl scale N: the coordinator of a live move
// (docs/elastic.md, cc/server/move_coordinator.h), through the C ABI. On a
// secured cluster it presents -tls_cert/-tls_key (or -token_file), which
// must name the admin role of the job, and reaches etcd with -etcd_tls_*.
func cmdScale(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("scale", "scale -etcd HOST:PORT[,...] [-cluster NAME] [-timeout D] [-tls_cert F -tls_key F -tls_ca F] [-token_file F] [-o table|json] N", stdout, stderr)
	t := addTarget(fs, false)
	fs.Lookup("timeout").DefValue = "10m0s"
	*t.timeout = 10 * time.Minute
	out := addOutput(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if err := out.check(); err != nil {
		return err
	}
	if *t.servers != "" {
		return usageError("the placement lives in etcd: give -etcd, not -servers")
	}
	if *t.etcd == "" || fs.NArg() != 1 {
		return usageError("give -etcd HOST:PORT and the count N")
	}
	var n int
	if _, err := fmt.Sscanf(fs.Arg(0), "%d", &n); err != nil || n < 1 || n > maxDesired || fmt.Sprint(n) != fs.Arg(0) {
		return usageError("N must be a whole number from 1 to %d, got %q", maxDesired, fs.Arg(0))
	}
	if *t.timeout <= 0 {
		return usageError("-timeout must be positive")
	}
	opts, err := t.auth.clientOptions(pserver.Options{Etcd: *t.etcd, Cluster: *t.cluster})
	if err != nil {
		return err
	}
	var progress strings.Builder
	var w io.Writer = stdout
	if out.json() {
		w = &progress
	}
	result, err := pserver.ScaleCluster(opts, n, *t.timeout, w)
	if err != nil {
		return err
	}
	if out.json() {
		return writeJSON(stdout, map[string]interface{}{"result": result,
			"log": strings.Split(strings.TrimRight(progress.String(), "\n"), "\n")})
	}
	return nil
}
