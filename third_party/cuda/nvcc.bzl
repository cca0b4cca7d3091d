"""cuda_kernels: compiles .cu files with nvcc (from @cuda) into a static archive.

    cuda_kernels(
        name = "kernels_nvcc",
        srcs = ["optimizer_kernels.cu"],
        hdrs = ["kernels.h"],  # headers the .cu files include (as "cc/cuda/...")
    )

makes :kernels_nvcc, a cc_library over lib<name>.a linked with the static CUDA
runtime. Each .cu is one nvcc call (one action, so they compile in parallel):
-std=c++17 -O2 -Xcompiler -fPIC, SASS for sm_80 and sm_90 plus compute_90 PTX
(so newer GPUs JIT it), and --fmad=false: no fused multiply-add, so every
float operation rounds exactly as the CPU optimizers' (x86-64 without -mfma)
and the device and host updates agree bit for bit where the formulas match.
The .cu files may include only the CUDA headers and plain C++ headers.

Every target is tagged manual: `bazel build //...` builds them only through
a dependency (cc/cuda:runtime picks them when @cuda found nvcc), so a machine
without CUDA never runs nvcc. If nvcc is missing and the build was forced
with --config=cuda, the action fails saying so.
"""

load("@cuda//:defs.bzl", "CUDA_PATH", "CUDA_REASON", "NVCC")

NVCC_FLAGS = [
    "-std=c++17",
    "-O2",
    "-Xcompiler",
    "-fPIC",
    "--fmad=false",
    "'-gencode=arch=compute_90,code=[sm_90,compute_90]'",
    "-gencode=arch=compute_80,code=sm_80",
]

def cuda_kernels(name, srcs, hdrs = [], visibility = None):
    objects = []
    for src in srcs:
        obj = "_%s_objs/%s.o" % (name, src.replace(".cu", ""))
        native.genrule(
            name = "%s_%s_nvcc" % (name, src.replace(".cu", "").replace("/", "_")),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = " ".join([
                'if [ ! -x "%s" ]; then echo "cuda_kernels: cannot compile %s: %s (--config=cuda needs the CUDA toolkit; set CUDA_PATH)" >&2; exit 1; fi;' % (NVCC, src, CUDA_REASON),
                NVCC,
            ] + NVCC_FLAGS + [
                "-I.",
                "-I$(GENDIR)",
                "-c $(location %s)" % src,
                "-o $@",
            ]),
            message = "nvcc %s" % src,
            tags = ["manual"],
        )
        objects.append(obj)
    native.genrule(
        name = name + "_archive",
        srcs = objects,
        outs = ["lib%s.a" % name],
        cmd = "rm -f $@ && ar rcs $@ $(SRCS)",
        message = "ar lib%s.a" % name,
        tags = ["manual"],
    )
    native.cc_library(
        name = name,
        srcs = ["lib%s.a" % name],
        deps = ["@cuda//:cudart_static"],
        visibility = visibility,
        tags = ["manual"],
    )
