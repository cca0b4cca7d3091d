// What bench:e2e's groups initialise parameters with.
#ifndef PSERVER_BENCH_PARAMS_H_
#define PSERVER_BENCH_PARAMS_H_

#include <cstdint>
#include <vector>

#include "cc/core/tensor.h"
#include "pserver/v1/config.pb.h"

namespace pserver::bench {

// Plain SGD with a learning rate small enough to keep values steady.
inline v1::ParameterConfig Sgd() {
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_sgd();
  config.mutable_learning_rate()->set_learning_rate(1e-9);
  return config;
}

// A float32 tensor of `bytes` bytes, every element `value`.
inline Tensor Filled(uint64_t bytes, float value) {
  const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
  return Tensor::FromValues<float>({n}, std::vector<float>(n, value));
}

}  // namespace pserver::bench

#endif  // PSERVER_BENCH_PARAMS_H_
