// device_io_bench: push/pull throughput from and into CUDA device memory
// (cc/client/device_io.h: staged through pinned host memory, copies
// overlapping the network) against the host push/pull of the same
// parameter, through a LocalCluster over gRPC (or in process).
//
//   bazel run -c opt //bench:device_io_bench -- [--mib=64] [--iters=10] [--servers=2]
//       [--chunk_mib=4] [--in_process] [--host_space]
//
// Without a device it prints "no CUDA device: <reason>" and exits 0, unless
// --host_space, which runs the same pipeline over host memory
// (HostMemorySpace: memcpy instead of PCIe copies) to measure its overhead
// on any machine.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "cc/client/client.h"
#include "cc/client/device_io.h"
#include "cc/server/in_process_transport.h"
#include "cc/client/memory_space.h"
#include "cc/core/tensor.h"
#include "cc/cuda/buffer.h"
#include "cc/cuda/device.h"
#include "cc/server/local_cluster.h"

ABSL_FLAG(int, mib, 64, "Parameter size in MiB (float32).");
ABSL_FLAG(int, iters, 10, "Timed repetitions of each measurement (after one warm-up).");
ABSL_FLAG(int, servers, 2, "Servers in the LocalCluster.");
ABSL_FLAG(int, chunk_mib, 4, "DeviceIo chunk size in MiB.");
ABSL_FLAG(int, block_kib, 1024, "Client block size in KiB.");
ABSL_FLAG(bool, in_process, false, "In-process client (no gRPC, no sockets).");
ABSL_FLAG(bool, host_space, false,
          "Run the pipeline over host memory (no GPU needed): its overhead only.");

namespace pserver {
namespace {

#define BENCH_CHECK_OK(expr)                                                           \
  do {                                                                                 \
    absl::Status bench_status_ = (expr);                                               \
    if (!bench_status_.ok()) {                                                         \
      std::fprintf(stderr, "device_io_bench: %s\n", bench_status_.ToString().c_str()); \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)

int Run() {
  const bool host_space = absl::GetFlag(FLAGS_host_space);
  std::string where = "host memory (HostMemorySpace)";
  if (!host_space) {
    absl::StatusOr<cuda::DeviceInfo> info = cuda::GetDeviceInfo(0);
    if (!info.ok()) {
      std::printf("no CUDA device: %s\n", std::string(info.status().message()).c_str());
      return 0;
    }
    where = info->ToString();
  }
  const size_t n = size_t(absl::GetFlag(FLAGS_mib)) << 18;  // floats
  const size_t bytes = n * 4;
  const int iters = absl::GetFlag(FLAGS_iters);

  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster =
      LocalCluster::Start(absl::GetFlag(FLAGS_servers));
  BENCH_CHECK_OK(cluster.status());
  ClientOptions options;
  options.servers = (*cluster)->addresses();
  options.block_bytes = size_t(absl::GetFlag(FLAGS_block_kib)) << 10;
  options.timeout = absl::Seconds(120);
  absl::StatusOr<std::unique_ptr<Client>> client =
      absl::GetFlag(FLAGS_in_process)
          ? Client::Create(options, InProcessTransports(**cluster))
          : Client::Connect(options);
  BENCH_CHECK_OK(client.status());
  Client& c = **client;

  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = float(i % 1000) * 1e-3f;
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_sgd();
  BENCH_CHECK_OK(c.InitParam("w", Tensor::FromValues<float>({int64_t(n)}, values), config));
  BENCH_CHECK_OK(c.FinishInitParams());

  DeviceIoOptions io_options;
  io_options.chunk_bytes = size_t(absl::GetFlag(FLAGS_chunk_mib)) << 20;
  std::unique_ptr<HostMemorySpace> host;
  std::unique_ptr<DeviceIo> io;
  std::vector<char> host_grad, host_param;  // --host_space's "device" memory
  cuda::DeviceBuffer dev_grad, dev_param;
  const void* grad = nullptr;
  void* param = nullptr;
  if (host_space) {
    host = std::make_unique<HostMemorySpace>(HostMemorySpace::Options{});
    io = std::make_unique<DeviceIo>(&c, host.get(), io_options);
    host_grad.assign(reinterpret_cast<const char*>(values.data()),
                     reinterpret_cast<const char*>(values.data()) + bytes);
    host_param.resize(bytes);
    grad = host_grad.data();
    param = host_param.data();
  } else {
    absl::StatusOr<std::unique_ptr<DeviceIo>> made = DeviceIo::ForCuda(&c, 0, io_options);
    BENCH_CHECK_OK(made.status());
    io = *std::move(made);
    absl::StatusOr<cuda::DeviceBuffer> g = cuda::DeviceBuffer::Allocate(0, bytes);
    BENCH_CHECK_OK(g.status());
    absl::StatusOr<cuda::DeviceBuffer> p = cuda::DeviceBuffer::Allocate(0, bytes);
    BENCH_CHECK_OK(p.status());
    dev_grad = *std::move(g);
    dev_param = *std::move(p);
    BENCH_CHECK_OK(cuda::CopyToDevice(dev_grad, 0, values.data(), bytes));
    grad = dev_grad.data();
    param = dev_param.data();
  }

  std::printf(
      "device_io_bench: %.0f MiB float32 parameter, %d servers (%s), %zu KiB blocks, "
      "%d MiB chunks\nmemory: %s\n\n",
      bytes / 1048576.0, c.num_servers(), absl::GetFlag(FLAGS_in_process) ? "in process" : "gRPC",
      options.block_bytes >> 10, absl::GetFlag(FLAGS_chunk_mib), where.c_str());
  std::printf("%-22s %10s %10s %12s %12s\n", "call", "ms", "GB/s", "copy wait ms", "net wait ms");

  const Tensor host_grad_tensor = Tensor::FromValues<float>({int64_t(n)}, values);
  Tensor host_out;
  auto time = [&](const char* what, const std::function<absl::Status()>& call, bool device) -> int {
    BENCH_CHECK_OK(call());  // warm-up (allocates staging)
    double copy_ms = 0, net_ms = 0;
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      BENCH_CHECK_OK(call());
      if (device) {
        copy_ms += absl::ToDoubleMilliseconds(io->last_stats().copy_wait_time);
        net_ms += absl::ToDoubleMilliseconds(io->last_stats().network_wait_time);
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
    if (device) {
      std::printf("%-22s %10.2f %10.2f %12.2f %12.2f\n", what, seconds * 1e3, bytes / seconds / 1e9,
                  copy_ms / iters, net_ms / iters);
    } else {
      std::printf("%-22s %10.2f %10.2f %12s %12s\n", what, seconds * 1e3, bytes / seconds / 1e9,
                  "-", "-");
    }
    return 0;
  };
  const std::string name = "w";
  const Shape shape = {int64_t(n)};
  if (time(
          "host push", [&] { return c.SendGrad(name, host_grad_tensor); }, false))
    return 1;
  if (time(
          "device push", [&] { return io->SendGrad(name, v1::FLOAT32, shape, grad); }, true)) {
    return 1;
  }
  if (time(
          "host pull", [&] { return c.GetParamsInto({name}, absl::MakeSpan(&host_out, 1)); },
          false)) {
    return 1;
  }
  if (time(
          "device pull", [&] { return io->GetParam(name, param, bytes); }, true))
    return 1;
  if (time(
          "host push-pull", [&] { return c.PushPull(name, host_grad_tensor, &host_out); }, false)) {
    return 1;
  }
  if (time(
          "device push-pull", [&] { return io->PushPull(name, v1::FLOAT32, shape, grad, param); },
          true)) {
    return 1;
  }
  std::printf(
      "\nGB/s: parameter bytes per call / time per call (a push-pull moves them "
      "twice).\n");
  return 0;
}

}  // namespace
}  // namespace pserver

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pserver::Run();
}
