"""One macro that turns .proto files into a C++ library with gRPC stubs.

protoc and grpc_cpp_plugin come from Debian (PATH); nothing is downloaded.

    cc_grpc_proto_library(
        name = "pserver_proto",
        srcs = ["types.proto", "service.proto"],
        proto_root = "proto",
    )

C++ code then includes "pserver/v1/types.pb.h" (paths relative to proto_root).
"""

def cc_grpc_proto_library(name, srcs, proto_root, deps = [], extra_includes = [], visibility = None):
    """Generates <src>.pb.{h,cc} as `name` and <src>.grpc.pb.{h,cc} as `name`_grpc.

    Args:
      name: the message library; `name`_grpc holds the service stubs.
      srcs: .proto files of this package.
      proto_root: the directory (from the workspace root) that import paths start at.
      deps: cc libraries the generated code needs (other proto libraries).
      extra_includes: further -I directories for imports outside the workspace.
      visibility: of the cc_library.
    """
    prefix = native.package_name()[len(proto_root) + 1:]
    bases = [src[:-len(".proto")] for src in srcs]
    hdrs = [base + ".pb.h" for base in bases]
    cc_srcs = [base + ".pb.cc" for base in bases]
    grpc_hdrs = [base + ".grpc.pb.h" for base in bases]
    grpc_srcs = [base + ".grpc.pb.cc" for base in bases]

    include_flags = " ".join(["-I" + proto_root] + ["-I" + d for d in extra_includes])
    native.genrule(
        name = name + "_generate",
        srcs = srcs,
        outs = hdrs + cc_srcs + grpc_hdrs + grpc_srcs,
        cmd = ("protoc {includes} --cpp_out=$(GENDIR)/{root} --grpc_out=$(GENDIR)/{root} " +
               "--plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) $(SRCS)").format(
            includes = include_flags,
            root = proto_root,
        ),
        message = "protoc " + prefix,
    )
    # Messages alone: what cc/core links, with no gRPC inside.
    native.cc_library(
        name = name,
        srcs = cc_srcs,
        hdrs = hdrs,
        strip_include_prefix = "/" + proto_root,
        deps = deps + ["@system//:protobuf"],
        visibility = visibility,
    )

    # Service stubs: what cc/server and cc/client link.
    native.cc_library(
        name = name + "_grpc",
        srcs = grpc_srcs,
        hdrs = grpc_hdrs,
        strip_include_prefix = "/" + proto_root,
        deps = [":" + name, "@system//:grpc"],
        visibility = visibility,
    )
