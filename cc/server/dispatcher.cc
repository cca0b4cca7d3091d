#include "cc/server/dispatcher.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/notification.h"
#include "cc/core/table_keys.h"
#include "cc/core/status_macros.h"
#include "cc/server/state_checksum.h"

namespace pserver {

namespace protobuf = google::protobuf;

const char Dispatcher::kMethodPrefix[] = "/pserver.v1.ParameterServer/";
const char* const Dispatcher::kWriteMethods[] = {
    "InitParam", "FinishInitParams", "SendGrad",  "Save",      "CreateTable", "TablePush",
    "Clock",     "Barrier",          "AllReduce", "Broadcast", nullptr};

const char* const Dispatcher::kReplicatedMethods[] = {
    "InitParam", "FinishInitParams", "SendGrad", "CreateTable", "TablePush", "Clock", nullptr};

ReplyHold& ReplyHold::operator=(ReplyHold&& other) noexcept {
  if (this != &other) {
    Reset();
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::Status ReplyHold::Acquire(ReplyBudget* budget, uint64_t bytes) {
  Reset();
  PS_RETURN_IF_ERROR(budget->Acquire(bytes));
  budget_ = budget;
  bytes_ = bytes;
  return absl::OkStatus();
}

void ReplyHold::Reset() {
  if (budget_ != nullptr) budget_->Release(bytes_);
  budget_ = nullptr;
  bytes_ = 0;
}

Dispatcher::Dispatcher(ParameterStore* store, Tables* tables, uint32_t index, DispatcherHooks hooks)
    : store_(store),
      tables_(tables),
      index_(index),
      hooks_(std::move(hooks)),
      reply_budget_(hooks_.max_reply_bytes_in_flight),
      service_(v1::GetStatsRequest::descriptor()->file()->FindServiceByName("ParameterServer")) {
  push_metrics_ = request_metrics_.Add("Push");
  read_metrics_ = request_metrics_.Add("Read");
  AddControlMethods();
  for (const char* const* name = kWriteMethods; *name != nullptr; ++name) {
    auto it = methods_.find(*name);
    if (it == methods_.end()) {
      std::fprintf(stderr, "Dispatcher: write method %s has no handler\n", *name);
      std::abort();  // a build mistake, which every test sees
    }
    it->second.writes = true;
  }
  for (const char* const* name = kReplicatedMethods; *name != nullptr; ++name) {
    methods_.at(*name).replicated = true;
  }
  table_push_metrics_ = methods_.at("TablePush").metrics;
  table_pull_metrics_ = methods_.at("TablePull").metrics;
}

Dispatcher::Method& Dispatcher::Add(const char* name, bool needs_serving,
                                    const protobuf::Descriptor* request,
                                    const protobuf::Descriptor* response) {
  const protobuf::MethodDescriptor* descriptor =
      service_ == nullptr ? nullptr : service_->FindMethodByName(name);
  if (descriptor == nullptr || descriptor->input_type() != request ||
      descriptor->output_type() != response) {
    // A handler the proto does not declare so: a build mistake, which every
    // test sees.
    std::fprintf(stderr, "Dispatcher: pserver.v1.ParameterServer has no method %s(%s) -> %s\n",
                 name, request->full_name().c_str(), response->full_name().c_str());
    std::abort();
  }
  protobuf::MessageFactory* factory = protobuf::MessageFactory::generated_factory();
  Method& method = methods_[name];
  method.descriptor = descriptor;
  method.request_prototype = factory->GetPrototype(descriptor->input_type());
  method.response_prototype = factory->GetPrototype(descriptor->output_type());
  method.needs_serving = needs_serving;
  method.metrics = request_metrics_.Add(name);
  return method;
}

template <typename Request, typename Response>
void Dispatcher::Sync(const char* name, std::function<absl::Status(const Request&, Response*)> run,
                      bool needs_serving) {
  Method& method = Add(name, needs_serving, Request::descriptor(), Response::descriptor());
  method.run = [run = std::move(run)](const protobuf::Message& request, protobuf::Message* response,
                                      const CallContext&, Done done) -> CancelWait {
    done(run(static_cast<const Request&>(request), static_cast<Response*>(response)));
    return [] {};
  };
}

template <typename Request, typename Response>
void Dispatcher::Wait(
    const char* name,
    std::function<CancelWait(const Request&, Response*, absl::Time, WaitDone)> run) {
  Method& method = Add(name, /*needs_serving=*/true, Request::descriptor(), Response::descriptor());
  method.run = [run = std::move(run)](const protobuf::Message& request, protobuf::Message* response,
                                      const CallContext& call, Done done) -> CancelWait {
    const absl::Time deadline = std::min(call.deadline, absl::Now() + kMaxWait);
    return run(static_cast<const Request&>(request), static_cast<Response*>(response), deadline,
               std::move(done));
  };
}

void Dispatcher::AddControlMethods() {
  using namespace v1;  // NOLINT: the message types of one service
  Sync<InitParamRequest, InitParamResponse>(
      "InitParam", [this](const InitParamRequest& request, InitParamResponse*) {
        return store_->Init(request.parameter(), request.config());
      });
  Sync<FinishInitParamsRequest, FinishInitParamsResponse>(
      "FinishInitParams", [this](const FinishInitParamsRequest&, FinishInitParamsResponse*) {
        store_->FinishInit();
        return absl::OkStatus();
      });
  Add("GetParam", true, GetParamRequest::descriptor(), GetParamResponse::descriptor()).run =
      [this](const protobuf::Message& request, protobuf::Message* response, const CallContext& call,
             Done done) -> CancelWait {
    ReplyHold local;
    done(GetParam(static_cast<const GetParamRequest&>(request),
                  static_cast<GetParamResponse*>(response),
                  call.reply != nullptr ? call.reply : &local));
    return [] {};
  };
  Sync<GetParamInfoRequest, GetParamInfoResponse>(
      "GetParamInfo", [this](const GetParamInfoRequest& request, GetParamInfoResponse* response) {
        v1::ParamRef ref;
        ref.set_name(request.name());
        // The header of block 0; its bytes are neither copied nor sent.
        return RedirectDropped(
            store_->Read(ref, response->mutable_parameter(), [](absl::string_view) {}), ref);
      });
  Sync<SendGradRequest, SendGradResponse>(
      "SendGrad", [this](const SendGradRequest& request, SendGradResponse*) {
        const Gradient* grad = &request.gradient();
        return store_->ApplyGradients(absl::MakeConstSpan(&grad, 1));
      });
  Sync<GetStatsRequest, GetStatsResponse>(
      "GetStats",
      [this](const GetStatsRequest& request, GetStatsResponse* response) {
        FillStats(response->mutable_stats());
        if (request.state_checksum()) {
          PS_ASSIGN_OR_RETURN(StoreSnapshot snapshot, Snapshot());
          PS_ASSIGN_OR_RETURN(uint32_t checksum, ShardStateChecksum(snapshot));
          response->mutable_stats()->set_state_checksum(checksum);
        }
        return absl::OkStatus();
      },
      /*needs_serving=*/false);
  Sync<ListParamsRequest, ListParamsResponse>(
      "ListParams", [this](const ListParamsRequest& request, ListParamsResponse* response) {
        const uint32_t max = request.max_entries() == 0
                                 ? kMaxListParamsEntries
                                 : std::min(request.max_entries(), kMaxListParamsEntries);
        for (v1::ParamListing& p : store_->List(request.page_token(), max)) {
          *response->add_params() = std::move(p);
        }
        if (static_cast<uint32_t>(response->params_size()) == max) {
          response->set_next_page_token(response->params(max - 1).name());
        }
        return absl::OkStatus();
      });
  Sync<SaveRequest, SaveResponse>("Save", [this](const SaveRequest&, SaveResponse* response) {
    if (!hooks_.save) {
      return absl::FailedPreconditionError(
          "this server has no checkpoint directory (--checkpoint_dir)");
    }
    PS_ASSIGN_OR_RETURN(*response->mutable_checkpoint(), hooks_.save());
    return absl::OkStatus();
  });
  Sync<ListWorkersRequest, ListWorkersResponse>(
      "ListWorkers",
      [this](const ListWorkersRequest&, ListWorkersResponse* response) {
        if (!hooks_.list_workers) {
          return absl::FailedPreconditionError(
              "this server has no etcd (--etcd): no worker registry");
        }
        PS_ASSIGN_OR_RETURN(std::vector<WorkerInfo> workers, hooks_.list_workers());
        for (WorkerInfo& w : workers) *response->add_workers() = std::move(w);
        return absl::OkStatus();
      },
      /*needs_serving=*/false);
  Sync<OpenChannelRequest, OpenChannelResponse>(
      "OpenChannel",
      [this](const OpenChannelRequest&, OpenChannelResponse* response) {
        if (!hooks_.open_channel) {
          return absl::FailedPreconditionError(
              "this server has no bulk channel (--bulk_channel=off): use gRPC");
        }
        *response = hooks_.open_channel();
        return absl::OkStatus();
      },
      /*needs_serving=*/false);
  Sync<AttachStandbyRequest, AttachStandbyResponse>(
      "AttachStandby",
      [this](const AttachStandbyRequest& request, AttachStandbyResponse* response) {
        if (!hooks_.attach_standby) {
          return absl::FailedPreconditionError(
              "this server takes no standby (start it with --accept_standbys)");
        }
        PS_RETURN_IF_ERROR(CheckWrite());
        PS_ASSIGN_OR_RETURN(*response, hooks_.attach_standby(request));
        return absl::OkStatus();
      });
  Sync<ReplicateRequest, ReplicateResponse>(
      "Replicate",
      [this](const ReplicateRequest& request, ReplicateResponse*) {
        if (!hooks_.replicate) {
          return absl::FailedPreconditionError("this server is no backup (not a --standby)");
        }
        return hooks_.replicate(request);
      },
      /*needs_serving=*/false);
  Wait<MoveBlocksRequest, MoveBlocksResponse>(
      "MoveBlocks", [this](const MoveBlocksRequest& request, MoveBlocksResponse* response,
                           absl::Time, WaitDone done) -> CancelWait {
        if (!hooks_.move_blocks) {
          done(absl::FailedPreconditionError(
              "this server takes part in no live move (start it with --etcd and "
              "--placement_redirects)"));
        } else {
          hooks_.move_blocks(request, response, std::move(done));
        }
        return [] {};
      });
  Sync<ReceiveBlocksRequest, ReceiveBlocksResponse>(
      "ReceiveBlocks",
      [this](const ReceiveBlocksRequest& request, ReceiveBlocksResponse* response) {
        if (!hooks_.receive_blocks) {
          return absl::FailedPreconditionError(
              "this server takes part in no live move (start it with --etcd and "
              "--placement_redirects)");
        }
        PS_RETURN_IF_ERROR(CheckWrite());
        PS_ASSIGN_OR_RETURN(*response, hooks_.receive_blocks(request));
        return absl::OkStatus();
      });
  Sync<CreateTableRequest, CreateTableResponse>(
      "CreateTable", [this](const CreateTableRequest& request, CreateTableResponse*) {
        if (shipper_.load(std::memory_order_acquire) != nullptr) {
          PS_RETURN_IF_ERROR(CheckReplicable(request));
        }
        return tables_->Create(request);
      });
  Wait<TablePullRequest, TablePullResponse>(
      "TablePull", [this](const TablePullRequest& request, TablePullResponse* response,
                          absl::Time deadline, WaitDone done) -> CancelWait {
        if (absl::Status owned = CheckTableKeys(request.table(), request.keys(), /*write=*/false);
            !owned.ok()) {
          done(std::move(owned));
          return [] {};
        }
        // A consistent read may wait for clocks while its keys are handed
        // over: checked again once read (a read changes no row).
        return tables_->PullAsync(
            request, response, deadline,
            [this, &request, response, done = std::move(done)](absl::Status status) {
              if (status.ok()) status = CheckTableKeys(request.table(), request.keys(), false);
              if (!status.ok()) response->Clear();
              done(std::move(status));
            });
      });
  Sync<TablePushRequest, TablePushResponse>(
      "TablePush", [this](const TablePushRequest& request, TablePushResponse* response) {
        // Keys are checked only for a new id, as a bulk push's blocks are.
        // A table push is checked whole before any row changes (host
        // memory): an error is a refusal.
        return ApplyOnce(request.client_id(), request.sequence(), [&](bool&) {
          PS_RETURN_IF_ERROR(CheckTableKeys(request.table(), request.keys(), /*write=*/true));
          return tables_->Push(request, response);
        });
      });
  Sync<ClockRequest, ClockResponse>(
      "Clock", [this](const ClockRequest& request, ClockResponse* response) {
        absl::StatusOr<int64_t> clock = tables_->Clock(request);
        if (absl::IsNotFound(clock.status()) && TableMayArrive()) {
          // A server that joins gets each table (with its clocks) from an
          // old owner during the move: a tick meanwhile is retried.
          return absl::UnavailableError(absl::StrCat(
              "table '", request.table(), "' is not on this server yet (a placement move "
              "hands it over); retry"));
        }
        PS_RETURN_IF_ERROR(clock.status());
        response->set_clock(*clock);
        return absl::OkStatus();
      });
  Sync<TableStatsRequest, TableStatsResponse>(
      "TableStats",
      [this](const TableStatsRequest&, TableStatsResponse* response) {
        tables_->Stats(response);
        return absl::OkStatus();
      },
      /*needs_serving=*/false);
  Wait<BarrierRequest, BarrierResponse>(
      "Barrier",
      [this](const BarrierRequest& request, BarrierResponse*, absl::Time deadline, WaitDone done) {
        return tables_->BarrierAsync(request, deadline, std::move(done));
      });
  Wait<AllReduceRequest, AllReduceResponse>(
      "AllReduce", [this](const AllReduceRequest& request, AllReduceResponse* response,
                          absl::Time deadline, WaitDone done) {
        return tables_->AllReduceAsync(request, response, deadline, std::move(done));
      });
  Wait<BroadcastRequest, BroadcastResponse>(
      "Broadcast", [this](const BroadcastRequest& request, BroadcastResponse* response,
                          absl::Time deadline, WaitDone done) {
        return tables_->BroadcastAsync(request, response, deadline, std::move(done));
      });
}

const Dispatcher::Method* Dispatcher::FindMethod(absl::string_view name) const {
  absl::ConsumePrefix(&name, kMethodPrefix);
  auto it = methods_.find(name);
  return it == methods_.end() ? nullptr : &it->second;
}

CancelWait Dispatcher::Call(absl::string_view name, const protobuf::Message& request,
                            protobuf::Message* response, const CallContext& call, Done done) {
  const OpMetrics::Clock::time_point start = OpMetrics::Clock::now();
  const Method* method = FindMethod(name);
  absl::Status status;
  if (method == nullptr) {
    status = absl::UnimplementedError(
        absl::StrCat("pserver.v1.ParameterServer has no control method '", name, "'"));
  } else if (request.GetDescriptor() != method->descriptor->input_type() ||
             response->GetDescriptor() != method->descriptor->output_type()) {
    status = absl::InvalidArgumentError(absl::StrCat(
        method->descriptor->name(), " takes ", method->descriptor->input_type()->full_name(),
        " and answers ", method->descriptor->output_type()->full_name(), ", not ",
        request.GetDescriptor()->full_name(), " and ", response->GetDescriptor()->full_name()));
  } else if (method->needs_serving) {
    status = CheckServing();
  }
  if (status.ok() && method->writes) status = CheckWrite();
  if (!status.ok()) {
    if (method != nullptr) method->metrics->Finish(status, start);
    done(std::move(status));
    return [] {};
  }
  OpMetrics* const metrics = method->metrics;
  metrics->received_bytes.Add(request.ByteSizeLong());
  done = [metrics, start, response, done = std::move(done)](absl::Status status) {
    metrics->Finish(status, start, status.ok() ? response->ByteSizeLong() : 0);
    done(std::move(status));
  };
  std::shared_ptr<std::atomic<bool>> returned;  // set once run() returned: traced calls only
  if (trace::Recorder* recorder = trace(); recorder != nullptr) {
    returned = std::make_shared<std::atomic<bool>>(false);
    done = TraceCall(recorder, *method, request, returned, std::move(done));
  }
  if (method->writes && fence_.load(std::memory_order_acquire) != nullptr) {
    // Checked again once applied, before the success is answered (and
    // counted): a server that lost its index meanwhile acknowledges nothing.
    done = [this, done = std::move(done)](absl::Status result) {
      if (result.ok()) result = CheckWrite();
      done(std::move(result));
    };
  }
  WriteShipper* const shipper = shipper_.load(std::memory_order_acquire);
  if (method->replicated && shipper != nullptr) {
    // Every control write is synchronous (Sync): `run` answers before it returns.
    // Applied first, then shipped (a control write is not checked apart).
    absl::Status result = shipper->Write(
        method->descriptor->name(), [&] { return SharedBytes::Own(request.SerializeAsString()); },
        [&](absl::FunctionRef<void()>) {
          absl::Status applied;
          method->run(request, response, call, [&](absl::Status s) { applied = std::move(s); });
          return applied;
        });
    done(std::move(result));  // synchronous: a traced span is not "waited"
    return [] {};
  }
  CancelWait cancel = method->run(request, response, call, std::move(done));
  if (returned != nullptr) returned->store(true, std::memory_order_release);
  return cancel;
}

Dispatcher::Done Dispatcher::TraceCall(trace::Recorder* recorder, const Method& method,
                                       const protobuf::Message& request,
                                       std::shared_ptr<std::atomic<bool>> returned, Done done) {
  // A call that waits (Barrier, a consistent TablePull) ends later, maybe on
  // another thread, while its first thread serves others: its span goes to
  // the "waiting calls" lanes.
  trace::Args args;
  if (const auto* push = dynamic_cast<const v1::TablePushRequest*>(&request)) {
    args.Add("table", push->table()).AddHex("client_id", push->client_id());
    args.Add("sequence", push->sequence());
  }
  return [this, recorder, name = method.descriptor->name(), args = std::move(args),
          start = trace::NowMicros(), tid = trace::Recorder::ThreadTrack(),
          returned = std::move(returned), done = std::move(done)](absl::Status status) mutable {
    args.Add("status", absl::StatusCodeToString(status.code()));
    const int64_t end = trace::NowMicros();
    const bool waited = returned->load(std::memory_order_acquire);
    if (waited) args.Add("waited", 1);
    recorder->Complete(name, "server", start, end,
                       waited ? waiting_lanes_.Place(*recorder, start, end) : tid, args.json());
    done(std::move(status));
  };
}

absl::Status Dispatcher::Ship(
    absl::string_view method, absl::FunctionRef<SharedBytes()> request,
    absl::FunctionRef<absl::Status(absl::FunctionRef<void()> ship)> apply) {
  WriteShipper* const shipper = shipper_.load(std::memory_order_acquire);
  return shipper == nullptr ? apply([] {}) : shipper->Write(method, request, apply);
}

absl::Status Dispatcher::PushReplicated(const RequestId& id,
                                        absl::Span<const GradientView> grads) {
  return ApplyOnce(id.client, id.sequence, [&](bool& past_checks) {
    return store_->ApplyGradients(grads, nullptr, [&] { past_checks = true; });
  });
}

absl::Status Dispatcher::ApplyWrite(absl::string_view name, absl::string_view request_bytes) {
  bool replicated = false;
  for (const char* const* m = kReplicatedMethods; *m != nullptr; ++m) replicated |= name == *m;
  const Method* method = replicated ? FindMethod(name) : nullptr;
  if (method == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", name, "' is not a replicated write (", absl::StrJoin(
            absl::MakeConstSpan(kReplicatedMethods, std::size(kReplicatedMethods) - 1), ", "),
                     ")"));
  }
  std::unique_ptr<protobuf::Message> request(method->request_prototype->New());
  std::unique_ptr<protobuf::Message> response(method->response_prototype->New());
  if (request_bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !request->ParseFromArray(request_bytes.data(), static_cast<int>(request_bytes.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicated ", name, ": malformed ", request->GetDescriptor()->name()));
  }
  // The method's own handler, past the serving check and the fence (the
  // primary checked both): every replicated write is synchronous.
  absl::Status result;
  method->run(*request, response.get(), {},
              [&](absl::Status status) { result = std::move(status); });
  return result;
}

absl::Status Dispatcher::CheckReplicable(const v1::CreateTableRequest& request) {
  // Only writes are shipped, in the primary's order; a table's rows and
  // optimizer state, its clocks and held-back adds change only by writes.
  // Eviction and admission are the exception: a pull touches a row (its LRU
  // place, its TTL stamp) or counts a sighting, and TTL eviction runs on each
  // server's own clock, so a standby's table would drift from the primary's.
  const v1::Eviction& eviction = request.config().eviction();
  if (eviction.ttl_seconds() == 0 && eviction.capacity() == 0 && eviction.admission_count() <= 1) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "table '", request.name(), "': eviction (ttl_seconds ", eviction.ttl_seconds(),
      ", capacity ", eviction.capacity(), ", admission_count ", eviction.admission_count(),
      ") is not replicated: its pulls and the server's clock change rows a standby does not "
      "see; on a server with --accept_standbys create tables without eviction"));
}

absl::Status Dispatcher::CheckServing() const {
  if (!serving_.load(std::memory_order_acquire)) {
    return absl::UnavailableError(
        "pserver is starting: registering and loading its checkpoint; retry");
  }
  const Fence* fence = fence_.load(std::memory_order_acquire);
  return fence == nullptr ? absl::OkStatus() : fence->CheckServing();
}

absl::Status Dispatcher::CheckWrite() const {
  Fence* fence = fence_.load(std::memory_order_acquire);
  return fence == nullptr ? absl::OkStatus() : fence->CheckWrite();
}

absl::Status Dispatcher::ApplyOnce(uint64_t client_id, uint64_t sequence,
                                   absl::FunctionRef<absl::Status(bool& past_checks)> apply) {
  absl::ReaderMutexLock lock(&apply_mu_);
  const bool tracked = client_id != 0 && sequence != 0;
  if (tracked) {
    switch (applied_.Begin(client_id, sequence)) {
      case AppliedSequences::kApplied:
        duplicates_.fetch_add(1, std::memory_order_relaxed);
        return absl::OkStatus();
      case AppliedSequences::kInProgress:
        return absl::UnavailableError(absl::StrCat("push ", sequence, " of client ",
                                                   absl::Hex(client_id),
                                                   " is still being applied; retry"));
      case AppliedSequences::kNew:
        break;
    }
  }
  bool past_checks = false;
  absl::Status status = apply(past_checks);
  if (tracked && !status.ok() && !past_checks) {
    // Nothing applied: the id is not used up, so a retry is checked again
    // and answered as the first copy was, here or on a backup that took the
    // shard over (a refused push is shipped nowhere, so no backup records
    // its id: recording it here alone would make the id sets differ).
    applied_.Abandon(client_id, sequence);
  } else if (tracked) {
    applied_.Finish(client_id, sequence);
  }
  const uint64_t every = hooks_.drop_reply_after_apply_every_n;
  if (status.ok() && every > 0 &&
      (pushes_applied_.fetch_add(1, std::memory_order_relaxed) + 1) % every == 0) {
    replies_dropped_.fetch_add(1, std::memory_order_relaxed);
    return absl::UnavailableError("fault injection: the push was applied, its reply dropped");
  }
  return status;
}

absl::Status Dispatcher::PushTableRows(const TableRowsView& push, uint64_t client_id,
                                       uint64_t sequence) {
  const OpMetrics::Clock::time_point start = OpMetrics::Clock::now();
  trace::Span span(trace(), "TablePush", "server");
  table_push_metrics_->received_bytes.Add(push.keys.size() * sizeof(uint64_t) +
                                          push.values.size());
  absl::Status status = CheckServing();
  if (status.ok()) status = CheckWrite();
  if (status.ok()) {
    status = Ship(
        "TablePush",
        [&] {
          v1::TablePushRequest request;
          request.set_table(push.table.data(), push.table.size());
          request.set_keys(EncodeKeys(push.keys));
          request.set_values(push.values.data(), push.values.size());
          request.set_client_id(client_id);
          request.set_sequence(sequence);
          request.set_worker(push.worker.data(), push.worker.size());
          request.set_clock(push.clock);
          request.set_value_type(push.value_type);
          return SharedBytes::Own(request.SerializeAsString());
        },
        [&](absl::FunctionRef<void()>) {  // shipped after it is applied here
          // Keys are checked only for a new id, as TablePush's are.
          return ApplyOnce(client_id, sequence, [&](bool&) {  // an error is a refusal
            PS_RETURN_IF_ERROR(CheckTableKeys(push.table, push.keys, /*write=*/true));
            return tables_->PushRows(push);
          });
        });
  }
  if (status.ok()) status = CheckWrite();  // applied, but acknowledged only if still ours
  table_push_metrics_->Finish(status, start);
  if (span.active()) {
    span.set_args(trace::Args()
                      .Add("table", push.table)
                      .AddHex("client_id", client_id)
                      .Add("sequence", sequence)
                      .Add("status", absl::StatusCodeToString(status.code()))
                      .json());
  }
  return status;
}

absl::Status Dispatcher::PullTableRows(const TableRowsView& pull, Tables::RowsOut out) {
  const OpMetrics::Clock::time_point start = OpMetrics::Clock::now();
  trace::Span span(trace(), "TablePull", "server");
  table_pull_metrics_->received_bytes.Add(pull.keys.size() * sizeof(uint64_t));
  uint64_t sent = 0;
  absl::Status status = CheckServing();
  if (status.ok()) status = CheckTableKeys(pull.table, pull.keys, /*write=*/false);
  if (status.ok()) {
    status = tables_->PullRows(
        pull, [&](size_t bytes, ElementType type) -> absl::StatusOr<absl::Span<char>> {
          sent = bytes;
          return out(bytes, type);
        });
  }
  // As TablePull: checked again once read (a read changes no row), so that
  // rows read while their keys were handed over are refused, not returned.
  if (status.ok()) status = CheckTableKeys(pull.table, pull.keys, /*write=*/false);
  table_pull_metrics_->Finish(status, start, status.ok() ? sent : 0);
  if (span.active()) {
    span.set_args(trace::Args()
                      .Add("table", pull.table)
                      .Add("keys", pull.keys.size())
                      .Add("status", absl::StatusCodeToString(status.code()))
                      .json());
  }
  return status;
}

absl::Status Dispatcher::Push(const RequestId& id, absl::Span<const GradientView> grads) {
  return PushShipping(id, grads, nullptr, [](size_t) {});
}

absl::Status Dispatcher::Push(const RequestId& id, absl::Span<const GradientView> grads,
                              absl::FunctionRef<void()> ship) {
  return PushShipping(id, grads, &ship, [](size_t) {});
}

absl::Status Dispatcher::PushStreaming(const RequestId& id, absl::Span<const GradientView> grads,
                                       absl::FunctionRef<void()> checked,
                                       absl::FunctionRef<void(size_t)> applied) {
  // Not shipped: `checked` takes the place of the ship (called at the same
  // point), and an error applying past it is DATA_LOSS as there.
  return PushShipping(id, grads, &checked, applied);
}

absl::StatusOr<std::vector<ParameterStore::OpenedBlock>> Dispatcher::OpenReads(
    absl::Span<const v1::ParamRef> refs) {
  PS_RETURN_IF_ERROR(CheckServing());
  if (const PlacementGate* gate = placement_gate_.load(std::memory_order_acquire);
      gate != nullptr) {
    for (const v1::ParamRef& ref : refs)
      PS_RETURN_IF_ERROR(gate->CheckRead(ref.name(), ref.block()));
  }
  std::vector<ParameterStore::OpenedBlock> opened;
  opened.reserve(refs.size());
  for (const v1::ParamRef& ref : refs) {
    absl::StatusOr<ParameterStore::OpenedBlock> block = store_->Open(ref);
    if (!block.ok()) return RedirectDropped(block.status(), ref);
    opened.push_back(*std::move(block));
  }
  return opened;
}

absl::Status Dispatcher::PushShipping(const RequestId& id, absl::Span<const GradientView> grads,
                                      const absl::FunctionRef<void()>* ship,
                                      absl::FunctionRef<void(size_t)> applied_each) {
  const OpMetrics::Clock::time_point start = OpMetrics::Clock::now();
  trace::Span span(trace(), "apply push", "server");
  uint64_t bytes = 0;
  for (const GradientView& grad : grads) bytes += grad.content.size() + grad.indices.size();
  push_metrics_->received_bytes.Add(bytes);
  absl::Status status = CheckServing();
  if (status.ok()) status = CheckWrite();
  if (status.ok()) {
    // Owned blocks are checked only for a new id: a duplicate of a push
    // applied before its blocks moved away is acknowledged, not redirected
    // (the client would apply it again elsewhere); a refused one is
    // abandoned, not used up (ApplyOnce).
    status = ApplyOnce(id.client, id.sequence, [&](bool& past_checks) {
      if (const PlacementGate* gate = placement_gate_.load(std::memory_order_acquire);
          gate != nullptr) {
        for (const GradientView& grad : grads) {
          PS_RETURN_IF_ERROR(gate->CheckBlock(grad.name, grad.block));
        }
      }
      // Shipped once checked, applied here meanwhile (docs/replication.md,
      // "Overlapped apply"): host storage cannot fail past the checks; any
      // failure there leaves this replica apart from its backups.
      absl::Status applied = store_->ApplyGradients(
          grads, nullptr,
          [&] {
            past_checks = true;
            if (ship != nullptr) (*ship)();
          },
          applied_each);
      if (ship != nullptr && past_checks && !applied.ok()) {
        return absl::DataLossError(absl::StrCat(
            "a push shipped to the backups once checked failed to apply here: ",
            applied.message()));
      }
      return applied;
    });
  }
  if (status.ok()) status = CheckWrite();  // applied, but acknowledged only if still ours
  push_metrics_->Finish(status, start);
  if (span.active()) {
    span.set_args(trace::Args()
                      .AddHex("client_id", id.client)
                      .Add("sequence", id.sequence)
                      .Add("grads", grads.size())
                      .Add("status", absl::StatusCodeToString(status.code()))
                      .json());
  }
  return status;
}

absl::Status Dispatcher::Read(absl::Span<const v1::ParamRef> refs, BlockReader reader) {
  const OpMetrics::Clock::time_point start = OpMetrics::Clock::now();
  trace::Span span(trace(), "read", "server");
  uint64_t sent = 0;
  absl::Status status = ReadBlocks(refs, reader, &sent);
  if (span.active()) span.set_args(trace::Args().Add("blocks", refs.size()).Add("bytes", sent).json());
  read_metrics_->Finish(status, start, sent);
  return status;
}

absl::Status Dispatcher::ReadBlocks(absl::Span<const v1::ParamRef> refs, BlockReader reader,
                                    uint64_t* sent) {
  PS_RETURN_IF_ERROR(CheckServing());
  if (const PlacementGate* gate = placement_gate_.load(std::memory_order_acquire);
      gate != nullptr) {
    for (const v1::ParamRef& ref : refs)
      PS_RETURN_IF_ERROR(gate->CheckRead(ref.name(), ref.block()));
  }
  v1::Parameter header;
  for (const v1::ParamRef& ref : refs) {
    header.Clear();
    absl::Status delivered;
    PS_RETURN_IF_ERROR(RedirectDropped(store_->Read(ref, &header,
                                                    [&](absl::string_view bytes) {
                                                      delivered = reader(header, bytes);
                                                      *sent += bytes.size();
                                                    }),
                                       ref));
    PS_RETURN_IF_ERROR(delivered);
  }
  return absl::OkStatus();
}

absl::Status Dispatcher::RedirectDropped(absl::Status status, const v1::ParamRef& ref) const {
  if (!absl::IsNotFound(status)) return status;
  const PlacementGate* gate = placement_gate_.load(std::memory_order_acquire);
  if (gate == nullptr) return status;
  absl::Status owned = gate->CheckRead(ref.name(), ref.block());
  return owned.ok() ? status : owned;
}

bool Dispatcher::TableMayArrive() const {
  const PlacementGate* gate = placement_gate_.load(std::memory_order_acquire);
  return gate != nullptr && gate->moving();
}

absl::Status Dispatcher::CheckTableKeys(absl::string_view table, absl::string_view keys,
                                        bool write) const {
  if (placement_gate_.load(std::memory_order_acquire) == nullptr) return absl::OkStatus();
  absl::StatusOr<KeysView> view = KeysView::Of(keys);
  if (!view.ok()) return absl::OkStatus();  // the table's own call says what is wrong
  return CheckTableKeys(table, view->keys(), write);
}

absl::Status Dispatcher::CheckTableKeys(absl::string_view table, absl::Span<const uint64_t> keys,
                                        bool write) const {
  const PlacementGate* gate = placement_gate_.load(std::memory_order_acquire);
  if (gate == nullptr) return absl::OkStatus();
  absl::StatusOr<v1::TableConfig> config = tables_->ConfigOf(table);
  if (!config.ok()) {
    if (absl::IsNotFound(config.status()) && gate->moving()) {
      return absl::UnavailableError(
          absl::StrCat("table '", table, "' is not on this server yet (a placement move hands it "
                       "over); nothing applied; retry"));
    }
    return absl::OkStatus();  // the table's own call says what is wrong
  }
  return gate->CheckKeys(table, config->partitioning(), keys, write);
}

absl::Status Dispatcher::CheckReplyRoom() {
  return reply_budget_.Available() ? absl::OkStatus() : reply_budget_.Exhausted(0);
}

absl::Status Dispatcher::GetParam(const v1::GetParamRequest& request,
                                  v1::GetParamResponse* response, ReplyHold* reply) {
  absl::Status status = CheckReplyRoom();
  if (status.ok()) {
    status = RedirectDropped(store_->Get(request.param(), response->mutable_parameter()),
                             request.param());
  }
  if (status.ok()) status = HoldReply(response->ByteSizeLong(), reply);
  if (!status.ok()) response->Clear();
  return status;
}

absl::StatusOr<StoreSnapshot> Dispatcher::Snapshot(const Tables::KeyKeep& keep_keys) {
  // No push is between applying and recording its id meanwhile.
  absl::WriterMutexLock lock(&apply_mu_);
  PS_ASSIGN_OR_RETURN(StoreSnapshot snapshot, store_->TakeSnapshot());
  snapshot.extensions[AppliedSequences::kExtensionName] = applied_.Serialize();
  tables_->SaveTo(&snapshot.extensions, keep_keys);
  return snapshot;
}

void Dispatcher::FillStats(v1::ServerStats* out) const {
  store_->FillStats(out);
  out->set_index(index_.load(std::memory_order_relaxed));
  out->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - started_));
  out->set_duplicates_ignored(duplicates_.load(std::memory_order_relaxed));
  out->set_replies_dropped(replies_dropped_.load(std::memory_order_relaxed));
  out->set_checkpoint_sequence(checkpoint_sequence_.load(std::memory_order_relaxed));
  out->set_reply_bytes_in_flight(reply_budget_.held());
  out->set_reads_refused_for_memory(reply_budget_.refused());
  if (hooks_.degraded) out->set_degraded(hooks_.degraded());
  if (hooks_.bulk_aead_connections) out->set_bulk_aead_connections(hooks_.bulk_aead_connections());
  absl::MutexLock lock(&metrics_address_mu_);
  out->set_metrics_address(metrics_address_);
}

void Dispatcher::SetMetricsAddress(std::string address) {
  absl::MutexLock lock(&metrics_address_mu_);
  metrics_address_ = std::move(address);
}

}  // namespace pserver
