// Command psctl runs and inspects pserver clusters.
//
//	psctl local -n 3 [-etcd] [-checkpoint_dir DIR]   start servers (and etcd) until Ctrl-C
//	psctl status -etcd HOST:PORT [-cluster NAME]      servers, desired count, checkpoints, workers
//	psctl health (-etcd HOST:PORT | -servers A,B)     every server's gRPC health; exit 1 unless all SERVING
//	psctl desired -etcd HOST:PORT N                   set the desired server count
//	psctl checkpoint save -servers A,B                ask every server for a checkpoint now
//	psctl checkpoint ls DIR                           the checkpoints and parameters at DIR
//	psctl checkpoint verify DIR                       verify every checksum of every checkpoint
//	psctl checkpoint reshard -from DIR -to DIR -servers M   rewrite N servers' checkpoints for M
//	psctl params (-checkpoint DIR | -servers A,B NAME...)   names, types, shapes, sizes
//
// Under Bazel: bazel run //go/cmd/psctl -- <command> ...
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pserver-project/pserver/go/pserver"
)

const usage = `psctl: run and inspect pserver clusters.

Usage: psctl <command> [flags] [args]

Commands:
  local        start N pserver processes (and an etcd with -etcd) on 127.0.0.1; Ctrl-C stops them
  status       servers, desired count, checkpoints and live workers, from etcd (or -servers stats)
  health       every server's gRPC health (grpc.health.v1); exit 1 unless all are SERVING
  desired      set the desired server count in etcd
  checkpoint   save | ls | verify | reshard checkpoints
  params       parameter names, types, shapes and sizes (from a checkpoint or running servers)

Run "psctl <command> -help" for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is psctl with args, returning the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "local":
		err = cmdLocal(args[1:], stdout, stderr)
	case "status":
		err = cmdStatus(args[1:], stdout, stderr)
	case "health":
		err = cmdHealth(args[1:], stdout, stderr)
	case "desired":
		err = cmdDesired(args[1:], stdout, stderr)
	case "checkpoint":
		err = cmdCheckpoint(args[1:], stdout, stderr)
	case "params":
		err = cmdParams(args[1:], stdout, stderr)
	default:
		fmt.Fprintf(stderr, "psctl: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	default:
		fmt.Fprintf(stderr, "psctl %s: %v\n", args[0], err)
		return 1
	}
}

var errUsage = errors.New("usage")

// newFlags is a FlagSet whose -help prints the command's synopsis.
func newFlags(name, synopsis string, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: psctl %s\n\nFlags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args; -help prints to stdout and returns flag.ErrHelp.
func parse(fs *flag.FlagSet, args []string, stdout io.Writer) error {
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			fs.SetOutput(stdout)
			fs.Usage()
			return flag.ErrHelp
		}
		if a == "--" {
			break
		}
	}
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// absPath resolves a path given on the command line against the directory
// psctl was invoked from (bazel run changes the working directory).
func absPath(p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	if wd := os.Getenv("BUILD_WORKING_DIRECTORY"); wd != "" {
		return filepath.Join(wd, p)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return abs
}

func cmdDesired(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("desired", "desired -etcd HOST:PORT[,...] [-cluster NAME] N", stdout, stderr)
	etcdFlag := fs.String("etcd", "", "etcd endpoints host:port[,host:port...] (required)")
	cluster := fs.String("cluster", "default", "cluster name: keys live under /pserver/<cluster>")
	auth := addSecurityFlags(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if *etcdFlag == "" || fs.NArg() != 1 {
		fs.Usage()
		return errUsage
	}
	var n uint
	if _, err := fmt.Sscanf(fs.Arg(0), "%d", &n); err != nil || n < 1 {
		return fmt.Errorf("N must be a positive whole number, got %q", fs.Arg(0))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := newEtcdTLS(splitList(*etcdFlag), 10*time.Second, auth.etcdTLS())
	if err != nil {
		return err
	}
	defer e.Close()
	key := pserver.Keys(*cluster).Desired()
	if err := e.put(ctx, key, fmt.Sprint(n)); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s = %d\n", key, n)
	return nil
}

func cmdCheckpoint(args []string, stdout, stderr io.Writer) error {
	const synopsis = `checkpoint save -servers A,B [-timeout D]
       psctl checkpoint ls DIR
       psctl checkpoint verify DIR
       psctl checkpoint reshard -from DIR -to DIR -servers M

  save    asks every server to write a checkpoint of its shard now
  ls      lists the checkpoints at DIR (a checkpoint, a server's directory, or
          the --checkpoint_dir of a cluster) and their parameters
  verify  checks every checksum of every checkpoint at DIR (every shard, every
          one kept), prints each failure and exits 1 if any failed
  reshard rewrites the checkpoints of a stopped cluster (its --checkpoint_dir)
          for M servers into a new directory; start M servers on it`
	if len(args) == 0 {
		fmt.Fprintf(stderr, "Usage: psctl %s\n", synopsis)
		return errUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprintf(stdout, "Usage: psctl %s\n", synopsis)
		return flag.ErrHelp
	case "save":
		fs := newFlags("checkpoint save", "checkpoint save -servers A,B [-timeout D]", stdout, stderr)
		servers := fs.String("servers", "", "server addresses host:port, in index order (required)")
		timeout := fs.Duration("timeout", time.Minute, "deadline")
		auth := addSecurityFlags(fs)
		if err := parse(fs, args[1:], stdout); err != nil {
			return err
		}
		if *servers == "" {
			fs.Usage()
			return errUsage
		}
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		defer cancel()
		client, err := auth.newClient(ctx, pserver.Options{Servers: splitList(*servers), Timeout: *timeout})
		if err != nil {
			return err
		}
		defer client.Close()
		if err := client.SaveCheckpoint(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "saved a checkpoint on %d servers\n", client.NumServers())
		return nil
	case "ls", "verify":
		verb := args[0]
		fs := newFlags("checkpoint "+verb, "checkpoint "+verb+" DIR", stdout, stderr)
		if err := parse(fs, args[1:], stdout); err != nil {
			return err
		}
		if fs.NArg() != 1 {
			fs.Usage()
			return errUsage
		}
		if verb == "verify" {
			return verifyCheckpoints(absPath(fs.Arg(0)), stdout)
		}
		r, err := pserver.OpenCheckpoint(absPath(fs.Arg(0)))
		if err != nil {
			return err
		}
		defer r.Close()
		fmt.Fprintln(stdout, "CHECKPOINT")
		for _, p := range r.Checkpoints() {
			fmt.Fprintln(stdout, p)
		}
		fmt.Fprintln(stdout)
		return printParams(stdout, r.Names(), r.Info)
	case "reshard":
		fs := newFlags("checkpoint reshard", "checkpoint reshard -from DIR -to DIR -servers M", stdout, stderr)
		from := fs.String("from", "", "the stopped cluster's --checkpoint_dir (shard-0 .. shard-<N-1>) (required)")
		to := fs.String("to", "", "a new or empty directory: the --checkpoint_dir of the M servers (required)")
		servers := fs.Int("servers", 0, "M, the server count to reshard for, 1 .. 4096 (required)")
		if err := parse(fs, args[1:], stdout); err != nil {
			return err
		}
		if *from == "" || *to == "" || *servers == 0 || fs.NArg() != 0 {
			fs.Usage()
			return errUsage
		}
		return pserver.ReshardCheckpoints(absPath(*from), absPath(*to), *servers, stdout)
	default:
		fmt.Fprintf(stderr, "psctl checkpoint: unknown subcommand %q\nUsage: psctl %s\n", args[0], synopsis)
		return errUsage
	}
}

// verifyCheckpoints verifies every checkpoint at dir (every shard, every one
// kept), prints each failure, and fails if any did.
func verifyCheckpoints(dir string, stdout io.Writer) error {
	results, err := pserver.VerifyCheckpoints(dir)
	if err != nil {
		return err
	}
	failed := 0
	for _, r := range results {
		if r.Err != nil {
			failed++
			fmt.Fprintf(stdout, "FAILED %s: %v\n", r.Path, r.Err)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d checkpoints at %s failed verification", failed, len(results), dir)
	}
	params := 0
	if r, err := pserver.OpenCheckpoint(dir); err == nil {
		params = len(r.Names())
		r.Close()
	}
	fmt.Fprintf(stdout, "OK: %d checkpoints, %d parameters, every checksum verified\n", len(results), params)
	for _, r := range results {
		fmt.Fprintf(stdout, "verified %s\n", r.Path)
	}
	return nil
}

func cmdParams(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("params", "params -checkpoint DIR | -servers A,B NAME...", stdout, stderr)
	ckpt := fs.String("checkpoint", "", "a checkpoint directory (as for checkpoint ls)")
	servers := fs.String("servers", "", "server addresses host:port in index order; then name the parameters")
	timeout := fs.Duration("timeout", 30*time.Second, "deadline with -servers")
	auth := addSecurityFlags(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	switch {
	case *ckpt != "" && *servers == "":
		r, err := pserver.OpenCheckpoint(absPath(*ckpt))
		if err != nil {
			return err
		}
		defer r.Close()
		names := r.Names()
		if fs.NArg() > 0 {
			names = fs.Args()
		}
		return printParams(stdout, names, r.Info)
	case *servers != "" && *ckpt == "" && fs.NArg() > 0:
		ctx, cancel := context.WithTimeout(context.Background(), *timeout)
		defer cancel()
		client, err := auth.newClient(ctx, pserver.Options{Servers: splitList(*servers), Timeout: *timeout})
		if err != nil {
			return err
		}
		defer client.Close()
		return printParams(stdout, fs.Args(), func(name string) (pserver.DType, []int64, error) {
			return client.Info(ctx, name)
		})
	default:
		fs.Usage()
		return errUsage
	}
}

func printParams(stdout io.Writer, names []string, info func(string) (pserver.DType, []int64, error)) error {
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTYPE\tSHAPE\tELEMENTS\tBYTES")
	var total int64
	for _, name := range names {
		dtype, shape, err := info(name)
		if err != nil {
			tw.Flush()
			return err
		}
		n := int64(1)
		for _, d := range shape {
			n *= d
		}
		total += n * int64(dtype.Size())
		fmt.Fprintf(tw, "%s\t%s\t%v\t%d\t%d\n", name, dtype, shape, n, n*int64(dtype.Size()))
	}
	fmt.Fprintf(tw, "(%d parameters)\t\t\t\t%d\n", len(names), total)
	return tw.Flush()
}
