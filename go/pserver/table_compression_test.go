package pserver_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/pserver-project/pserver/go/pserver"
)

// A table's compression on the wire from Go: WireType and the top-k
// settings reach TableConfig.wire_compression, half-precision rows train as
// float32 does (values every type represents), and a bad WireType is
// InvalidArgument.
func TestTableWireCompression(t *testing.T) {
	ctx := context.Background()
	_, client := newCluster(t, 2, nil)
	plain := mustTable(t, client, "plain", pserver.TableConfig{Dim: 2, Settings: map[string]float64{"lr": 1}})
	half := mustTable(t, client, "half", pserver.TableConfig{Dim: 2, WireType: "bfloat16",
		Settings: map[string]float64{"lr": 1, "topk_fraction": 1}})
	if !strings.Contains(half.Config(), "wire_compression { value_type: BFLOAT16 topk_fraction: 1 }") {
		t.Fatalf("config %q", half.Config())
	}
	keys := []uint64{3, 70, 3}
	grads := []float32{0.5, -0.25, 1, 2, -1.5, 0.75}
	for _, table := range []*pserver.Table{plain, half} {
		if err := table.Push(ctx, keys, grads); err != nil {
			t.Fatal(err)
		}
	}
	want, err := pserver.PullRows[float32](ctx, plain, keys)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pserver.PullRows[float32](ctx, half, keys)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("half rows %v (%v), want %v", got, err, want)
	}
	_, err = client.CreateTable(ctx, "bad", pserver.TableConfig{Dim: 2, WireType: "float8"})
	if !errors.Is(err, pserver.ErrInvalidArgument) || !strings.Contains(err.Error(), "unknown wire type 'float8'") {
		t.Fatalf("bad wire type: %v", err)
	}
}
