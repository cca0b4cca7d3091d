// cuda_bench: optimizer update bandwidth on a CUDA device against the
// device's peak memory bandwidth, and host<->device copy throughput (pinned
// and pageable memory).
//
//   bazel run -c opt //bench:cuda_bench -- [--elements=67108864] [--iters=20]
//
// Bandwidth counts the bytes each update must move: it reads the parameters,
// the gradient and every state slot, and writes the parameters and slots
// (e.g. Adam with float32 gradients: 4 reads + 3 writes of 4 bytes = 28 B per
// element). Without a device it prints "no CUDA device: <reason>" and exits 0.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "cc/cuda/buffer.h"
#include "cc/cuda/device.h"
#include "cc/cuda/device_optimizer.h"
#include "cc/cuda/device_rows.h"

ABSL_FLAG(uint64_t, elements, uint64_t{1} << 26, "float32 parameters per optimizer update.");
ABSL_FLAG(int, iters, 20, "Timed repetitions of each measurement (after one warm-up).");
ABSL_FLAG(uint64_t, copy_bytes, uint64_t{256} << 20, "Bytes per host<->device copy.");

namespace pserver {
namespace cuda {
namespace {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

#define BENCH_CHECK_OK(expr)                                                     \
  do {                                                                          \
    absl::Status bench_status_ = (expr);                                        \
    if (!bench_status_.ok()) {                                                  \
      std::fprintf(stderr, "cuda_bench: %s\n", bench_status_.ToString().c_str()); \
      return 1;                                                                 \
    }                                                                           \
  } while (0)

int Run() {
  absl::StatusOr<DeviceInfo> info = GetDeviceInfo(0);
  if (!info.ok()) {
    std::printf("no CUDA device: %s\n", std::string(info.status().message()).c_str());
    return 0;
  }
  std::printf("device: %s\n", info->ToString().c_str());
  const double peak = info->memory_bandwidth_gbps;
  const size_t n = absl::GetFlag(FLAGS_elements);
  const int iters = absl::GetFlag(FLAGS_iters);

  absl::StatusOr<Stream> stream = Stream::Create(0);
  BENCH_CHECK_OK(stream.status());
  absl::StatusOr<DeviceBuffer> params = DeviceBuffer::Allocate(0, n * 4);
  BENCH_CHECK_OK(params.status());
  BENCH_CHECK_OK(params->Fill(0));

  struct Case {
    const char* name;
    v1::ParameterConfig config;
    int slots;
  };
  std::vector<Case> cases(5);
  cases[0] = {"sgd", {}, 0};
  cases[1] = {"sgd momentum", {}, 1};
  cases[1].config.mutable_optimizer()->mutable_sgd()->set_momentum(0.9);
  cases[2] = {"adagrad", {}, 1};
  cases[2].config.mutable_optimizer()->mutable_adagrad();
  cases[3] = {"adam", {}, 2};
  cases[3].config.mutable_optimizer()->mutable_adam();
  cases[4] = {"adamw", {}, 2};
  cases[4].config.mutable_optimizer()->mutable_adamw();

  std::printf("\noptimizer update, %zu float32 parameters (%.0f MiB), %d iterations\n", n,
              n * 4 / 1048576.0, iters);
  std::printf("%-14s %-9s %10s %10s %10s %8s\n", "optimizer", "gradient", "B/elem", "ms/update",
              "GB/s", "% peak");
  for (const Case& c : cases) {
    for (ElementType grad_type : {v1::FLOAT32, v1::BFLOAT16}) {
      const size_t grad_size = grad_type == v1::FLOAT32 ? 4 : 2;
      absl::StatusOr<DeviceBuffer> grad = DeviceBuffer::Allocate(0, n * grad_size);
      BENCH_CHECK_OK(grad.status());
      BENCH_CHECK_OK(grad->Fill(0));
      auto opt = DeviceOptimizer::Create(c.config, n, 0);
      BENCH_CHECK_OK(opt.status());
      BENCH_CHECK_OK((*opt)->Apply(*params, *grad, grad_type, std::nullopt, &*stream));  // warm-up
      BENCH_CHECK_OK(stream->Synchronize());
      auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        BENCH_CHECK_OK((*opt)->Apply(*params, *grad, grad_type, std::nullopt, &*stream));
      }
      BENCH_CHECK_OK(stream->Synchronize());
      const double seconds = Seconds(start) / iters;
      const double bytes_per_element = 4 * 2 + grad_size + 4 * 2 * c.slots;
      const double gbps = bytes_per_element * n / seconds / 1e9;
      std::printf("%-14s %-9s %10.0f %10.3f %10.1f %7.1f%%\n", c.name,
                  grad_type == v1::FLOAT32 ? "float32" : "bfloat16", bytes_per_element,
                  seconds * 1e3, gbps, peak > 0 ? 100 * gbps / peak : 0.0);
    }
  }
  if (peak > 0) std::printf("peak DRAM bandwidth (from clock and bus width): %.0f GB/s\n", peak);

  // Sparse rows: gather and scatter-apply (Adagrad) of 64Ki rows of dim 64.
  {
    const uint32_t dim = 64, table_rows = 1 << 20, batch = 1 << 16;
    v1::RowOptimizer config;
    config.mutable_adagrad();
    auto rows = DeviceRows::Create(config, dim, table_rows, 0, "bench rows");
    BENCH_CHECK_OK(rows.status());
    std::vector<uint32_t> index(batch);
    for (uint32_t i = 0; i < batch; ++i) index[i] = (i * 2654435761u) % table_rows;
    absl::StatusOr<DeviceBuffer> out = DeviceBuffer::Allocate(0, size_t{batch} * dim * 4);
    BENCH_CHECK_OK(out.status());
    BENCH_CHECK_OK(out->Fill(0));
    BENCH_CHECK_OK((*rows)->Gather(index, *out));
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) BENCH_CHECK_OK((*rows)->Gather(index, *out, &*stream));
    BENCH_CHECK_OK(stream->Synchronize());
    double seconds = Seconds(start) / iters;
    std::printf("\nsparse gather, %u rows of dim %u: %.3f ms (%.1f GB/s of rows, host index "
                "upload included)\n",
                batch, dim, seconds * 1e3, 2.0 * batch * dim * 4 / seconds / 1e9);
    BENCH_CHECK_OK((*rows)->ScatterApply(index, *out, v1::FLOAT32));
    start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      BENCH_CHECK_OK((*rows)->ScatterApply(index, *out, v1::FLOAT32, &*stream));
    }
    BENCH_CHECK_OK(stream->Synchronize());
    seconds = Seconds(start) / iters;
    std::printf("sparse scatter-apply (adagrad), %u rows of dim %u: %.3f ms (%.1f GB/s, host "
                "planning included)\n",
                batch, dim, seconds * 1e3, 5.0 * batch * dim * 4 / seconds / 1e9);
  }

  // Host <-> device copies.
  const size_t bytes = absl::GetFlag(FLAGS_copy_bytes);
  absl::StatusOr<DeviceBuffer> dev = DeviceBuffer::Allocate(0, bytes);
  BENCH_CHECK_OK(dev.status());
  absl::StatusOr<PinnedBuffer> pinned = PinnedBuffer::Allocate(bytes);
  BENCH_CHECK_OK(pinned.status());
  std::memset(pinned->data(), 1, bytes);
  std::vector<char> pageable(bytes, 1);
  std::printf("\nhost<->device copies of %.0f MiB\n", bytes / 1048576.0);
  auto time_copy = [&](const char* what, bool to_device, void* host) -> int {
    auto copy = [&]() {
      return to_device ? CopyToDevice(*dev, 0, host, bytes, &*stream)
                       : CopyToHost(host, *dev, 0, bytes, &*stream);
    };
    BENCH_CHECK_OK(copy());
    BENCH_CHECK_OK(stream->Synchronize());
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) BENCH_CHECK_OK(copy());
    BENCH_CHECK_OK(stream->Synchronize());
    const double seconds = Seconds(start) / iters;
    std::printf("%-28s %8.2f GB/s\n", what, bytes / seconds / 1e9);
    return 0;
  };
  if (time_copy("host to device, pinned", true, pinned->data()) != 0) return 1;
  if (time_copy("device to host, pinned", false, pinned->data()) != 0) return 1;
  if (time_copy("host to device, pageable", true, pageable.data()) != 0) return 1;
  if (time_copy("device to host, pageable", false, pageable.data()) != 0) return 1;
  return 0;
}

}  // namespace
}  // namespace cuda
}  // namespace pserver

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pserver::cuda::Run();
}
