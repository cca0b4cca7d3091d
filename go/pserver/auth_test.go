package pserver_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pserver-project/pserver/go/pserver"
)

// Roles from Go (docs/security.md): a trainer and a reader token, and no
// token at all.
func TestRolesAndTokens(t *testing.T) {
	ctx := context.Background()
	tokens := filepath.Join(t.TempDir(), "tokens")
	const trainer, reader = "trainer-token-go-0123456789", "reader-token-go-0123456789"
	if err := os.WriteFile(tokens, []byte("trainer job-a "+trainer+"\nreader job-a "+reader+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	server, err := pserver.NewServer(&pserver.ServerOptions{Job: "job-a", AuthTokensFile: tokens})
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	tc, err := server.Client(ctx, pserver.Options{Token: trainer})
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	if err := tc.Init(ctx, "w", mustTensor(t, []float32{1, 2}), nil); err != nil {
		t.Fatal(err)
	}
	if err := tc.FinishInit(ctx); err != nil {
		t.Fatal(err)
	}
	rc, err := server.Client(ctx, pserver.Options{Token: reader})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	err = rc.SendGrad(ctx, "w", mustTensor(t, []float32{1, 1}))
	if !errors.Is(err, pserver.ErrPermissionDenied) || !strings.Contains(err.Error(), "role reader of job job-a may not SendGrads") {
		t.Fatalf("reader SendGrad: %v", err)
	}
	anonymous, err := server.Client(ctx, pserver.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer anonymous.Close()
	if err := anonymous.SendGrad(ctx, "w", mustTensor(t, []float32{1, 1})); !errors.Is(err, pserver.ErrUnauthenticated) {
		t.Fatalf("anonymous SendGrad: %v", err)
	}
}
