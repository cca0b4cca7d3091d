package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pserver-project/pserver/go/pserver"
)

// child is a process psctl started; stopped by its PID.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

func (c *child) stop(grace time.Duration) {
	select {
	case <-c.done:
		return
	default:
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(grace):
		c.cmd.Process.Kill()
		<-c.done
	}
}

// start runs name with args; every stdout line goes to lines (if not nil)
// and, with stderr, to log with a "[name] " prefix.
func start(name, path string, args []string, log io.Writer, lines chan<- string) (*child, error) {
	cmd := exec.Command(path, args...)
	// Their own process group: a terminal's Ctrl-C reaches psctl only, which
	// stops the servers before etcd. They die with psctl even when it is
	// killed outright.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = &prefixWriter{prefix: "[" + name + "] ", w: log}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			fmt.Fprintf(log, "[%s] %s\n", name, sc.Text())
			if lines != nil {
				select {
				case lines <- sc.Text():
				default:
				}
			}
		}
		cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

type prefixWriter struct {
	mu     sync.Mutex
	prefix string
	w      io.Writer
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := indexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf[:i])
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// findPserver is the pserver binary: -pserver, $PSCTL_PSERVER, next to
// psctl, or on PATH.
func findPserver(flagValue string) (string, error) {
	for _, p := range []string{flagValue, os.Getenv("PSCTL_PSERVER")} {
		if p != "" {
			return absPath(p), nil
		}
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "pserver")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath("pserver")
	if err != nil {
		return "", fmt.Errorf("no pserver binary: pass -pserver PATH or set PSCTL_PSERVER")
	}
	return p, nil
}

var (
	listening   = regexp.MustCompile(`^pserver (\d+) listening on (\S+)`)
	metricsLine = regexp.MustCompile(`^pserver (\d+) metrics on http://(\S+)/metrics`)
)

// localJSON is psctl local -o json: one line once every process is up.
type localJSON struct {
	Etcd    string         `json:"etcd,omitempty"`
	Cluster string         `json:"cluster,omitempty"`
	Servers []string       `json:"servers"`
	Metrics []string       `json:"metrics,omitempty"`
	Pids    map[string]int `json:"pids"`
}

func cmdLocal(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("local", "local [-n N] [-replicas R] [-start_etcd | -etcd HOST:PORT] [-checkpoint_dir DIR] [-cluster NAME] [-o table|json]", stdout, stderr)
	n := fs.Int("n", 2, "number of pserver processes")
	replicas := fs.Int("replicas", 1, "copies of every shard (the servers' --replicas; needs etcd): each process also runs R-1 standby slots backing up other processes' shards (docs/replication.md)")
	startEtcd := fs.Bool("start_etcd", false, "also start an etcd (Debian's etcd on PATH) and register the servers in it")
	etcdFlag := fs.String("etcd", "", "register the servers in this etcd (host:port[,...]), already running")
	metrics := fs.Bool("metrics", true, "the servers serve Prometheus metrics on free 127.0.0.1 ports (--metrics_port=0), printed as `metrics <i> <host:port>`")
	out := addOutput(fs)
	etcdBin := fs.String("etcd_binary", "etcd", "the etcd binary")
	ckptDir := fs.String("checkpoint_dir", "", "the servers' --checkpoint_dir (shard i in DIR/shard-<i>)")
	ckptInterval := fs.Float64("checkpoint_interval", 0, "the servers' --checkpoint_interval in seconds; 0: none")
	cluster := fs.String("cluster", "default", "cluster name with -etcd")
	pserverBin := fs.String("pserver", "", "the pserver binary (default: $PSCTL_PSERVER, next to psctl, or PATH)")
	redirects := fs.Bool("placement_redirects", false, "the servers take part in live moves (--placement_redirects; with -etcd or -start_etcd): psctl scale")
	dataDir := fs.String("data_dir", "", "etcd's data directory (default: a temporary one, removed on exit)")
	startTimeout := fs.Duration("start_timeout", 60*time.Second, "how long to wait for every process to be up")
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	if strings.HasPrefix(*etcdFlag, "-") || *etcdFlag == "true" {
		return usageError("-etcd takes endpoints HOST:PORT (as in every command); -start_etcd starts an etcd")
	}
	if err := firstError(out.check(), conflict(fs, "start_etcd", "etcd"), noArgs(fs)); err != nil {
		return err
	}
	if *n < 1 || *n > maxDesired {
		return usageError("-n must be from 1 to %d, got %d", maxDesired, *n)
	}
	if *replicas < 1 || *replicas > *n {
		return usageError("-replicas must be from 1 to -n (%d): each copy of a shard lives in another process, got %d", *n, *replicas)
	}
	if *replicas > 1 && !*startEtcd && *etcdFlag == "" {
		return usageError("-replicas %d needs etcd (-start_etcd or -etcd): the backups find their shards there", *replicas)
	}
	bin, err := findPserver(*pserverBin)
	if err != nil {
		return err
	}
	var children []*child
	// Servers first (they deregister from etcd and save a checkpoint as
	// they stop), in parallel; then etcd.
	stopAll := func() {
		var wg sync.WaitGroup
		for _, c := range children {
			if c.name != "etcd" {
				wg.Add(1)
				go func(c *child) { defer wg.Done(); c.stop(10 * time.Second) }(c)
			}
		}
		wg.Wait()
		for _, c := range children {
			if c.name == "etcd" {
				c.stop(10 * time.Second)
			}
		}
	}
	defer func() { stopAll() }()

	signals := make(chan os.Signal, 2)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(signals)
	ctx, cancel := context.WithTimeout(context.Background(), *startTimeout)
	defer cancel()

	serverArgs := []string{"--host=127.0.0.1", "--port=0"}
	if *ckptDir != "" {
		serverArgs = append(serverArgs, "--checkpoint_dir="+absPath(*ckptDir),
			"--checkpoint_interval="+strconv.FormatFloat(*ckptInterval, 'g', -1, 64))
	}
	if *metrics {
		serverArgs = append(serverArgs, "--metrics_port=0")
	}
	endpoint := *etcdFlag
	if *startEtcd {
		client, err := freePort()
		if err != nil {
			return err
		}
		peer, err := freePort()
		if err != nil {
			return err
		}
		dir := *dataDir
		if dir == "" {
			tmp, err := os.MkdirTemp("", "psctl-etcd-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			dir = tmp
		}
		curl := fmt.Sprintf("http://127.0.0.1:%d", client)
		purl := fmt.Sprintf("http://127.0.0.1:%d", peer)
		e, err := start("etcd", *etcdBin, []string{
			"--name=psctl", "--data-dir=" + absPath(dir),
			"--listen-client-urls=" + curl, "--advertise-client-urls=" + curl,
			"--listen-peer-urls=" + purl, "--initial-advertise-peer-urls=" + purl,
			"--initial-cluster=psctl=" + purl, "--log-level=error",
		}, io.Discard, nil)
		if err != nil {
			return err
		}
		children = append(children, e)
		endpoint = fmt.Sprintf("127.0.0.1:%d", client)
		if err := waitServing(ctx, endpoint, e, signals); err != nil {
			return err
		}
		if !out.json() {
			fmt.Fprintf(stdout, "etcd %s pid %d\n", endpoint, e.cmd.Process.Pid)
		}
	}
	if endpoint != "" {
		serverArgs = append(serverArgs, "--etcd="+endpoint, "--cluster="+*cluster, "--num_servers="+strconv.Itoa(*n))
		if *replicas > 1 {
			serverArgs = append(serverArgs, "--replicas="+strconv.Itoa(*replicas))
		}
		if *redirects {
			serverArgs = append(serverArgs, "--placement_redirects")
		}
	}
	lines := make(chan string, 4**n)
	for i := 0; i < *n; i++ {
		a := append([]string(nil), serverArgs...)
		if endpoint == "" {
			// The count goes into checkpoints: a later start with another -n is refused.
			a = append(a, "--index="+strconv.Itoa(i), "--num_servers="+strconv.Itoa(*n))
		}
		c, err := start(fmt.Sprintf("pserver-%d", i), bin, a, stderr, lines)
		if err != nil {
			return err
		}
		children = append(children, c)
	}
	addrs := map[int]string{}
	metricsAddrs := map[int]string{}
	for len(addrs) < *n || (*metrics && len(metricsAddrs) < *n) {
		select {
		case line := <-lines:
			if m := listening.FindStringSubmatch(line); m != nil {
				i, _ := strconv.Atoi(m[1])
				addrs[i] = m[2]
			}
			if m := metricsLine.FindStringSubmatch(line); m != nil {
				i, _ := strconv.Atoi(m[1])
				metricsAddrs[i] = m[2]
			}
		case <-ctx.Done():
			return fmt.Errorf("only %d of %d servers up after %v", len(addrs), *n, *startTimeout)
		case s := <-signals:
			return fmt.Errorf("%v while starting", s)
		case <-anyDone(children):
			return fmt.Errorf("a process exited while starting (see its log above)")
		}
	}
	if out.json() {
		j := localJSON{Etcd: endpoint, Pids: map[string]int{}}
		if endpoint != "" {
			j.Cluster = *cluster
		}
		for i := 0; i < *n; i++ {
			j.Servers = append(j.Servers, addrs[i])
			if *metrics {
				j.Metrics = append(j.Metrics, metricsAddrs[i])
			}
		}
		for _, c := range children {
			j.Pids[c.name] = c.cmd.Process.Pid
		}
		if err := writeJSON(stdout, j); err != nil {
			return err
		}
	} else {
		for i := 0; i < *n; i++ {
			fmt.Fprintf(stdout, "server %d %s\n", i, addrs[i])
		}
		for i := 0; *metrics && i < *n; i++ {
			fmt.Fprintf(stdout, "metrics %d %s\n", i, metricsAddrs[i])
		}
		fmt.Fprintf(stdout, "pids")
		for _, c := range children {
			fmt.Fprintf(stdout, " %s=%d", c.name, c.cmd.Process.Pid)
		}
		fmt.Fprintln(stdout)
		fmt.Fprintln(stdout, "ready; Ctrl-C stops everything")
	}
	if f, ok := stdout.(*os.File); ok {
		f.Sync()
	}
	select {
	case s := <-signals:
		fmt.Fprintf(stderr, "psctl local: %v: stopping %d processes\n", s, len(children))
		return nil
	case <-anyDone(children):
		return fmt.Errorf("a process exited; stopping the others")
	}
}

// anyDone is closed once any child has exited.
func anyDone(children []*child) <-chan struct{} {
	ch := make(chan struct{})
	var once sync.Once
	for _, c := range children {
		go func(c *child) {
			<-c.done
			once.Do(func() { close(ch) })
		}(c)
	}
	return ch
}

// waitServing returns once etcd at endpoint answers a read (through the C
// ABI's etcd client, as every other psctl etcd call).
func waitServing(ctx context.Context, endpoint string, e *child, signals <-chan os.Signal) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		// A fresh client per try: a cc/etcd client whose first connection
		// met etcd still starting up was seen to time out every later
		// attempt ("connection attempt timed out before receiving SETTINGS
		// frame") for 30 s and more, while a new one got through at once.
		client, err := pserver.NewEtcd(endpoint, 500*time.Millisecond)
		if err != nil {
			return err
		}
		_, err = client.Get(ctx, "/pserver/psctl-health")
		client.Close()
		if err == nil || errors.Is(err, pserver.ErrNotFound) {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcd not serving at %s: %v (%w)", endpoint, err, ctx.Err())
		case <-e.done:
			return fmt.Errorf("etcd exited while starting")
		case s := <-signals:
			return fmt.Errorf("%v while starting etcd", s)
		case <-tick.C:
		}
	}
}
