// Client: a trainer's handle on a set of parameter servers.
//
//   ClientOptions options;
//   options.servers = {"127.0.0.1:7000", "127.0.0.1:7001"};
//   PS_ASSIGN_OR_RETURN(auto client, Client::Connect(options));
//   v1::ParameterConfig config;
//   config.mutable_optimizer()->mutable_adam();
//   PS_RETURN_IF_ERROR(client->InitParam("w", Tensor::FromValues<float>({2}, {0, 0}), config));
//   PS_RETURN_IF_ERROR(client->FinishInitParams());
//   PS_RETURN_IF_ERROR(client->SendGrad("w", Tensor::FromValues<float>({2}, {.1f, -.2f})));
//   PS_ASSIGN_OR_RETURN(Tensor w, client->GetParam("w"));
//
// Placement: a parameter lives on fnv1a64(name) % N; one larger than
// `block_bytes` is cut into blocks spread over all servers and put back
// together on Get. Calls to different servers go out in parallel, and every
// call has a deadline (`timeout`). A batch is checked against the layouts the
// client knows before anything is sent; each server applies its part whole or
// not at all.
//
// Thread-safe: one Client may serve many trainer threads.
#ifndef PSERVER_CC_CLIENT_CLIENT_H_
#define PSERVER_CC_CLIENT_CLIENT_H_

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cc/client/placement.h"
#include "cc/client/transport.h"
#include "cc/core/tensor.h"
#include "pserver/v1/config.pb.h"
#include "pserver/v1/service.pb.h"

namespace pserver {

struct ClientOptions {
  // host:port of every server, in shard-index order.
  std::vector<std::string> servers;
  // Parameters larger than this are split into blocks over all servers.
  // Every client of a cluster must use the same value.
  size_t block_bytes = size_t{1} << 20;
  // Batches are cut into requests of about this many payload bytes.
  size_t max_request_bytes = size_t{1} << 20;
  // Deadline of every call.
  absl::Duration timeout = absl::Seconds(30);
  // gRPC channels (TCP connections) per server; calls are spread over them.
  int channels_per_server = 2;
};

// A named tensor: a gradient to send, or a parameter to initialize.
struct NamedTensor {
  std::string name;
  Tensor tensor;
};

struct ParamInit {
  std::string name;
  Tensor value;
  v1::ParameterConfig config;
};

class Client {
 public:
  // A client over gRPC to options.servers. INVALID_ARGUMENT for no servers,
  // an empty address, or a zero block size, request size or timeout.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  // A client over the given transports (one per server, in index order);
  // options.servers is ignored.
  static absl::StatusOr<std::unique_ptr<Client>> Create(
      const ClientOptions& options, std::vector<std::unique_ptr<Transport>> transports);

  ~Client();

  // Initializes a parameter (all its blocks). The first init of a name wins;
  // later ones get ALREADY_EXISTS "pserver already initialized".
  absl::Status InitParam(const std::string& name, const Tensor& value,
                         const v1::ParameterConfig& config = {});
  absl::Status InitParams(absl::Span<const ParamInit> params);

  // Tells every server that initialization is over; idempotent.
  absl::Status FinishInitParams();

  absl::StatusOr<Tensor> GetParam(const std::string& name);
  // The parameters in the order of `names`.
  absl::StatusOr<std::vector<Tensor>> GetParams(absl::Span<const std::string> names);
  // Like GetParams, into `outs` (one per name): a tensor that already has the
  // parameter's type and shape is filled in place, without allocating, so a
  // training loop can pull into the same buffers every step. On error the
  // contents of `outs` are unspecified.
  absl::Status GetParamsInto(absl::Span<const std::string> names, absl::Span<Tensor> outs);

  // Gradients are sent straight from the tensors' memory (no copy).
  absl::Status SendGrad(const std::string& name, const Tensor& grad);
  absl::Status SendGrads(absl::Span<const NamedTensor> grads);

  // Sends the gradients and reads the updated parameters back in one round
  // trip per server: outs[i] gets parameter grads[i].name after its update
  // (filled in place when it already has the right type and shape).
  absl::Status PushPull(absl::Span<const NamedTensor> grads, absl::Span<Tensor> outs);

  // One entry per server, in index order.
  absl::StatusOr<std::vector<v1::ServerStats>> GetStats();

  int num_servers() const { return placement_.num_servers(); }
  const Placement& placement() const { return placement_; }

 private:
  // What the client knows of a parameter after init or a first read.
  struct Layout {
    ElementType type;
    Shape shape;
    uint64_t elements;
    uint32_t blocks;
  };
  struct Assembly;
  struct Exchange;
  struct Item;
  // Borrowed forms of NamedTensor and ParamInit: the public single and
  // batched calls share one implementation without copying any tensor.
  struct GradRef {
    const std::string* name;
    const Tensor* tensor;
  };
  struct InitRef {
    const std::string* name;
    const Tensor* value;
    const v1::ParameterConfig* config;
  };
  static std::vector<GradRef> RefsOf(absl::Span<const NamedTensor> grads);

  Client(const ClientOptions& options, std::vector<std::unique_ptr<Transport>> transports);

  absl::Time Deadline() const { return absl::Now() + options_.timeout; }
  std::optional<Layout> FindLayout(const std::string& name) const;
  void RememberLayout(const std::string& name, Layout layout);
  absl::Status DoInitParams(absl::Span<const InitRef> params);
  absl::Status DoSendGrads(absl::Span<const GradRef> grads);
  absl::Status DoPushPull(absl::Span<const GradRef> grads, absl::Span<Tensor> outs);
  // Checks a gradient against what is known of its parameter.
  absl::Status CheckGradient(const GradRef& grad) const;
  // The blocks of a gradient, as views of its memory.
  std::vector<GradientView> GradientBlocks(const GradRef& grad,
                                           std::vector<int>* servers) const;
  // Packs `items` into one request per server of about max_request_bytes
  // each, runs them all in parallel and places every returned block.
  absl::Status Run(const std::vector<Item>& items, std::vector<Assembly>& assemblies);
  // Copies one returned block into its parameter's output.
  absl::Status PlaceBlock(Assembly& a, const v1::Parameter& header, const Segments& content,
                          const std::string& from);

  const ClientOptions options_;
  const Placement placement_;
  std::vector<std::unique_ptr<Transport>> transports_;

  mutable absl::Mutex layouts_mu_;
  absl::flat_hash_map<std::string, Layout> layouts_ ABSL_GUARDED_BY(layouts_mu_);
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_CLIENT_H_
