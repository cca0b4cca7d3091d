// Command xlang is the Go half of //tests:cross_language_test:
//
//	xlang get -servers A,B -out DIR NAME...   dump the parameters as a client reads them
//	xlang save -servers A,B                   ask every server for a checkpoint
//	xlang ckpt -path CKPT -out DIR            verify and dump every parameter of a checkpoint
//
// A dump is <name>.bin (the elements' bytes) per parameter and meta.json
// ({name: [dtype, shape]}), as cross_language_test.py writes it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pserver-project/pserver/go/pserver"
)

func dump(params map[string]*pserver.Tensor, out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	meta := map[string][]interface{}{}
	for name, t := range params {
		if err := os.WriteFile(filepath.Join(out, name+".bin"), t.Bytes(), 0o644); err != nil {
			return err
		}
		meta[name] = []interface{}{t.DType().String(), t.Shape()}
	}
	data, err := json.Marshal(meta)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "meta.json"), data, 0o644)
}

func run() error {
	if len(os.Args) < 2 {
		return fmt.Errorf("usage: xlang get|save|ckpt ...")
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	servers := fs.String("servers", "", "")
	path := fs.String("path", "", "")
	out := fs.String("out", "", "")
	fs.Parse(os.Args[2:])
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	switch os.Args[1] {
	case "get", "save":
		client, err := pserver.NewClient(ctx, pserver.Options{Servers: strings.Split(*servers, ",")})
		if err != nil {
			return err
		}
		defer client.Close()
		if os.Args[1] == "save" {
			return client.SaveCheckpoint(ctx)
		}
		params, err := client.GetMany(ctx, fs.Args())
		if err != nil {
			return err
		}
		return dump(params, *out)
	case "ckpt":
		r, err := pserver.OpenCheckpoint(*path)
		if err != nil {
			return err
		}
		defer r.Close()
		if err := r.Verify(); err != nil {
			return err
		}
		params, err := r.ReadAll()
		if err != nil {
			return err
		}
		return dump(params, *out)
	}
	return fmt.Errorf("unknown command %q", os.Args[1])
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "xlang:", err)
		os.Exit(1)
	}
}
