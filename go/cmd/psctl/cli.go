package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
	"unsafe"
)

// Exit codes, the same for every command (docs/operations.md, "psctl").
const (
	exitOK       = 0 // done; every server answered
	exitFailed   = 1 // the command failed (an error on stderr)
	exitUsage    = 2 // bad flags or arguments: nothing was done
	exitDegraded = 3 // done and printed, but some server is down, unreachable or not SERVING
)

var (
	errUsage = errors.New("usage")
	// errDegraded: the output is complete, but some server did not answer
	// or does not serve.
	errDegraded = errors.New("degraded")
)

// usageError is a usage error with a message (exit 2).
func usageError(format string, args ...interface{}) error {
	return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
}

// output is the -o flag: table (the default), wide (more columns) or json.
type output struct{ format *string }

func addOutput(fs *flag.FlagSet) *output {
	return &output{format: fs.String("o", "table", "output format: table, wide (more columns) or json (stable field names, docs/operations.md)")}
}

func (o *output) check() error {
	switch *o.format {
	case "table", "wide", "json":
		return nil
	}
	return usageError("-o %q: want table, wide or json", *o.format)
}

func (o *output) json() bool { return *o.format == "json" }
func (o *output) wide() bool { return *o.format == "wide" }

// writeJSON writes v as one line of JSON.
func writeJSON(w io.Writer, v interface{}) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// table writes rows under a header with aligned columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	t.row(toAny(header)...)
	return t
}

func toAny(s []string) []interface{} {
	out := make([]interface{}, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

func (t *table) row(cells ...interface{}) {
	for i, c := range cells {
		if i > 0 {
			fmt.Fprint(t.tw, "\t")
		}
		fmt.Fprint(t.tw, cell(c))
	}
	fmt.Fprint(t.tw, "\n")
}

// cell formats a whole float64 without an exponent.
func cell(c interface{}) interface{} {
	if f, ok := c.(float64); ok && f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return int64(f)
	}
	return c
}

func (t *table) flush() error { return t.tw.Flush() }

// target is where a command finds the cluster: etcd (-etcd, -cluster) or a
// list of server addresses in any order (-servers), plus the servers'
// metrics pages (-metrics, any order), a deadline and the security flags.
type target struct {
	etcd, cluster, servers, metrics *string
	timeout                         *time.Duration
	auth                            *securityFlags
}

func addTarget(fs *flag.FlagSet, withMetrics bool) *target {
	t := &target{
		etcd:    fs.String("etcd", "", "etcd endpoints host:port[,host:port...]: find the servers registered there"),
		cluster: fs.String("cluster", "default", "cluster name: keys live under /pserver/<cluster> (with -etcd)"),
		servers: fs.String("servers", "", "instead of -etcd: server addresses host:port,... in any order (psctl asks each its index)"),
		timeout: fs.Duration("timeout", 10*time.Second, "deadline of the whole command"),
		auth:    addSecurityFlags(fs),
	}
	if withMetrics {
		t.metrics = fs.String("metrics", "", "the servers' metrics addresses host:port,... (--metrics_port), in any order")
	}
	return t
}

// check: exactly one of -etcd and -servers.
func (t *target) check() error {
	switch {
	case *t.etcd != "" && *t.servers != "":
		return usageError("conflicting flags -etcd and -servers: give one")
	case *t.etcd == "" && *t.servers == "":
		return usageError("no cluster: give -etcd HOST:PORT or -servers A,B")
	}
	return nil
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	if fs == nil {
		return false
	}
	set := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}

// conflict is a usage error when two flags that exclude each other are both set.
func conflict(fs *flag.FlagSet, a, b string) error {
	if flagSet(fs, a) && flagSet(fs, b) {
		return usageError("conflicting flags -%s and -%s: give one", a, b)
	}
	return nil
}

// stdin is where psctl reads confirmations and top's refresh requests.
var stdin io.Reader = os.Stdin

// isTerminal reports whether f is a terminal (TCGETS succeeds).
func isTerminal(v interface{}) bool {
	f, ok := v.(*os.File)
	if !ok {
		return false
	}
	var t syscall.Termios
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), syscall.TCGETS, uintptr(unsafe.Pointer(&t)))
	return errno == 0
}

// confirm asks on a terminal; elsewhere it needs -yes.
func confirm(yes bool, question string, stdout io.Writer) error {
	if yes {
		return nil
	}
	if !isTerminal(stdin) || !isTerminal(stdout) {
		return usageError("not on a terminal: pass -yes to %s", question)
	}
	fmt.Fprintf(stdout, "%s? [y/N] ", strings.ToUpper(question[:1])+question[1:])
	var answer string
	fmt.Fscanln(stdin, &answer)
	if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
		return fmt.Errorf("not confirmed: nothing changed")
	}
	return nil
}
