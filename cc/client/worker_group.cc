#include "cc/client/worker_group.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"

namespace pserver {

WorkerGroup::WorkerGroup(Client& client, std::string group, uint32_t size, std::string participant)
    : client_(client),
      group_(std::move(group)),
      size_(size),
      participant_(std::move(participant)) {}

std::vector<WorkerGroup::Chunk> WorkerGroup::Chunks(const std::string& name, size_t bytes,
                                                    size_t element_size) const {
  std::vector<Chunk> chunks;
  for (const BlockSpec& block :
       client_.placement().Blocks(name, bytes / element_size, element_size)) {
    chunks.push_back(
        Chunk{block.offset * element_size, block.elements * element_size, block.server});
  }
  return chunks;
}

absl::Status WorkerGroup::Barrier(BarrierScope scope, const CallOptions& call) {
  if (scope != BarrierScope::kWorkers) PS_RETURN_IF_ERROR(ServerBarrier(call));
  if (scope != BarrierScope::kServers) PS_RETURN_IF_ERROR(WorkerBarrier(call));
  return absl::OkStatus();
}

absl::Status WorkerGroup::WorkerBarrier(const CallOptions& call) {
  const Cancellation::Scope cancel_scope(call.cancel);
  v1::BarrierRequest request;
  request.set_name(absl::StrCat(group_, "/barrier"));
  request.set_generation(++barriers_);
  request.set_size(size_);
  request.set_participant(participant_);
  v1::BarrierResponse response;
  // The group's barriers meet on one server, chosen by name.
  const int server = client_.placement().HomeServer(request.name());
  return client_.RunWithRetries(
      1, [&](size_t) { return server; },
      [&](size_t, Transport& t, absl::Time deadline, Transport::Done done) {
        t.Call("Barrier", request, &response, deadline, std::move(done));
      },
      client_.Deadline(call));
}

absl::Status WorkerGroup::ServerBarrier(const CallOptions& call) {
  const Cancellation::Scope cancel_scope(call.cancel);
  // A barrier of one on every server: it returns once each server is
  // serving and has answered, after the requests this worker sent before.
  v1::BarrierRequest request;
  request.set_name(absl::StrCat(group_, "/servers/", participant_));
  request.set_generation(++server_barriers_);
  request.set_size(1);
  request.set_participant(participant_);
  return client_.CallEveryServer<v1::BarrierResponse>("Barrier", request, call).status();
}

absl::Status WorkerGroup::AllReduce(Tensor* tensor, ReduceOp op, const CallOptions& call) {
  const Cancellation::Scope cancel_scope(call.cancel);
  const std::string name = absl::StrCat(group_, "/allreduce");
  const uint64_t generation = ++reductions_;
  const size_t element_size = ElementSize(tensor->type());
  const std::vector<Chunk> chunks = Chunks(name, tensor->bytes().size(), element_size);
  std::vector<v1::AllReduceRequest> requests(chunks.size());
  std::vector<v1::AllReduceResponse> responses(chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    v1::AllReduceRequest& request = requests[c];
    request.set_name(absl::StrCat(name, "/", c));
    request.set_generation(generation);
    request.set_size(size_);
    request.set_participant(participant_);
    request.set_element_type(tensor->type());
    request.set_data(std::string(tensor->bytes().substr(chunks[c].offset, chunks[c].length)));
    request.set_op(op == ReduceOp::kMean ? v1::AllReduceRequest::MEAN : v1::AllReduceRequest::SUM);
  }
  PS_RETURN_IF_ERROR(client_.RunWithRetries(
      chunks.size(), [&](size_t c) { return chunks[c].server; },
      [&](size_t c, Transport& t, absl::Time deadline, Transport::Done done) {
        t.Call("AllReduce", requests[c], &responses[c], deadline, std::move(done));
      },
      client_.Deadline(call)));
  for (size_t c = 0; c < chunks.size(); ++c) {
    const std::string& data = responses[c].data();
    if (data.size() != chunks[c].length) {
      return absl::DataLossError(absl::StrCat("all-reduce '", group_, "': chunk ", c,
                                              " came back with ", data.size(), " bytes, sent ",
                                              chunks[c].length));
    }
    data.copy(tensor->mutable_data() + chunks[c].offset, data.size());
  }
  return absl::OkStatus();
}

absl::Status WorkerGroup::Broadcast(Tensor* tensor, bool root, const CallOptions& call) {
  const Cancellation::Scope cancel_scope(call.cancel);
  const std::string name = absl::StrCat(group_, "/broadcast");
  const uint64_t generation = ++broadcasts_;
  const std::vector<Chunk> chunks =
      Chunks(name, tensor->bytes().size(), ElementSize(tensor->type()));
  std::vector<v1::BroadcastRequest> requests(chunks.size());
  std::vector<v1::BroadcastResponse> responses(chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    v1::BroadcastRequest& request = requests[c];
    request.set_name(absl::StrCat(name, "/", c));
    request.set_generation(generation);
    request.set_size(size_);
    request.set_participant(participant_);
    request.set_root(root);
    if (root)
      request.set_data(std::string(tensor->bytes().substr(chunks[c].offset, chunks[c].length)));
  }
  PS_RETURN_IF_ERROR(client_.RunWithRetries(
      chunks.size(), [&](size_t c) { return chunks[c].server; },
      [&](size_t c, Transport& t, absl::Time deadline, Transport::Done done) {
        t.Call("Broadcast", requests[c], &responses[c], deadline, std::move(done));
      },
      client_.Deadline(call)));
  if (root) return absl::OkStatus();
  for (size_t c = 0; c < chunks.size(); ++c) {
    const std::string& data = responses[c].data();
    if (data.size() != chunks[c].length) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast '", group_, "': the root's chunk ", c, " has ", data.size(),
                       " bytes, this member's tensor expects ", chunks[c].length,
                       " (members must pass tensors of the root's type and shape)"));
    }
    data.copy(tensor->mutable_data() + chunks[c].offset, data.size());
  }
  return absl::OkStatus();
}

}  // namespace pserver
