package pserver_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"pserver/pserver"
)

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
	e, err := pserver.NewEtcd(endpoint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
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

// A /ps/<idx> entry without an instance id (what etcdctl writes) is refused
// by a client with RequireInstanceID, naming the key, and used without it.
func TestRequireInstanceID(t *testing.T) {
	endpoint := startEtcd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, err := pserver.NewServer(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	e, err := pserver.NewEtcd(endpoint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	keys := pserver.Keys("bare")
	for k, v := range map[string]string{keys.Desired(): "1", keys.Server(0): srv.Address()} {
		if err := e.Put(ctx, k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	opts := pserver.Options{Etcd: endpoint, Cluster: "bare", Timeout: 10 * time.Second, RequireInstanceID: true}
	_, err = pserver.NewClient(ctx, opts)
	if !errors.Is(err, pserver.ErrFailedPrecondition) || !strings.Contains(err.Error(), keys.Server(0)) ||
		!strings.Contains(err.Error(), "a rogue or hand-written registry entry") {
		t.Fatalf("bare entry with RequireInstanceID: %v", err)
	}
	opts.RequireInstanceID = false
	cl, err := pserver.NewClient(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if got := cl.Servers(); !reflect.DeepEqual(got, []string{srv.Address()}) {
		t.Fatalf("servers %q", got)
	}
	trainOne(ctx, t, cl)
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
