"""etcd's v3 API .proto files from Debian, laid out by their import paths.

A local repository rule: it copies the few .proto files the etcd client needs
from /usr/share/gocode/src (Debian's golang-etcd-server-dev,
golang-github-gogo-protobuf-dev and golang-github-grpc-ecosystem-grpc-gateway-dev)
into one directory tree whose root is the only -I protoc needs (besides
/usr/include for descriptor.proto), and downloads nothing:

    etcd/etcdserver/etcdserverpb/rpc.proto   etcd/mvcc/mvccpb/kv.proto
    etcd/auth/authpb/auth.proto              gogoproto/gogo.proto
    google/api/annotations.proto             google/api/http.proto

The BUILD file exports each file and a filegroup `protos` with all of them.
"""

_GOCODE = "/usr/share/gocode/src"

# import path -> (Debian package, path under /usr/share/gocode/src).
_PROTOS = {
    "etcd/etcdserver/etcdserverpb/rpc.proto": (
        "golang-etcd-server-dev",
        "go.etcd.io/etcd/etcdserver/etcdserverpb/rpc.proto",
    ),
    "etcd/mvcc/mvccpb/kv.proto": (
        "golang-etcd-server-dev",
        "go.etcd.io/etcd/mvcc/mvccpb/kv.proto",
    ),
    "etcd/auth/authpb/auth.proto": (
        "golang-etcd-server-dev",
        "go.etcd.io/etcd/auth/authpb/auth.proto",
    ),
    "gogoproto/gogo.proto": (
        "golang-github-gogo-protobuf-dev",
        "github.com/gogo/protobuf/gogoproto/gogo.proto",
    ),
    "google/api/annotations.proto": (
        "golang-github-grpc-ecosystem-grpc-gateway-dev",
        "github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis/google/api/annotations.proto",
    ),
    "google/api/http.proto": (
        "golang-github-grpc-ecosystem-grpc-gateway-dev",
        "github.com/grpc-ecosystem/grpc-gateway/third_party/googleapis/google/api/http.proto",
    ),
}

def _etcd_protos_impl(rctx):
    for import_path, (package, source) in _PROTOS.items():
        path = rctx.path(_GOCODE + "/" + source)
        if not path.exists:
            fail("%s not found: install Debian's %s (run ./setup.sh)" % (path, package))

        # A copy, not a symlink: the repository is then self-contained.
        rctx.file(import_path, rctx.read(path), executable = False)
    lines = [
        'package(default_visibility = ["//visibility:public"])',
        "",
        "exports_files(%s)" % repr(sorted(_PROTOS.keys())),
        "",
        "filegroup(",
        '    name = "protos",',
        "    srcs = %s," % repr(sorted(_PROTOS.keys())),
        ")",
        "",
    ]
    rctx.file("BUILD.bazel", "\n".join(lines))
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)

etcd_protos = repository_rule(
    implementation = _etcd_protos_impl,
    local = True,
    doc = "etcd's v3 API protos and their imports, copied from Debian's Go sources.",
)
