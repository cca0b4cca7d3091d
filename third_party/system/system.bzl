"""Debian's system libraries as Bazel targets, linked with flags from pkg-config.

A local repository rule: it runs pkg-config on this machine at fetch time and
downloads nothing. Headers come from /usr/include, which the default C++
toolchain already allows.
"""

# target name -> pkg-config modules whose --libs it links.
_LIBRARIES = {
    "absl": [
        "absl_status",
        "absl_statusor",
        "absl_strings",
        "absl_str_format",
        "absl_synchronization",
        "absl_time",
        "absl_hash",
        "absl_random_random",
        "absl_raw_hash_set",
    ],
    "absl_flags": ["absl_flags", "absl_flags_parse", "absl_flags_usage"],
    "protobuf": ["protobuf"],
    "grpc": ["grpc++", "grpc", "protobuf"],
    "gtest": ["gmock", "gtest"],
    "gtest_main": ["gmock", "gtest_main", "gtest"],
    "benchmark": ["benchmark"],
    "isal": ["libisal"],
    # certificate checks in cc/security (X.509 dates, key matches certificate)
    # and TLS on the bulk channel (cc/security/tls_byte_stream)
    "openssl": ["libssl", "libcrypto"],
}

# target name -> linkopts, for libraries Debian ships without a pkg-config file.
_PLAIN_LIBRARIES = {
    # AES-GCM for the bulk channel's AEAD layer (cc/security/bulk_aead):
    # Intel's multi-buffer crypto library (libipsec-mb-dev)
    "ipsec_mb": ["-lIPSec_MB"],
}

def _pkg_config_libs(rctx, modules):
    result = rctx.execute(["pkg-config", "--libs"] + modules)
    if result.return_code != 0:
        fail("pkg-config cannot find %s (run ./setup.sh first): %s" %
             (" ".join(modules), result.stderr))
    return [flag for flag in result.stdout.strip().split(" ") if flag]

def _system_libraries_impl(rctx):
    lines = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, modules in _LIBRARIES.items():
        linkopts = _pkg_config_libs(rctx, modules) + ["-lpthread"]
        lines.append("cc_library(")
        lines.append('    name = "%s",' % name)
        lines.append("    linkopts = %s," % repr(linkopts))
        lines.append(")")
        lines.append("")
    for name, linkopts in _PLAIN_LIBRARIES.items():
        lines.append("cc_library(")
        lines.append('    name = "%s",' % name)
        lines.append("    linkopts = %s," % repr(linkopts))
        lines.append(")")
        lines.append("")
    rctx.file("BUILD.bazel", "\n".join(lines))
    rctx.file("WORKSPACE", 'workspace(name = "%s")\n' % rctx.name)

system_libraries = repository_rule(
    implementation = _system_libraries_impl,
    local = True,
    doc = "cc_library targets for Debian's gRPC, protobuf, abseil, GoogleTest and Benchmark.",
)
