// Command psctl runs and inspects pserver clusters, in the manner of
// kubectl and etcdctl: every command that reaches a cluster finds it with
// -etcd HOST:PORT (and -cluster NAME) or -servers A,B,C in any order, prints
// -o table (default), wide or json, and exits 0 (ok), 1 (failed), 2 (usage:
// nothing done) or 3 (done, but some server is down or not serving).
// `psctl help CMD` shows a command's flags and examples.
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
	"sort"
	"strings"
	"time"

	"github.com/pserver-project/pserver/go/pserver"
)

// command is one psctl command.
type command struct {
	summary  string
	examples string
	run      func(args []string, stdout, stderr io.Writer) error
}

var commands map[string]command

func init() {
	commands = map[string]command{
		"local": {"start N pserver processes (and an etcd with -start_etcd) on 127.0.0.1; Ctrl-C stops them",
			`psctl local -n 3 -start_etcd -checkpoint_dir /tmp/ps
  psctl local -n 2 -etcd 127.0.0.1:2379 -cluster demo   # register in an etcd already running`, cmdLocal},
		"status": {"every server's health and stats; with -etcd also desired count, checkpoints and live workers",
			`psctl status -etcd 127.0.0.1:2379 -cluster demo
  psctl status -servers 127.0.0.1:7001,127.0.0.1:7000 -o json`, cmdStatus},
		"health": {"every server's gRPC health (grpc.health.v1); exit 3 unless all are SERVING",
			`psctl health -etcd 127.0.0.1:2379
  psctl health -servers A,B -o json`, cmdHealth},
		"top": {"a live view per server: ops/s, GB/s in and out, p99 latency, rows, clock lag, health",
			`psctl top -etcd 127.0.0.1:2379 -metrics 127.0.0.1:9100,127.0.0.1:9101
  psctl top -servers A,B -n 5 -interval 1s -o json   # one JSON object per refresh`, cmdTop},
		"params": {"parameter names, types, shapes and sizes (from a checkpoint, or from live servers)",
			`psctl params -checkpoint /tmp/ps
  psctl params -etcd 127.0.0.1:2379                 # names from the cluster's published checkpoints
  psctl params -servers A,B layer/w layer/b -o json`, cmdParams},
		"tables": {"sparse tables: rows, bytes, evictions and keys per table (from the servers' metrics pages)",
			`psctl tables -metrics 127.0.0.1:9100,127.0.0.1:9101
  psctl tables -metrics 127.0.0.1:9100 -o wide       # one row per table and server`, cmdTables},
		"desired": {"set the desired server count in etcd (says what it does first; -yes off a terminal)",
			`psctl desired -etcd 127.0.0.1:2379 -cluster demo 4 -yes`, cmdDesired},
		"scale": {"move a running cluster to N servers under its trainers: new servers join, blocks move, servers left out exit",
			`psctl scale -etcd 127.0.0.1:2379 -cluster demo 3    # then start the new server(s) with --etcd --placement_redirects
  psctl scale -etcd 127.0.0.1:2379 -cluster demo -timeout 30m 2 -o json`, cmdScale},
		"checkpoint": {"save | ls | verify | reshard checkpoints",
			`psctl checkpoint save -etcd 127.0.0.1:2379
  psctl checkpoint ls /tmp/ps -o json
  psctl checkpoint verify /tmp/ps
  psctl checkpoint reshard -from /tmp/ps -to /tmp/ps4 -servers 4`, cmdCheckpoint},
	}
}

func usage() string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	b.WriteString("psctl: run and inspect pserver clusters.\n\nUsage: psctl <command> [flags] [args]\n\nCommands:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %-11s  %s\n", n, commands[n].summary)
	}
	b.WriteString(`
Every command that reaches a cluster takes -etcd HOST:PORT[,...] [-cluster NAME]
or -servers A,B,C (any order), and -o table|wide|json.
Exit codes: 0 ok, 1 failed, 2 usage (nothing done), 3 degraded (some server
down, unreachable or not SERVING; the output lists it).

"psctl help <command>" or "psctl <command> -h" shows a command's flags and examples.
`)
	return b.String()
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is psctl with args, returning the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage())
		return exitUsage
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help":
		fmt.Fprint(stdout, usage())
		return exitOK
	case "help":
		if len(args) == 1 {
			fmt.Fprint(stdout, usage())
			return exitOK
		}
		if _, ok := commands[args[1]]; !ok {
			fmt.Fprintf(stderr, "psctl help: unknown command %q\n\n%s", args[1], usage())
			return exitUsage
		}
		return run(append([]string{args[1], "-h"}, args[2:]...), stdout, stderr)
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "psctl: unknown command %q\n\n%s", name, usage())
		return exitUsage
	}
	err := cmd.run(args[1:], stdout, stderr)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.Is(err, errDegraded):
		return exitDegraded
	case errors.Is(err, errUsage):
		if err != errUsage {
			fmt.Fprintf(stderr, "psctl %s: %v\n(psctl help %s shows its flags)\n", name, strings.TrimPrefix(err.Error(), "usage: "), name)
		}
		return exitUsage
	default:
		fmt.Fprintf(stderr, "psctl %s: %v\n", name, err)
		return exitFailed
	}
}

// newFlags is a FlagSet whose -help prints the command's synopsis, flags
// and examples.
func newFlags(name, synopsis string, stdout, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: psctl %s\n", synopsis)
		if c, ok := commands[strings.Fields(name)[0]]; ok {
			fmt.Fprintf(fs.Output(), "\n%s\n\nExamples:\n  %s\n", c.summary, c.examples)
		}
		fmt.Fprintf(fs.Output(), "\nFlags:\n")
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
	// Flags may come after arguments, as in kubectl: "params -servers A w -o json".
	fs.SetOutput(io.Discard)
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return usageError("%v", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
	return fs.Parse(append([]string{"--"}, positional...))
}

// firstError is the first of errs that is not nil.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// noArgs: a usage error when positional arguments are left.
func noArgs(fs *flag.FlagSet) error {
	if fs.NArg() != 0 {
		return usageError("unexpected argument %q", fs.Arg(0))
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

// maxDesired bounds psctl desired N (the servers' index space is as large).
const maxDesired = 4096

// desiredJSON is psctl desired -o json.
type desiredJSON struct {
	Key     string   `json:"key"`
	From    string   `json:"from"` // "" when unset
	To      int      `json:"to"`
	Live    int      `json:"live"`
	Workers int      `json:"workers"`
	Effects []string `json:"effects"`
	Changed bool     `json:"changed"`
}

// desiredEffects says what setting the desired count to n does to the
// servers and trainers reg describes.
func desiredEffects(reg *registry, n int) []string {
	live, workers := len(reg.Servers), len(reg.Workers)
	if reg.DesiredRaw == fmt.Sprint(n) {
		return []string{fmt.Sprintf("the desired count is already %d: nothing changes", n)}
	}
	effects := []string{fmt.Sprintf("%d running trainer(s) keep the servers they found: placement is fixed while a job runs "+
		"(docs/elastic.md), nothing moves and no server is started or stopped", workers)}
	switch {
	case n > live:
		effects = append(effects, fmt.Sprintf("a new trainer (or a restarted one) waits until %d servers are registered: start %d more "+
			"with --etcd (they claim the free indexes below %d)", n, n-live, n))
	case n < live:
		effects = append(effects, fmt.Sprintf("%d server(s) at index %d and above keep running but a new trainer uses indexes 0..%d only: "+
			"what they hold is out of its reach", live-n, n, n-1))
	}
	effects = append(effects, fmt.Sprintf("a server started with --num_servers other than %d is refused", n))
	if len(reg.Checkpoints) > 0 && n != len(reg.Checkpoints) {
		effects = append(effects, fmt.Sprintf("the %d servers' checkpoints load only on %d servers: "+
			"to change a job's count, stop it and run psctl checkpoint reshard", len(reg.Checkpoints), len(reg.Checkpoints)))
	}
	return effects
}

func cmdDesired(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("desired", "desired -etcd HOST:PORT[,...] [-cluster NAME] [-yes] [-dry_run] [-o table|json] N", stdout, stderr)
	t := addTarget(fs, false)
	yes := fs.Bool("yes", false, "set it without asking (needed when not on a terminal)")
	dryRun := fs.Bool("dry_run", false, "say what it would do; change nothing")
	out := addOutput(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if err := firstError(out.check(), conflict(fs, "yes", "dry_run")); err != nil {
		return err
	}
	if *t.servers != "" {
		return usageError("the desired count lives in etcd: give -etcd, not -servers")
	}
	if *t.etcd == "" || fs.NArg() != 1 {
		return usageError("give -etcd HOST:PORT and the count N")
	}
	var n int
	if _, err := fmt.Sscanf(fs.Arg(0), "%d", &n); err != nil || n < 1 || n > maxDesired || fmt.Sprint(n) != fs.Arg(0) {
		return usageError("N must be a whole number from 1 to %d, got %q", maxDesired, fs.Arg(0))
	}
	ctx, cancel := context.WithTimeout(context.Background(), *t.timeout)
	defer cancel()
	e, err := newEtcdTLS(splitList(*t.etcd), *t.timeout, t.auth.etcdTLS())
	if err != nil {
		return err
	}
	defer e.Close()
	reg, err := readRegistry(ctx, e, *t.cluster)
	if err != nil {
		return err
	}
	key := pserver.Keys(*t.cluster).Desired()
	plan := desiredJSON{Key: key, From: reg.DesiredRaw, To: n, Live: len(reg.Servers), Workers: len(reg.Workers),
		Effects: desiredEffects(reg, n)}
	if !out.json() {
		from := plan.From
		if from == "" {
			from = "(unset)"
		}
		fmt.Fprintf(stdout, "%s: %s -> %d (%d servers registered, %d trainers)\n", key, from, n, plan.Live, plan.Workers)
		for _, line := range plan.Effects {
			fmt.Fprintf(stdout, "  - %s\n", line)
		}
	}
	if !*dryRun && plan.From != fmt.Sprint(n) {
		if err := confirm(*yes, fmt.Sprintf("set %s to %d", key, n), stdout); err != nil {
			return err
		}
		if err := e.put(ctx, key, fmt.Sprint(n)); err != nil {
			return err
		}
		plan.Changed = true
	}
	if out.json() {
		return writeJSON(stdout, plan)
	}
	if plan.Changed {
		fmt.Fprintf(stdout, "%s = %d\n", key, n)
	}
	return nil
}

func cmdCheckpoint(args []string, stdout, stderr io.Writer) error {
	const synopsis = `checkpoint save (-etcd HOST:PORT | -servers A,B) [-timeout D]
       psctl checkpoint ls DIR [-o table|json]
       psctl checkpoint verify DIR [-o table|json]
       psctl checkpoint reshard -from DIR -to DIR -servers M

  save    asks every server to write a checkpoint of its shard now
  ls      lists the checkpoints at DIR (a checkpoint, a server's directory, or
          the --checkpoint_dir of a cluster) and their parameters
  verify  checks every checksum of every checkpoint at DIR (every shard, every
          one kept), prints each failure and exits 1 if any failed
  reshard rewrites the checkpoints of a stopped cluster (its --checkpoint_dir)
          for M servers into a new directory; start M servers on it

Examples:
  ` + "psctl checkpoint save -etcd 127.0.0.1:2379\n  psctl checkpoint ls /tmp/ps -o json\n  psctl checkpoint verify /tmp/ps\n  psctl checkpoint reshard -from /tmp/ps -to /tmp/ps4 -servers 4"
	if len(args) == 0 {
		fmt.Fprintf(stderr, "Usage: psctl %s\n", synopsis)
		return errUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprintf(stdout, "Usage: psctl %s\n", synopsis)
		return flag.ErrHelp
	case "save":
		fs := newFlags("checkpoint save", "checkpoint save (-etcd HOST:PORT | -servers A,B) [-o table|json]", stdout, stderr)
		t := addTarget(fs, false)
		*t.timeout = time.Minute
		out := addOutput(fs)
		if err := parse(fs, args[1:], stdout); err != nil {
			return err
		}
		if err := firstError(out.check(), t.check(), noArgs(fs)); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), *t.timeout)
		defer cancel()
		client, err := t.client(ctx)
		if err != nil {
			return err
		}
		defer client.Close()
		if err := client.SaveCheckpoint(ctx); err != nil {
			return err
		}
		if out.json() {
			return writeJSON(stdout, map[string]interface{}{"saved": client.NumServers(), "servers": client.Servers()})
		}
		fmt.Fprintf(stdout, "saved a checkpoint on %d servers\n", client.NumServers())
		return nil
	case "ls", "verify":
		verb := args[0]
		fs := newFlags("checkpoint "+verb, "checkpoint "+verb+" DIR [-o table|json]", stdout, stderr)
		out := addOutput(fs)
		if err := parse(fs, args[1:], stdout); err != nil {
			return err
		}
		if err := out.check(); err != nil {
			return err
		}
		if fs.NArg() != 1 {
			return usageError("give one checkpoint directory")
		}
		dir := fs.Arg(0)
		if verb == "verify" {
			return verifyCheckpoints(absPath(dir), stdout, out)
		}
		r, err := pserver.OpenCheckpoint(absPath(dir))
		if err != nil {
			return err
		}
		defer r.Close()
		if out.json() {
			params, err := paramsJSON(r.Names(), r.Info)
			if err != nil {
				return err
			}
			return writeJSON(stdout, map[string]interface{}{"checkpoints": r.Checkpoints(), "parameters": params})
		}
		fmt.Fprintln(stdout, "CHECKPOINT")
		for _, p := range r.Checkpoints() {
			fmt.Fprintln(stdout, p)
		}
		fmt.Fprintln(stdout)
		return printParams(stdout, out, r.Names(), r.Info)
	case "reshard":
		fs := newFlags("checkpoint reshard", "checkpoint reshard -from DIR -to DIR -servers M", stdout, stderr)
		from := fs.String("from", "", "the stopped cluster's --checkpoint_dir (shard-0 .. shard-<N-1>) (required)")
		to := fs.String("to", "", "a new or empty directory: the --checkpoint_dir of the M servers (required)")
		servers := fs.Int("servers", 0, "M, the server count to reshard for, 1 .. 4096 (required)")
		out := addOutput(fs)
		if err := parse(fs, args[1:], stdout); err != nil {
			return err
		}
		if err := out.check(); err != nil {
			return err
		}
		if *from == "" || *to == "" || *servers == 0 || fs.NArg() != 0 {
			return usageError("give -from DIR, -to DIR and -servers M")
		}
		if !out.json() {
			return pserver.ReshardCheckpoints(absPath(*from), absPath(*to), *servers, stdout)
		}
		var log strings.Builder
		if err := pserver.ReshardCheckpoints(absPath(*from), absPath(*to), *servers, &log); err != nil {
			return err
		}
		return writeJSON(stdout, map[string]interface{}{"from": absPath(*from), "to": absPath(*to), "servers": *servers,
			"log": strings.Split(strings.TrimRight(log.String(), "\n"), "\n")})
	default:
		fmt.Fprintf(stderr, "psctl checkpoint: unknown subcommand %q\nUsage: psctl %s\n", args[0], synopsis)
		return errUsage
	}
}

// verifyJSON is psctl checkpoint verify -o json.
type verifyJSON struct {
	OK          bool               `json:"ok"`
	Parameters  int                `json:"parameters"`
	Checkpoints []verifyCheckpoint `json:"checkpoints"`
}

type verifyCheckpoint struct {
	Path  string `json:"path"`
	Error string `json:"error,omitempty"`
}

// verifyCheckpoints verifies every checkpoint at dir (every shard, every one
// kept), prints each failure, and fails if any did.
func verifyCheckpoints(dir string, stdout io.Writer, out *output) error {
	results, err := pserver.VerifyCheckpoints(dir)
	if err != nil {
		return err
	}
	v := verifyJSON{OK: true, Checkpoints: []verifyCheckpoint{}}
	failed := 0
	for _, r := range results {
		c := verifyCheckpoint{Path: r.Path}
		if r.Err != nil {
			failed++
			v.OK = false
			c.Error = r.Err.Error()
			if !out.json() {
				fmt.Fprintf(stdout, "FAILED %s: %v\n", r.Path, r.Err)
			}
		}
		v.Checkpoints = append(v.Checkpoints, c)
	}
	if failed == 0 {
		if r, err := pserver.OpenCheckpoint(dir); err == nil {
			v.Parameters = len(r.Names())
			r.Close()
		}
	}
	if out.json() {
		if err := writeJSON(stdout, v); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d checkpoints at %s failed verification", failed, len(results), dir)
	}
	if !out.json() {
		fmt.Fprintf(stdout, "OK: %d checkpoints, %d parameters, every checksum verified\n", len(results), v.Parameters)
		for _, r := range results {
			fmt.Fprintf(stdout, "verified %s\n", r.Path)
		}
	}
	return nil
}

func cmdParams(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("params", "params -checkpoint DIR [NAME...] | (-etcd HOST:PORT | -servers A,B) [NAME...] [-o table|json]", stdout, stderr)
	ckpt := fs.String("checkpoint", "", "a checkpoint directory (as for checkpoint ls)")
	t := addTarget(fs, false)
	out := addOutput(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if err := firstError(out.check(), conflict(fs, "checkpoint", "etcd"), conflict(fs, "checkpoint", "servers")); err != nil {
		return err
	}
	if *ckpt != "" {
		r, err := pserver.OpenCheckpoint(absPath(*ckpt))
		if err != nil {
			return err
		}
		defer r.Close()
		names := r.Names()
		if fs.NArg() > 0 {
			names = fs.Args()
		}
		return printParams(stdout, out, names, r.Info)
	}
	if err := t.check(); err != nil {
		return usageError("give -checkpoint DIR, -etcd HOST:PORT or -servers A,B")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *t.timeout)
	defer cancel()
	client, err := t.client(ctx)
	if err != nil {
		return err
	}
	defer client.Close()
	if names := fs.Args(); len(names) > 0 {
		return printParams(stdout, out, names, func(name string) (pserver.DType, []int64, error) {
			return client.Info(ctx, name)
		})
	}
	// No names: every parameter the live servers hold (ListParams).
	listed, err := client.ListParams(ctx)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(listed))
	byName := make(map[string]pserver.ParamListing, len(listed))
	for _, p := range listed {
		names = append(names, p.Name)
		byName[p.Name] = p
	}
	return printParams(stdout, out, names, func(name string) (pserver.DType, []int64, error) {
		return byName[name].DType, byName[name].Shape, nil
	})
}

// paramJSON is a parameter as psctl params -o json prints it.
type paramJSON struct {
	Name     string  `json:"name"`
	DType    string  `json:"dtype"`
	Shape    []int64 `json:"shape"`
	Elements int64   `json:"elements"`
	Bytes    int64   `json:"bytes"`
}

func paramsJSON(names []string, info func(string) (pserver.DType, []int64, error)) ([]paramJSON, error) {
	out := make([]paramJSON, 0, len(names))
	for _, name := range names {
		dtype, shape, err := info(name)
		if err != nil {
			return nil, err
		}
		n := int64(1)
		for _, d := range shape {
			n *= d
		}
		if shape == nil {
			shape = []int64{}
		}
		out = append(out, paramJSON{name, dtype.String(), shape, n, n * int64(dtype.Size())})
	}
	return out, nil
}

func printParams(stdout io.Writer, out *output, names []string, info func(string) (pserver.DType, []int64, error)) error {
	params, err := paramsJSON(names, info)
	if err != nil {
		return err
	}
	if out.json() {
		return writeJSON(stdout, map[string]interface{}{"parameters": params})
	}
	t := newTable(stdout, "NAME", "TYPE", "SHAPE", "ELEMENTS", "BYTES")
	var total int64
	for _, p := range params {
		total += p.Bytes
		t.row(p.Name, p.DType, fmt.Sprint(p.Shape), p.Elements, p.Bytes)
	}
	t.row(fmt.Sprintf("(%d parameters)", len(params)), "", "", "", total)
	return t.flush()
}
