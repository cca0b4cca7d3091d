// WorkerGroup: barrier, broadcast and all-reduce among a fixed group of
// workers, done through the parameter servers (BytePS-style: the servers
// sum, the workers never talk to each other).
//
//   // In each of 4 workers (ranks 0..3), each with its own Client:
//   WorkerGroup group(*client, "trainers", /*size=*/4, absl::StrCat("w", rank));
//   PS_RETURN_IF_ERROR(group.Barrier());
//   PS_RETURN_IF_ERROR(group.AllReduce(&grad, ReduceOp::kMean));
//   PS_RETURN_IF_ERROR(group.Broadcast(&weights, /*root=*/rank == 0));
//
// Every member must make the same sequence of collective calls: the k-th
// call of a kind meets the other members' k-th call (its round). An
// all-reduce's tensor is cut into chunks of the client's block_bytes, spread
// over all servers like a dense parameter's blocks, and reduced there in
// parallel; every member receives identical bytes.
//
// Not thread-safe: one WorkerGroup per worker thread.
#ifndef PSERVER_CC_CLIENT_WORKER_GROUP_H_
#define PSERVER_CC_CLIENT_WORKER_GROUP_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "cc/client/client.h"
#include "cc/core/reduce_op.h"
#include "cc/core/tensor.h"

namespace pserver {

// Who a barrier waits for.
enum class BarrierScope {
  kWorkers,  // every member of the group has arrived
  kServers,  // every server is serving and has answered (and, having done so,
             // has finished every request this worker made before)
  kAll,      // both
};

class WorkerGroup {
 public:
  // `size` >= 1 members; `participant`: this member's id, unique in the group.
  // `client` must outlive this object.
  WorkerGroup(Client& client, std::string group, uint32_t size, std::string participant);

  const std::string& group() const { return group_; }
  uint32_t size() const { return size_; }

  // DEADLINE_EXCEEDED (the call's deadline) names how many members arrived.
  absl::Status Barrier(BarrierScope scope = BarrierScope::kWorkers, const CallOptions& call = {});

  // Replaces `tensor` by the element-wise sum (or mean) over all members'
  // tensors, which must have the same type and shape (INVALID_ARGUMENT).
  absl::Status AllReduce(Tensor* tensor, ReduceOp op = ReduceOp::kSum,
                         const CallOptions& call = {});

  // The root's `tensor` is copied into every other member's `tensor`, which
  // must already have the root's type and shape. Exactly one member is root.
  absl::Status Broadcast(Tensor* tensor, bool root, const CallOptions& call = {});

 private:
  // Each chunk of `bytes` elements of `element_size`: its offset, length
  // and server.
  struct Chunk {
    size_t offset;
    size_t length;
    int server;
  };
  std::vector<Chunk> Chunks(const std::string& name, size_t bytes, size_t element_size) const;
  absl::Status WorkerBarrier(const CallOptions& call);
  absl::Status ServerBarrier(const CallOptions& call);

  Client& client_;
  const std::string group_;
  const uint32_t size_;
  const std::string participant_;
  // Rounds so far, per kind of call.
  uint64_t barriers_ = 0;
  uint64_t server_barriers_ = 0;
  uint64_t reductions_ = 0;
  uint64_t broadcasts_ = 0;
};

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_WORKER_GROUP_H_
