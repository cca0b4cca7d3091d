"""Builds the pserver wheel with the standard library alone (bazel build //python:wheel).

Usage: wheel.py OUT_DIR PSERVER_H README FILE...

Writes OUT_DIR/pserver-<version>-<tag>-<tag>-<platform>.whl, where
- <version> is the C ABI's (PSERVER_VERSION_MAJOR/MINOR/PATCH in pserver.h),
  the one place the version is written;
- <tag> is this interpreter's (cp311 for Debian 12's /usr/bin/python3): the
  SWIG module is compiled against that interpreter's headers and not the
  limited API, so it loads in that CPython minor version only;
- <platform> is sysconfig's (linux_x86_64): libpserver.so links Debian 12's
  gRPC, protobuf, abseil and OpenSSL shared libraries, so this is not a
  manylinux wheel.
FILE... go into the package folder `pserver/` by their base names; a file
named py.typed marks the package as typed. The wheel declares numpy
(Requires-Dist) and the optional `torch` extra. Entries are written in a fixed
order with a fixed timestamp, so the same inputs give the same bytes.
"""
import base64
import hashlib
import os
import re
import sys
import sysconfig
import zipfile

EPOCH = (1980, 1, 1, 0, 0, 0)  # zip's earliest date: reproducible archives


def abi_version(header: str) -> str:
    text = open(header, encoding="utf-8").read()
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        match = re.search(rf"#define PSERVER_VERSION_{part} (\d+)", text)
        if match is None:
            sys.exit(f"wheel: {header} has no PSERVER_VERSION_{part}")
        parts.append(match.group(1))
    return ".".join(parts)


def tags() -> tuple:
    impl = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return impl, platform


def metadata(version: str, readme: str) -> str:
    impl = f"{sys.version_info.major}.{sys.version_info.minor}"
    return "\n".join([
        "Metadata-Version: 2.1",
        "Name: pserver",
        f"Version: {version}",
        "Summary: A distributed parameter server: Python client, embedded servers, "
        "checkpoints, PyTorch integration",
        "License: Apache-2.0",
        f"Requires-Python: =={impl}.*",
        "Requires-Dist: numpy",
        "Provides-Extra: torch",
        "Requires-Dist: torch; extra == \"torch\"",
        "Description-Content-Type: text/markdown",
        "",
        open(readme, encoding="utf-8").read(),
    ])


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"{name},sha256={digest.decode()},{len(data)}"


def add(zf: zipfile.ZipFile, name: str, data: bytes, executable: bool) -> None:
    info = zipfile.ZipInfo(name, EPOCH)
    info.external_attr = (0o755 if executable else 0o644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)


def build(out_dir: str, header: str, readme: str, files: list) -> str:
    version = abi_version(header)
    impl, platform = tags()
    tag = f"{impl}-{impl}-{platform}"
    info_dir = f"pserver-{version}.dist-info"
    entries = {}
    for path in files:
        name = "pserver/" + os.path.basename(path)
        if name in entries:
            sys.exit(f"wheel: two files named {name}")
        with open(path, "rb") as f:
            entries[name] = f.read()
    for needed in ("pserver/__init__.py", "pserver/capi.py", "pserver/_capi.so",
                   "pserver/libpserver.so", "pserver/py.typed"):
        if needed not in entries:
            sys.exit(f"wheel: {needed} is missing from the inputs")
    entries[f"{info_dir}/METADATA"] = metadata(version, readme).encode()
    entries[f"{info_dir}/WHEEL"] = "\n".join([
        "Wheel-Version: 1.0",
        "Generator: pserver python/wheel.py",
        "Root-Is-Purelib: false",
        f"Tag: {tag}",
        "",
    ]).encode()
    entries[f"{info_dir}/top_level.txt"] = b"pserver\n"
    record = [record_line(name, data) for name, data in sorted(entries.items())]
    record.append(f"{info_dir}/RECORD,,")
    entries[f"{info_dir}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = os.path.join(out_dir, f"pserver-{version}-{tag}.whl")
    os.makedirs(out_dir, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        # The dist-info last, RECORD at the very end, as the wheel spec recommends.
        for name in sorted(entries, key=lambda n: (n.startswith(info_dir), n.endswith("RECORD"), n)):
            add(zf, name, entries[name], name.endswith(".so"))
    return path


def main() -> None:
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    out_dir, header, readme, *files = sys.argv[1:]
    print(build(out_dir, header, readme, files))


if __name__ == "__main__":
    main()
