// The README's Go example: two servers in this process, Adam, five steps.
//
//	cd go && go run ./examples/quickstart   (with CGO_CFLAGS/CGO_LDFLAGS as in the README)
package main

import (
	"context"
	"errors"
	"fmt"

	"pserver/pserver"
)

func main() {
	ctx := context.Background()
	cluster, _ := pserver.NewLocalCluster(2, nil) // two servers in this process
	defer cluster.Close()
	client, _ := pserver.NewClient(ctx, pserver.Options{Servers: cluster.Addresses()})
	defer client.Close()
	w, _ := pserver.NewTensor([]float32{0, 0, 0})
	client.Init(ctx, "w", w, &pserver.ParamConfig{Optimizer: "adam", Settings: map[string]float64{"lr": 0.1}})
	client.FinishInit(ctx)
	g, _ := pserver.NewTensor([]float32{1, -1, 0.5})
	for step := 0; step < 5; step++ { // push gradients, pull new weights
		out, _ := client.PushPull(ctx, map[string]*pserver.Tensor{"w": g})
		w = out["w"]
	}
	fmt.Println(w.Value())
	_, err := client.Get(ctx, "nope")
	fmt.Println(errors.Is(err, pserver.ErrNotFound), err)
}
