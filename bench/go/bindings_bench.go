// The Go driver of bench/e2e's `bindings` group: push, pull and push+pull
// of float32 parameters through the Go package, timed as e2e times the C++
// client, one JSON line per (op, size) on stdout.
//
//	bindings_bench -servers=127.0.0.1:7000 -params=name:bytes:ops[,...] [-warmup=1] [-repetitions=5]
//
// Each line is {"op": "push", "payload_bytes": N, "values": [GB/s, ...]}:
// one value per round of `ops` operations, the warm-up rounds first. The
// parameters exist already (e2e initializes them); each round uses the calls
// a trainer makes: SendGrad, GetInto and PushPullInto.
//
// As e2e and pserver do in main() (cc/rpc/allocator.h), the driver first has
// glibc keep freed buffers for reuse instead of returning them to the kernel,
// where every large buffer libpserver allocates would be page-faulted afresh
// (-default-malloc: not).
package main

// #include <malloc.h>
import "C"

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pserver-project/pserver/go/pserver"
)

type result struct {
	Op           string    `json:"op"`
	PayloadBytes int       `json:"payload_bytes"`
	Values       []float64 `json:"values"`
}

// rounds times `rounds` rounds of `ops` calls of op: payload GB/s each.
func rounds(op func() error, ops, payloadBytes, rounds int) ([]float64, error) {
	var values []float64
	for r := 0; r < rounds; r++ {
		begin := time.Now()
		for i := 0; i < ops; i++ {
			if err := op(); err != nil {
				return nil, err
			}
		}
		values = append(values, float64(payloadBytes)*float64(ops)/time.Since(begin).Seconds()/1e9)
	}
	return values, nil
}

func run(servers, params string, warmup, repetitions int) error {
	ctx := context.Background()
	client, err := pserver.NewClient(ctx, pserver.Options{
		Servers: strings.Split(servers, ","), Timeout: 120 * time.Second})
	if err != nil {
		return err
	}
	defer client.Close()
	out := json.NewEncoder(os.Stdout)
	for _, spec := range strings.Split(params, ",") {
		parts := strings.Split(spec, ":")
		if len(parts) != 3 {
			return fmt.Errorf("-params: %q is not name:bytes:ops", spec)
		}
		name := parts[0]
		size, err1 := strconv.Atoi(parts[1])
		ops, err2 := strconv.Atoi(parts[2])
		if err1 != nil || err2 != nil {
			return fmt.Errorf("-params: %q is not name:bytes:ops", spec)
		}
		values := make([]float32, size/4)
		for i := range values {
			values[i] = 0.5
		}
		grad := pserver.Vector(values...)
		into := pserver.Vector(make([]float32, size/4)...)
		grads := map[string]*pserver.Tensor{name: grad}
		outs := map[string]*pserver.Tensor{name: into}
		kinds := []struct {
			op string
			f  func() error
		}{
			{"push", func() error { return client.SendGrad(ctx, name, grad) }},
			{"pull", func() error { return client.GetInto(ctx, name, into) }},
			{"pushpull", func() error { return client.PushPullInto(ctx, grads, outs) }},
		}
		for _, k := range kinds {
			v, err := rounds(k.f, ops, size, warmup+repetitions)
			if err != nil {
				return fmt.Errorf("%s %s: %w", k.op, name, err)
			}
			if err := out.Encode(result{Op: k.op, PayloadBytes: size, Values: v}); err != nil {
				return err
			}
		}
	}
	return nil
}

// keepFreedMemoryForReuse is pserver::KeepFreedMemoryForReuse() for this
// process: libpserver's buffers come from glibc's malloc.
func keepFreedMemoryForReuse() error {
	if C.mallopt(C.M_MMAP_THRESHOLD, 256<<20) != 1 || C.mallopt(C.M_TRIM_THRESHOLD, 1<<30) != 1 {
		return fmt.Errorf("mallopt refused the allocator settings")
	}
	return nil
}

func main() {
	servers := flag.String("servers", "", "host:port[,host:port...]")
	params := flag.String("params", "", "name:bytes:ops[,...]")
	warmup := flag.Int("warmup", 1, "warm-up rounds")
	repetitions := flag.Int("repetitions", 5, "timed rounds")
	defaultMalloc := flag.Bool("default-malloc", false, "leave glibc's allocator settings as they are")
	flag.Parse()
	if !*defaultMalloc {
		if err := keepFreedMemoryForReuse(); err != nil {
			fmt.Fprintln(os.Stderr, "bindings_bench:", err)
			os.Exit(1)
		}
	}
	if err := run(*servers, *params, *warmup, *repetitions); err != nil {
		fmt.Fprintln(os.Stderr, "bindings_bench:", err)
		os.Exit(1)
	}
}
