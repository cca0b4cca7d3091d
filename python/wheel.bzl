"""pserver_wheel: the pserver wheel, built by python/wheel.py with Debian's /usr/bin/python3.

The wheel's file name holds the version (from pserver.h) and the interpreter's
tag, known only when it is built, so the rule's output is a folder holding
that one .whl: bazel-bin/python/<name>/pserver-<version>-<tag>.whl.
"""

def _pserver_wheel_impl(ctx):
    out = ctx.actions.declare_directory(ctx.label.name)
    files = ctx.files.package
    args = ctx.actions.args()
    args.add(ctx.file._builder)
    args.add(out.path)
    args.add(ctx.file.header)
    args.add(ctx.file.readme)
    args.add_all(files)
    ctx.actions.run_shell(
        inputs = files + [ctx.file._builder, ctx.file.header, ctx.file.readme],
        outputs = [out],
        command = "/usr/bin/python3 \"$@\" > /dev/null",
        arguments = [args],
        mnemonic = "PserverWheel",
        progress_message = "Building the pserver wheel",
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles([out]))]

pserver_wheel = rule(
    implementation = _pserver_wheel_impl,
    attrs = {
        "package": attr.label_list(allow_files = True, doc = "Files of the `pserver/` folder."),
        "header": attr.label(allow_single_file = True, doc = "pserver.h: the version."),
        "readme": attr.label(allow_single_file = True, doc = "The long description."),
        "_builder": attr.label(default = "//python:wheel.py", allow_single_file = True),
    },
)
