package pserver_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pserver-project/pserver/go/pserver"
)

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startEtcd runs etcd on free 127.0.0.1 ports until the test ends (stopped
// by PID) and returns its endpoint once it serves reads.
func startEtcd(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Skip("no etcd on PATH")
	}
	dir := t.TempDir()
	client, peer := freePort(t), freePort(t)
	curl, purl := fmt.Sprintf("http://127.0.0.1:%d", client), fmt.Sprintf("http://127.0.0.1:%d", peer)
	log, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	cmd := exec.Command(bin, "--name=gotest", "--data-dir="+filepath.Join(dir, "data"),
		"--listen-client-urls="+curl, "--advertise-client-urls="+curl,
		"--listen-peer-urls="+purl, "--initial-advertise-peer-urls="+purl,
		"--initial-cluster=gotest="+purl, "--log-level=error")
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	endpoint := fmt.Sprintf("127.0.0.1:%d", client)
	// Serving once a read of a missing key says NOT_FOUND (at most 30 s).
	// A fresh client per try: one whose first connection met etcd still
	// starting up may stay stuck (see the note in psctl's waitServing).
	deadline := time.Now().Add(30 * time.Second)
	for {
		e, err := pserver.NewEtcd(endpoint, 500*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.Get(context.Background(), "/gotest/health")
		e.Close()
		if errors.Is(err, pserver.ErrNotFound) {
			return endpoint
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd not serving at %s: %v", endpoint, err)
		}
		select {
		case <-done:
			t.Fatalf("etcd exited while starting (log in %s)", dir)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func TestEtcdKeys(t *testing.T) {
	if _, err := pserver.NewEtcd("", time.Second); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("empty endpoints: %v", err)
	}
	endpoint := startEtcd(t)
	ctx := context.Background()
	e, err := pserver.NewEtcd(endpoint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Put(ctx, "/gotest/b", []byte("two")); err != nil {
		t.Fatal(err)
	}
	if err := e.Put(ctx, "/gotest/a", []byte{'o', 0, 'e'}); err != nil {
		t.Fatal(err)
	}
	if err := e.Put(ctx, "/gotestx", nil); err != nil {
		t.Fatal(err)
	}
	if v, err := e.Get(ctx, "/gotest/b"); err != nil || string(v) != "two" {
		t.Fatalf("get: %q %v", v, err)
	}
	kvs, err := e.GetPrefix(ctx, "/gotest/")
	want := []pserver.KeyValue{{Key: "/gotest/a", Value: []byte{'o', 0, 'e'}}, {Key: "/gotest/b", Value: []byte("two")}}
	if err != nil || !reflect.DeepEqual(kvs, want) {
		t.Fatalf("get prefix: %q %v", kvs, err)
	}
	if err := e.Delete(ctx, "/gotest/b"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Get(ctx, "/gotest/b"); !errors.Is(err, pserver.ErrNotFound) {
		t.Fatalf("get after delete: %v", err)
	}
	e.Close()
	e.Close() // twice is fine
	if _, err := e.Get(ctx, "/gotest/a"); !errors.Is(err, pserver.ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}

func TestNewClientFromEtcd(t *testing.T) {
	endpoint := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	srv, err := pserver.NewServer(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	// Registered by hand, as a pserver process started with --etcd is.
	e := etcdClient(t, endpoint)
	keys := pserver.Keys("go")
	for k, v := range map[string]string{keys.Desired(): "1", keys.Server(0): srv.Address()} {
		if err := e.Put(ctx, k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	// Such an entry names no server instance: a client with
	// RequireInstanceID refuses it, naming the key.
	_, err = pserver.NewClient(ctx, pserver.Options{Etcd: endpoint, Cluster: "go", Timeout: 5 * time.Second, RequireInstanceID: true})
	if !errors.Is(err, pserver.ErrFailedPrecondition) || !strings.Contains(err.Error(), keys.Server(0)) ||
		!strings.Contains(err.Error(), "a rogue or hand-written registry entry") {
		t.Fatalf("bare entry with RequireInstanceID: %v", err)
	}
	cl, err := pserver.NewClient(ctx, pserver.Options{Etcd: endpoint, Cluster: "go", Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if got := cl.Servers(); !reflect.DeepEqual(got, []string{srv.Address()}) || cl.NumServers() != 1 {
		t.Fatalf("servers %q, want [%s]", got, srv.Address())
	}
	trainOne(ctx, t, cl)
	// The trainer registered itself under /workers/.
	if kvs, err := e.GetPrefix(ctx, keys.Workers()); err != nil || len(kvs) != 1 {
		t.Fatalf("workers: %q %v", kvs, err)
	}
	// A cluster nobody registers for: NewClient gives up at ctx's deadline.
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	start := time.Now()
	if _, err := pserver.NewClient(short, pserver.Options{Etcd: endpoint, Cluster: "nobody"}); !errors.Is(err, pserver.ErrDeadlineExceeded) {
		t.Fatalf("empty cluster: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("gave up after %v", d)
	}
	if _, err := pserver.NewClient(ctx, pserver.Options{Etcd: endpoint, Servers: []string{"127.0.0.1:1"}}); !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("both: %v", err)
	}
}

// A Server started with Etcd registers itself (address and instance id at
// /ps/0), and a client with RequireInstanceID finds and uses it.
func TestServerRegistersInEtcd(t *testing.T) {
	endpoint := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, err := pserver.NewServer(&pserver.ServerOptions{Etcd: endpoint, Cluster: "reg", NumServers: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	e := etcdClient(t, endpoint)
	keys := pserver.Keys("reg")
	if v, err := e.Get(ctx, keys.Server(0)); err != nil || !strings.HasPrefix(string(v), srv.Address()+" instance=") {
		t.Fatalf("/ps/0 = %q, %v; want %s instance=<id>", v, err, srv.Address())
	}
	cl, err := pserver.NewClient(ctx, pserver.Options{Etcd: endpoint, Cluster: "reg", Timeout: 10 * time.Second, RequireInstanceID: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	trainOne(ctx, t, cl)
	if _, err := pserver.NewServer(&pserver.ServerOptions{Etcd: " , "}); !errors.Is(err, pserver.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "etcd endpoints are empty") {
		t.Fatalf("no endpoints: %v", err)
	}
}

// trainOne inits w = [1, 2], applies gradient [1, 1] with lr 1 and checks
// that w reads [0, 1].
func trainOne(ctx context.Context, t *testing.T, cl *pserver.Client) {
	t.Helper()
	if err := cl.Init(ctx, "w", mustTensor(t, []float32{1, 2}, 2), &pserver.ParamConfig{Settings: map[string]float64{"lr": 1}}); err != nil {
		t.Fatal(err)
	}
	if err := cl.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cl.SendGrad(ctx, "w", mustTensor(t, []float32{1, 1}, 2)); err != nil {
		t.Fatal(err)
	}
	if w, err := cl.Get(ctx, "w"); err != nil || !reflect.DeepEqual(w.Value(), []float32{0, 1}) {
		t.Fatalf("get: %v %v", w, err)
	}
}

// etcdClient is an etcd client of endpoint, closed when the test ends.
func etcdClient(t *testing.T, endpoint string) *pserver.Etcd {
	t.Helper()
	e, err := pserver.NewEtcd(endpoint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// The key layout as the servers write it, with no etcd needed.
func TestEtcdKeyLayout(t *testing.T) {
	keys := pserver.Keys("job")
	worker, err := keys.Worker("trainer-7")
	if err != nil {
		t.Fatal(err)
	}
	for got, want := range map[string]string{
		keys.Prefix():       "/pserver/job/",
		keys.Desired():      "/pserver/job/ps_desired",
		keys.Servers():      "/pserver/job/ps/",
		keys.Server(3):      "/pserver/job/ps/3",
		keys.Checkpoints():  "/pserver/job/checkpoints/",
		keys.Checkpoint(12): "/pserver/job/checkpoints/12",
		keys.Shards():       "/pserver/job/shards/",
		keys.Shard(4):       "/pserver/job/shards/4",
		keys.Workers():      "/pserver/job/workers/",
		worker:              "/pserver/job/workers/trainer-7",
	} {
		if got != want {
			t.Errorf("key %q, want %q", got, want)
		}
	}
	if _, err := keys.Worker(""); !errors.Is(err, pserver.ErrInvalidArgument) || !strings.Contains(err.Error(), "worker id") {
		t.Errorf("empty worker id: %v", err)
	}
	for key, want := range map[string]pserver.EtcdKey{
		keys.Desired():     {Kind: pserver.KeyDesired},
		keys.Server(7):     {Kind: pserver.KeyServer, Index: 7},
		keys.Checkpoint(0): {Kind: pserver.KeyCheckpoint},
		keys.Shard(9):      {Kind: pserver.KeyShard, Index: 9},
		worker:             {Kind: pserver.KeyWorker, WorkerID: "trainer-7"},
	} {
		if got, err := keys.Parse(key); err != nil || got != want {
			t.Errorf("parse %q: %+v %v, want %+v", key, got, err, want)
		}
	}
	for _, key := range []string{"/pserver/job/ps/x", "/pserver/job/ps/03", "/pserver/other/ps/1", "/pserver/job/other", ""} {
		if _, err := keys.Parse(key); !errors.Is(err, pserver.ErrInvalidArgument) {
			t.Errorf("parse %q: %v, want an invalid argument", key, err)
		}
	}
}

func TestParseServerValue(t *testing.T) {
	for value, want := range map[string]pserver.ServerEntry{
		"10.0.0.1:7000 instance=00ff metrics=10.0.0.1:9100": {"10.0.0.1:7000", "00ff", "10.0.0.1:9100"},
		"10.0.0.1:7000 instance=00ff":                       {"10.0.0.1:7000", "00ff", ""},
		"[::1]:7000":                                        {"[::1]:7000", "", ""},
	} {
		got, err := pserver.ParseServerValue(value)
		if err != nil || got != want {
			t.Errorf("ParseServerValue(%q) = %+v, %v; want %+v", value, got, err, want)
		}
	}
	for _, bad := range []string{"", "h:1 metrics=h:2", "h:1 instance=ab metrics=h", "h:1 instance=ab x=y"} {
		if _, err := pserver.ParseServerValue(bad); !errors.Is(err, pserver.ErrInvalidArgument) ||
			!strings.Contains(err.Error(), "host:port instance=<id>") {
			t.Errorf("ParseServerValue(%q): %v, want INVALID_ARGUMENT naming the form", bad, err)
		}
	}
}
