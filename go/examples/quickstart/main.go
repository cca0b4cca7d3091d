// The README's Go example: two servers in this process, one Adam step.
// The body of main is the README's code block, line for line
// (//go:readme_test runs the README's block and checks that they match).
//
//	cd go && go run ./examples/quickstart   (with PKG_CONFIG_PATH as in the README)
package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/pserver-project/pserver/go/pserver"
)

func main() {
	ctx := context.Background()
	cluster, _ := pserver.NewLocalCluster(2, nil) // two servers in this process
	defer cluster.Close()
	client, _ := pserver.NewClient(ctx, pserver.Options{Servers: cluster.Addresses()})
	defer client.Close()
	client.Init(ctx, "w", pserver.Vector[float32](0, 0, 0), &pserver.ParamConfig{Optimizer: "adam", Settings: map[string]float64{"lr": 0.1}})
	client.FinishInit(ctx)
	out, _ := client.PushPull(ctx, map[string]*pserver.Tensor{"w": pserver.Vector[float32](1, -1, 0.5)}) // push a gradient, pull new weights
	fmt.Println(out["w"].Value())
	fmt.Println(errors.Is(client.SendGrad(ctx, "nope", out["w"]), pserver.ErrNotFound)) // no such parameter
}
