package pserver_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/pserver-project/pserver/go/pserver"
)

// PushPullInto writes the updated parameters into the caller's tensors, for
// one gradient (one library call) and for several (a batch).
func TestPushPullInto(t *testing.T) {
	ctx := context.Background()
	_, client := newCluster(t, 2, nil)
	add := &pserver.ParamConfig{Optimizer: "add"}
	for _, name := range []string{"a", "b"} {
		if err := client.Init(ctx, name, mustTensor(t, []int64{1, 2, 3}), add); err != nil {
			t.Fatal(err)
		}
	}
	if err := client.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}
	out := mustTensor(t, make([]int64, 3))
	grads := map[string]*pserver.Tensor{"a": mustTensor(t, []int64{10, 10, 10})}
	if err := client.PushPullInto(ctx, grads, map[string]*pserver.Tensor{"a": out}); err != nil {
		t.Fatal(err)
	}
	if v, _ := pserver.Values[int64](out); !reflect.DeepEqual(v, []int64{11, 12, 13}) {
		t.Fatalf("a = %v, want [11 12 13]", v)
	}
	outs := map[string]*pserver.Tensor{"a": out, "b": mustTensor(t, make([]int64, 3))}
	grads["b"] = mustTensor(t, []int64{1, 1, 1})
	if err := client.PushPullInto(ctx, grads, outs); err != nil {
		t.Fatal(err)
	}
	if v, _ := pserver.Values[int64](outs["a"]); !reflect.DeepEqual(v, []int64{21, 22, 23}) {
		t.Fatalf("a = %v, want [21 22 23]", v)
	}
	if v, _ := pserver.Values[int64](outs["b"]); !reflect.DeepEqual(v, []int64{2, 3, 4}) {
		t.Fatalf("b = %v, want [2 3 4]", v)
	}
}

// A missing or mis-sized output fails before anything is applied.
func TestPushPullIntoBadOutput(t *testing.T) {
	ctx := context.Background()
	_, client := newCluster(t, 1, nil)
	if err := client.Init(ctx, "a", mustTensor(t, []int64{1, 2, 3}), &pserver.ParamConfig{Optimizer: "add"}); err != nil {
		t.Fatal(err)
	}
	if err := client.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}
	grads := map[string]*pserver.Tensor{"a": mustTensor(t, []int64{10, 10, 10})}
	err := client.PushPullInto(ctx, grads, map[string]*pserver.Tensor{})
	if !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("no output: err = %v, want InvalidArgument", err)
	}
	err = client.PushPullInto(ctx, grads, map[string]*pserver.Tensor{"a": mustTensor(t, make([]int64, 2))})
	if !errors.Is(err, pserver.ErrInvalidArgument) {
		t.Fatalf("short output: err = %v, want InvalidArgument", err)
	}
	got, err := client.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := pserver.Values[int64](got); !reflect.DeepEqual(v, []int64{1, 2, 3}) {
		t.Fatalf("a = %v after failed calls, want [1 2 3]", v)
	}
}
