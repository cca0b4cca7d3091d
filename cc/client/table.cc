#include "cc/client/table.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/core/placement.h"
#include "cc/core/compression.h"
#include "cc/core/status_macros.h"
#include "cc/core/table_keys.h"
#include "cc/rpc/frame.h"
#include "cc/rpc/table_frame.h"

namespace pserver {
// The keys of a call cut into requests, each a run of one server's keys.
// With one server the runs are the caller's own keys: `keys` views them,
// `positions` is empty and `offset` is where the run starts in the caller's
// list. With several, the keys are put in server order once (a counting
// sort: `sorted`, with `order`, the caller's position of each), and a run
// views `sorted` from `offset` on, `positions` the matching `order`.
struct Table::Split {
  struct Part {
    int server = 0;
    absl::Span<const uint64_t> keys;
    size_t offset = 0;
    absl::Span<const size_t> positions;
  };
  Split() = default;
  Split(Split&&) = default;  // the parts' views stay valid: the buffers move
  Split& operator=(Split&&) = default;
  Split(const Split&) = delete;

  std::vector<Part> parts;
  std::vector<uint64_t> sorted;
  std::vector<size_t> order;

  // The rows of part `i` in `rows` (the caller's, in its key order) laid out
  // by part: the caller's own for one server, else gathered into `*buffer`
  // once, in `sorted` order.
  absl::string_view Rows(size_t i, absl::string_view rows, size_t row, std::string* buffer) const {
    const Part& part = parts[i];
    if (part.positions.empty()) return rows.substr(part.offset * row, part.keys.size() * row);
    if (buffer->empty() && !order.empty()) {
      buffer->resize(order.size() * row);
      for (size_t j = 0; j < order.size(); ++j) {
        std::memcpy(buffer->data() + j * row, rows.data() + order[j] * row, row);
      }
    }
    return absl::string_view(*buffer).substr(part.offset * row, part.keys.size() * row);
  }
};

Table::Table(Client* client, std::string name, v1::TableConfig config)
    : client_(client), name_(std::move(name)), config_(std::move(config)) {
  if (config_.element_type() == v1::ELEMENT_TYPE_UNSPECIFIED) {
    config_.set_element_type(v1::FLOAT32);
  }
  compressor_ = TableCompressor::For(config_);
}

absl::StatusOr<Table> Table::Create(Client& client, std::string name, const v1::TableConfig& config,
                                    const CallOptions& call) {
  if (config.has_wire_compression()) {
    const ElementType type =
        config.element_type() == v1::ELEMENT_TYPE_UNSPECIFIED ? v1::FLOAT32 : config.element_type();
    PS_RETURN_IF_ERROR(ValidateWireCompressionFor(
        config.wire_compression(), type, absl::StrCat("table '", name, "'"), "table"));
  }
  v1::CreateTableRequest request;
  request.set_name(name);
  *request.mutable_config() = config;
  PS_RETURN_IF_ERROR(
      client.CallEveryServer<v1::CreateTableResponse>("CreateTable", request, call).status());
  return Table(&client, std::move(name), config);
}

size_t Table::row_bytes() const { return config_.dim() * ElementSize(element_type()); }

absl::StatusOr<int> Table::ServerOf(uint64_t key) const {
  return KeyServer(key, config_.partitioning(), client_->placement());
}

absl::Status Table::CheckType(ElementType type) const {
  if (type == element_type()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("table '", name_, "' holds ",
                                                 ElementTypeName(element_type()), " values, not ",
                                                 ElementTypeName(type)));
}

Ticket Table::PullAsync(absl::Span<const uint64_t> keys, absl::Span<char> out,
                        const CallOptions& call) const {
  return StartAsync(keys, out, absl::string_view(), /*push=*/false, call);
}

Ticket Table::PushAsync(absl::Span<const uint64_t> keys, absl::string_view grads,
                        const CallOptions& call) const {
  return StartAsync(keys, absl::Span<char>(), grads, /*push=*/true, call);
}

absl::StatusOr<Table::Split> Table::SplitKeys(absl::Span<const uint64_t> keys,
                                              const std::vector<size_t>* positions,
                                              const Client::Routing& routing,
                                              const std::vector<bool>& by_target) const {
  const int n = routing.num_servers();
  // Requests of about max_request_bytes of rows each.
  const size_t per_request =
      std::max<size_t>(1, client_->options().max_request_bytes / std::max<size_t>(1, row_bytes()));
  Split split;
  const bool range = config_.partitioning().kind() == v1::Partitioning::RANGE;
  if (n == 1 && positions == nullptr) {  // every key goes to server 0, in the caller's order
    if (range) {
      for (uint64_t key : keys) {
        PS_RETURN_IF_ERROR(KeyServer(key, config_.partitioning(), routing.route).status());
      }
    }
    for (size_t begin = 0; begin < keys.size(); begin += per_request) {
      Split::Part& part = split.parts.emplace_back();
      part.offset = begin;
      part.keys = keys.subspan(begin, per_request);
    }
    return std::move(split);
  }
  // The caller's positions of the keys to send: all, or `*positions`.
  const size_t count = positions == nullptr ? keys.size() : positions->size();
  auto position = [&](size_t k) { return positions == nullptr ? k : (*positions)[k]; };
  // Each key's server, computed once (under the target placement once an
  // old owner refused it), and how many keys each server gets.
  std::vector<uint32_t> server_of(count);
  std::vector<size_t> begin(n + 1, 0);
  for (size_t k = 0; k < count; ++k) {
    const size_t i = position(k);
    const Placement& placement = by_target[i] ? routing.target : routing.route;
    int server;
    if (range) {
      PS_ASSIGN_OR_RETURN(server, KeyServer(keys[i], config_.partitioning(), placement));
    } else {
      server = placement.HashKeyServer(keys[i]);
    }
    server_of[k] = static_cast<uint32_t>(server);
    ++begin[server + 1];
  }
  for (int server = 0; server < n; ++server) begin[server + 1] += begin[server];
  // The keys in server order (stable: each server's in the caller's order).
  split.sorted.resize(count);
  split.order.resize(count);
  std::vector<size_t> next(begin.begin(), begin.end() - 1);
  for (size_t k = 0; k < count; ++k) {
    const size_t j = next[server_of[k]]++;
    const size_t i = position(k);
    split.sorted[j] = keys[i];
    split.order[j] = i;
  }
  for (int server = 0; server < n; ++server) {
    for (size_t at = begin[server]; at < begin[server + 1]; at += per_request) {
      const size_t count = std::min(begin[server + 1] - at, per_request);
      Split::Part& part = split.parts.emplace_back();
      part.server = server;
      part.offset = at;
      part.keys = absl::MakeConstSpan(split.sorted).subspan(at, count);
      part.positions = absl::MakeConstSpan(split.order).subspan(at, count);
    }
  }
  return std::move(split);
}

absl::Status Table::PlaceRows(const Split& split, size_t i, ElementType content_type,
                              absl::string_view values, absl::Span<char> out) const {
  const Split::Part& part = split.parts[i];
  const size_t row = row_bytes();
  std::string widened;
  if (compressor_ != nullptr) {
    PS_ASSIGN_OR_RETURN(values, compressor_->DecodePull(
                                    content_type, values, &widened,
                                    absl::StrCat("table '", name_, "': server ",
                                                 client_->addresses()[part.server])));
  }
  if (values.size() != part.keys.size() * row) {
    return absl::DataLossError(absl::StrCat(
        "table '", name_, "': server ", client_->addresses()[part.server], " returned ",
        values.size(), " bytes for ", part.keys.size(), " rows of ", row, " bytes"));
  }
  if (part.positions.empty()) {
    char* const into = out.data() + part.offset * row;
    // The transport may have put them there already (TableFrame::rows_into).
    if (!values.empty() && values.data() != into) std::memcpy(into, values.data(), values.size());
    return absl::OkStatus();
  }
  // The transport may have put each row in its place already
  // (TableFrame::rows_at): it then hands over a view at out's start.
  if (values.data() == out.data()) return absl::OkStatus();
  for (size_t j = 0; j < part.positions.size(); ++j) {
    std::memcpy(out.data() + part.positions[j] * row, values.data() + j * row, row);
  }
  return absl::OkStatus();
}

absl::Status Table::RunRouted(absl::Span<const uint64_t> keys, absl::Time deadline,
                              const Round& round, const Client::Routing* first_routing,
                              const Split* first) const {
  // One snapshot of the placement per round (it may change: live moves).
  Client::Routing routing = first != nullptr ? *first_routing : client_->routing();
  // Keys an old owner refused go by the target placement from then on.
  std::vector<bool> by_target(keys.size(), false);
  std::vector<size_t> pending;
  for (int n = 1;; ++n) {
    std::optional<Split> made;
    if (n > 1 || first == nullptr) {
      PS_ASSIGN_OR_RETURN(Split next_split,
                          SplitKeys(keys, n == 1 ? nullptr : &pending, routing, by_target));
      made.emplace(std::move(next_split));
    }
    const Split& split = made.has_value() ? *made : *first;
    std::vector<absl::Status> moved(split.parts.size());
    PS_RETURN_IF_ERROR(round(split, &moved));
    std::vector<const absl::Status*> refusals;
    bool rerouted = false;  // some key goes elsewhere than it went
    std::vector<size_t> next;
    for (size_t i = 0; i < split.parts.size(); ++i) {
      if (moved[i].ok()) continue;
      refusals.push_back(&moved[i]);
      const Split::Part& part = split.parts[i];
      for (size_t j = 0; j < part.keys.size(); ++j) {
        const size_t position = part.positions.empty() ? part.offset + j : part.positions[j];
        rerouted = rerouted || !by_target[position];
        by_target[position] = true;
        next.push_back(position);
      }
    }
    if (refusals.empty()) return absl::OkStatus();
    PS_RETURN_IF_ERROR(
        client_->FollowRefusals(refusals, rerouted, n, next.size(), "keys", deadline, &routing));
    std::sort(next.begin(), next.end());
    pending = std::move(next);
  }
}

// The requests of one round, one per part of its split.
class Table::Requests {
 public:
  virtual ~Requests() = default;
  // Starts (or restarts: a retry) part i's request on `t`.
  virtual void Start(size_t i, Transport& t, absl::Time deadline, Transport::Done done) = 0;
  // What part i's request carries, for the client's trace.
  virtual void Describe(size_t i, trace::Args& args) const = 0;
  // Once every part was answered (`moved`: those refused with
  // PlacementMoved, whose keys go again).
  virtual absl::Status Finish(const std::vector<absl::Status>& moved) = 0;
};

// A pull's requests. A read without a worker goes as a table frame where
// the transport carries one (the rows land in `out` as they arrive); else,
// and for a consistent read, which may wait, as the TablePull control call,
// whose request is built on first use.
class Table::PullRequests final : public Table::Requests {
 public:
  PullRequests(const Table& table, const Split& split, absl::Span<char> out, std::string worker,
               int64_t clock, TraceRecorder* trace)
      : table_(table),
        split_(split),
        out_(out),
        worker_(std::move(worker)),
        clock_(clock),
        trace_(trace),
        wire_type_(table.compressor_ != nullptr ? table.compressor_->wire_type()
                                                : v1::ELEMENT_TYPE_UNSPECIFIED),
        requests_(split.parts.size()),
        responses_(split.parts.size()),
        framed_(split.parts.size(), 0) {}

  void Start(size_t i, Transport& t, absl::Time deadline, Transport::Done done) override {
    const Split::Part& part = split_.parts[i];
    const size_t row = table_.row_bytes();
    if (worker_.empty()) {
      TableFrame frame;
      frame.table = table_.name_;
      frame.keys = part.keys;
      frame.value_type = static_cast<uint8_t>(wire_type_);
      // Rows as stored may land in `out` as they arrive, in order (a part
      // in the caller's order) or each at its key's place (PlaceRows then
      // copies nothing).
      if (table_.compressor_ == nullptr && part.positions.empty()) {
        frame.rows_into = out_.subspan(part.offset * row, part.keys.size() * row);
      } else if (table_.compressor_ == nullptr) {
        frame.rows_into = out_;
        frame.rows_at = part.positions;
        frame.row_bytes = row;
      }
      Transport::RowsSink rows = [this, i](uint32_t content_type, absl::string_view values) {
        return table_.PlaceRows(split_, i, static_cast<ElementType>(content_type), values, out_);
      };
      framed_[i] = t.TableRows(FrameMethod::kTableRowsPull, frame, std::move(rows), deadline, done,
                               trace_);
      if (framed_[i]) return;
    }
    if (!requests_[i].has_value()) {
      v1::TablePullRequest& request = requests_[i].emplace();
      request.set_table(table_.name_);
      request.set_keys(EncodeKeys(part.keys));
      request.set_worker(worker_);
      request.set_clock(clock_);
      request.set_wire_type(wire_type_);
    }
    t.Call("TablePull", *requests_[i], &responses_[i], deadline, std::move(done));
  }

  void Describe(size_t i, trace::Args& args) const override {
    args.Add("table", table_.name_).Add("keys", split_.parts[i].keys.size());
  }

  absl::Status Finish(const std::vector<absl::Status>& moved) override {
    for (size_t i = 0; i < split_.parts.size(); ++i) {
      if (!moved[i].ok()) continue;  // refused: its keys go again
      if (framed_[i]) continue;      // its rows are in `out` and its times in the trace
      if (trace_ != nullptr) trace_->Server(responses_[i].trace());
      PS_RETURN_IF_ERROR(table_.PlaceRows(split_, i, responses_[i].content_type(),
                                          responses_[i].values(), out_));
    }
    return absl::OkStatus();
  }

 private:
  const Table& table_;
  const Split& split_;
  const absl::Span<char> out_;
  const std::string worker_;
  const int64_t clock_;
  TraceRecorder* const trace_;
  const ElementType wire_type_;
  std::vector<std::optional<v1::TablePullRequest>> requests_;
  std::vector<v1::TablePullResponse> responses_;
  std::vector<char> framed_;
};

// A push's requests (`grads` as they go on the wire: encoded already when
// the table compresses). One id per request, the same on every retry:
// applied once. Keys re-sent after a redirect are a new round with new ids.
// A table frame where the transport carries one: keys and rows go out from
// where they are; else the TablePush control call, whose request is built
// on first use.
class Table::PushRequests final : public Table::Requests {
 public:
  PushRequests(const Table& table, const Split& split, absl::string_view grads, size_t row,
               std::string worker, int64_t clock, TraceRecorder* trace)
      : table_(table),
        split_(split),
        worker_(std::move(worker)),
        clock_(clock),
        trace_(trace),
        value_type_(table.compressor_ != nullptr ? table.compressor_->wire_type()
                                                 : v1::ELEMENT_TYPE_UNSPECIFIED),
        sequences_(split.parts.size()),
        values_(split.parts.size()),
        requests_(split.parts.size()),
        responses_(split.parts.size()),
        framed_(split.parts.size(), 0) {
    for (size_t i = 0; i < split.parts.size(); ++i) {
      sequences_[i] = table.client_->NextSequence(split.parts[i].server);
      values_[i] = split.Rows(i, grads, row, &gathered_);
    }
  }

  void Start(size_t i, Transport& t, absl::Time deadline, Transport::Done done) override {
    TableFrame frame;
    frame.table = table_.name_;
    frame.keys = split_.parts[i].keys;
    frame.values = values_[i];
    frame.value_type = static_cast<uint8_t>(value_type_);
    frame.client_id = table_.client_->client_id();
    frame.sequence = sequences_[i];
    frame.worker = worker_;
    frame.clock = clock_;
    framed_[i] = t.TableRows(FrameMethod::kTableRowsPush, frame, nullptr, deadline, done, trace_);
    if (framed_[i]) return;
    if (!requests_[i].has_value()) {
      v1::TablePushRequest& request = requests_[i].emplace();
      request.set_table(table_.name_);
      request.set_keys(EncodeKeys(frame.keys));
      request.set_values(frame.values.data(), frame.values.size());
      request.set_worker(worker_);
      request.set_clock(clock_);
      request.set_value_type(value_type_);
      request.set_client_id(frame.client_id);
      request.set_sequence(frame.sequence);
    }
    t.Call("TablePush", *requests_[i], &responses_[i], deadline, std::move(done));
  }

  void Describe(size_t i, trace::Args& args) const override {
    args.Add("table", table_.name_).Add("keys", split_.parts[i].keys.size());
    args.AddHex("client_id", table_.client_->client_id()).Add("sequence", sequences_[i]);
  }

  absl::Status Finish(const std::vector<absl::Status>& moved) override {
    for (size_t i = 0; i < split_.parts.size(); ++i) {
      if (moved[i].ok() && !framed_[i] && trace_ != nullptr) trace_->Server(responses_[i].trace());
    }
    return absl::OkStatus();
  }

 private:
  const Table& table_;
  const Split& split_;
  const std::string worker_;
  const int64_t clock_;
  TraceRecorder* const trace_;
  const ElementType value_type_;
  std::vector<uint64_t> sequences_;
  std::string gathered_;  // the round's rows in server order (several servers only)
  std::vector<absl::string_view> values_;
  std::vector<std::optional<v1::TablePushRequest>> requests_;
  std::vector<v1::TablePushResponse> responses_;
  std::vector<char> framed_;
};

absl::Status Table::RunRound(Requests& requests, const Split& split, absl::Time deadline,
                             TraceRecorder* trace, std::vector<absl::Status>* moved,
                             const Client::FirstAttempt* first) const {
  PS_RETURN_IF_ERROR(client_->RunWithRetries(
      split.parts.size(), [&split](size_t i) { return split.parts[i].server; },
      [&requests](size_t i, Transport& t, absl::Time deadline, Transport::Done done) {
        requests.Start(i, t, deadline, std::move(done));
      },
      deadline, trace, [&requests](size_t i, trace::Args& args) { requests.Describe(i, args); },
      moved, first));
  return requests.Finish(*moved);
}

absl::Status Table::CheckPullBytes(absl::Span<const uint64_t> keys, absl::Span<char> out) const {
  const size_t row = row_bytes();
  if (out.size() == keys.size() * row) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("pull from table '", name_, "': ", keys.size(),
                                                 " keys need ", keys.size() * row,
                                                 " bytes of output, got ", out.size()));
}

absl::Status Table::CheckPushBytes(absl::Span<const uint64_t> keys,
                                   absl::string_view grads) const {
  const size_t row = row_bytes();
  if (grads.size() == keys.size() * row) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("push to table '", name_, "': ", keys.size(),
                                                 " keys need ", keys.size() * row,
                                                 " bytes of values, got ", grads.size()));
}

absl::Status Table::Pull(absl::Span<const uint64_t> keys, absl::Span<char> out,
                         const CallOptions& call) const {
  return DoPull(keys, out, /*worker=*/"", /*clock=*/0, call);
}

absl::Status Table::DoPull(absl::Span<const uint64_t> keys, absl::Span<char> out,
                           const std::string& worker, int64_t clock,
                           const CallOptions& call) const {
  const ClientTrace::Call span(client_->trace(), "TablePull");
  const Cancellation::Scope cancel_scope(call.cancel);
  PS_RETURN_IF_ERROR(CheckPullBytes(keys, out));
  const absl::Time deadline = client_->Deadline(call);
  return RunRouted(keys, deadline, [&](const Split& split, std::vector<absl::Status>* moved) {
    PullRequests requests(*this, split, out, worker, clock, call.trace);
    return RunRound(requests, split, deadline, call.trace, moved);
  });
}

absl::Status Table::Push(absl::Span<const uint64_t> keys, absl::string_view grads,
                         const CallOptions& call) const {
  return DoPush(keys, grads, /*worker=*/"", /*clock=*/0, call);
}

absl::Status Table::DoPush(absl::Span<const uint64_t> keys, absl::string_view grads,
                           const std::string& worker, int64_t clock,
                           const CallOptions& call) const {
  const ClientTrace::Call span(client_->trace(), "TablePush");
  const Cancellation::Scope cancel_scope(call.cancel);
  PS_RETURN_IF_ERROR(CheckPushBytes(keys, grads));
  size_t row = row_bytes();
  // Compressed once per call: retries resend the same bytes.
  TableCompressor::Encoded encoded;
  if (compressor_ != nullptr) {
    encoded = compressor_->EncodePush(keys, grads);
    keys = encoded.keys;
    grads = encoded.values;
    row = compressor_->wire_row_bytes();
  }
  const absl::Time deadline = client_->Deadline(call);
  return RunRouted(keys, deadline, [&](const Split& split, std::vector<absl::Status>* moved) {
    PushRequests requests(*this, split, grads, row, worker, clock, call.trace);
    return RunRound(requests, split, deadline, call.trace, moved);
  });
}

// An async pull or push made without a thread: its first round's first
// attempt goes out from the caller's thread; the transports finish it.
// Anything else (a failed request to retry, keys refused by an old owner)
// goes on on the client's executor, from where the first attempt left it.
struct Table::AsyncCall {
  AsyncCall(const Table& t, absl::Span<const uint64_t> k, absl::Span<char> o,
            absl::string_view g, bool p)
      : table(t), keys(k), out(o), grads(g), push(p) {}

  // Ends the call: gives back its async slot, then finishes the ticket.
  void End(absl::Status status) {
    ticket.recorder().Replied();
    table.client_->ReleaseAsync();
    ticket.Finish(std::move(status));
  }

  // The rest of the call after its first attempt (on the executor).
  absl::Status Rest(const Client::FirstAttempt& first) {
    bool first_round = true;
    return table.RunRouted(
        keys, deadline,
        [&](const Split& s, std::vector<absl::Status>* moved) -> absl::Status {
          if (first_round) {
            first_round = false;
            return table.RunRound(*requests, s, deadline, ticket_trace(), moved, &first);
          }
          std::unique_ptr<Requests> again = NewRequests(s);
          return table.RunRound(*again, s, deadline, ticket_trace(), moved);
        },
        &*routing, &split);
  }

  std::unique_ptr<Requests> NewRequests(const Split& s) const {
    if (push) {
      return std::make_unique<PushRequests>(table, s, grads, table.row_bytes(), "", 0,
                                            ticket_trace());
    }
    return std::make_unique<PullRequests>(table, s, out, "", 0, ticket_trace());
  }
  TraceRecorder* ticket_trace() const { return &ticket.recorder(); }

  const Table table;
  const absl::Span<const uint64_t> keys;
  const absl::Span<char> out;
  const absl::string_view grads;
  const bool push;
  Ticket ticket;
  absl::Time deadline;
  std::optional<Client::Routing> routing;  // the first round's
  Split split;
  std::unique_ptr<Requests> requests;  // the first round's
};

Ticket Table::StartAsync(absl::Span<const uint64_t> keys, absl::Span<char> out,
                         absl::string_view grads, bool push, const CallOptions& call) const {
  // The executor runs the call as a blocking one where it needs a thread or
  // more than the transports give: the client's trace, a cancellation,
  // compression on the wire, an in-process table with a custom handler,
  // which may block (Rest: otherwise). Other in-process calls (the embedded
  // cluster) need none: they wait for nothing (no worker, so no clock to
  // wait for), run on this thread and are done when StartFirstAttempt
  // returns.
  auto on_executor = [&] {
    if (push) {
      return client_->RunAsync(
          [table = *this, keys, grads](const CallOptions& c) { return table.Push(keys, grads, c); },
          call);
    }
    return client_->RunAsync(
        [table = *this, keys, out](const CallOptions& c) { return table.Pull(keys, out, c); },
        call);
  };
  if (client_->trace() != nullptr || call.cancel != nullptr || Cancellation::Current() != nullptr ||
      compressor_ != nullptr) {
    return on_executor();
  }
  auto c = std::make_shared<AsyncCall>(*this, keys, out, grads, push);
  Ticket ticket = c->ticket;
  c->deadline = client_->Deadline(call);  // counted from now
  if (absl::Status slot = client_->AcquireAsync(c->deadline); !slot.ok()) {
    ticket.Finish(std::move(slot));
    return ticket;
  }
  absl::Status checked = push ? CheckPushBytes(keys, grads) : CheckPullBytes(keys, out);
  if (checked.ok()) {
    c->routing.emplace(client_->routing());
    absl::StatusOr<Split> split =
        SplitKeys(keys, nullptr, *c->routing, std::vector<bool>(keys.size(), false));
    if (split.ok()) {
      c->split = *std::move(split);
    } else {
      checked = split.status();
    }
  }
  if (checked.ok() && !c->split.parts.empty() && absl::Now() >= c->deadline) {
    checked = absl::DeadlineExceededError("the call's deadline passed before it was sent");
  }
  if (!checked.ok() || c->split.parts.empty()) {
    c->End(std::move(checked));
    return ticket;
  }
  const bool started = client_->StartFirstAttempt(
      c->split.parts.size(), [c](size_t i) { return c->split.parts[i].server; },
      [c](size_t i, Transport& t, absl::Time deadline, Transport::Done done) {
        // Made once it is sure to be sent (a push takes its ids here): the
        // parts start one after the other on this thread, part 0 first.
        if (c->requests == nullptr) c->requests = c->NewRequests(c->split);
        c->requests->Start(i, t, deadline, std::move(done));
      },
      c->deadline, c->ticket_trace(), [c](Client::FirstAttempt first) {
        bool all_ok = true;
        for (const absl::Status& status : first.results) all_ok = all_ok && status.ok();
        if (all_ok) {
          c->End(c->requests->Finish(std::vector<absl::Status>(first.results.size())));
          return;
        }
        c->table.client_->Schedule(
            [c, first = std::move(first)] { c->End(c->Rest(first)); });
      },
      [this](const Transport& t) { return t.TableCallMayBlockCaller(name_); });
  if (started) return ticket;
  // Nothing was sent (a custom handler in process): a blocking call on the
  // executor instead, with its own slot.
  client_->ReleaseAsync();
  return on_executor();
}

absl::StatusOr<std::vector<v1::TableStats>> Table::Stats(const CallOptions& call) const {
  PS_ASSIGN_OR_RETURN(std::vector<v1::TableStatsResponse> responses,
                      client_->CallEveryServer<v1::TableStatsResponse>(
                          "TableStats", v1::TableStatsRequest(), call));
  std::vector<v1::TableStats> stats;
  for (size_t i = 0; i < responses.size(); ++i) {
    auto it = std::find_if(responses[i].tables().begin(), responses[i].tables().end(),
                           [&](const v1::TableStats& s) { return s.name() == name_; });
    if (it == responses[i].tables().end()) {
      return absl::NotFoundError(
          absl::StrCat("server ", client_->addresses()[i], " has no table '", name_, "'"));
    }
    stats.push_back(*it);
  }
  return stats;
}

// --- KvWorker ---

KvWorker::KvWorker(Table table, std::string worker, int64_t clock)
    : table_(std::move(table)), worker_(std::move(worker)), clock_(clock) {}

absl::StatusOr<std::unique_ptr<KvWorker>> KvWorker::Join(const Table& table, std::string worker,
                                                         const CallOptions& call) {
  if (worker.empty()) return absl::InvalidArgumentError("a worker needs a non-empty id");
  std::unique_ptr<KvWorker> joined(new KvWorker(table, std::move(worker), 0));
  PS_ASSIGN_OR_RETURN(joined->clock_, joined->ClockOp(v1::ClockRequest::JOIN, call));
  return joined;
}

KvWorker::~KvWorker() {
  if (!left_) Leave().IgnoreError();  // best effort: the servers may be gone
}

absl::Status KvWorker::CheckJoined() const {
  if (!left_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("worker '", worker_, "' has left table '", table_.name(), "'"));
}

absl::StatusOr<int64_t> KvWorker::ClockOp(v1::ClockRequest::Op op, const CallOptions& call) const {
  Client& client = *table_.client_;
  v1::ClockRequest request;
  request.set_table(table_.name());
  request.set_worker(worker_);
  request.set_op(op);
  if (op == v1::ClockRequest::TICK) request.set_to(clock_ + 1);
  PS_ASSIGN_OR_RETURN(std::vector<v1::ClockResponse> responses,
                      client.CallEveryServer<v1::ClockResponse>("Clock", request, call));
  // Every server keeps the same clock for a worker; a server that restarted
  // from an older checkpoint may be behind, so the worker goes by the most
  // advanced one.
  int64_t clock = responses.empty() ? 0 : responses[0].clock();
  for (const v1::ClockResponse& r : responses) clock = std::max(clock, r.clock());
  return clock;
}

absl::Status KvWorker::Get(absl::Span<const uint64_t> keys, absl::Span<char> out,
                           const CallOptions& call) {
  PS_RETURN_IF_ERROR(CheckJoined());
  return table_.DoPull(keys, out, worker_, clock_, call);
}

absl::Status KvWorker::Add(absl::Span<const uint64_t> keys, absl::string_view vals,
                           const CallOptions& call) {
  PS_RETURN_IF_ERROR(CheckJoined());
  return table_.DoPush(keys, vals, worker_, clock_, call);
}

std::vector<uint64_t> KvWorker::ChunkKeys(absl::Span<const uint64_t> chunk_ids) const {
  const uint64_t size = std::max<uint32_t>(1, table_.config().chunk_size());
  std::vector<uint64_t> keys;
  keys.reserve(chunk_ids.size() * size);
  for (uint64_t chunk : chunk_ids) {
    for (uint64_t k = 0; k < size; ++k) keys.push_back(chunk * size + k);
  }
  return keys;
}

absl::Status KvWorker::GetChunk(absl::Span<const uint64_t> chunk_ids, absl::Span<char> out,
                                const CallOptions& call) {
  return Get(ChunkKeys(chunk_ids), out, call);
}

absl::Status KvWorker::AddChunk(absl::Span<const uint64_t> chunk_ids, absl::string_view vals,
                                const CallOptions& call) {
  return Add(ChunkKeys(chunk_ids), vals, call);
}

Ticket KvWorker::GetAsync(absl::Span<const uint64_t> keys, absl::Span<char> out,
                          const CallOptions& call) {
  if (absl::Status joined = CheckJoined(); !joined.ok()) return Ticket::Failed(joined);
  return table_.client_->RunAsync(
      [table = table_, keys, out, worker = worker_, clock = clock_](const CallOptions& c) {
        return table.DoPull(keys, out, worker, clock, c);
      },
      call);
}

Ticket KvWorker::AddAsync(absl::Span<const uint64_t> keys, absl::string_view vals,
                          const CallOptions& call) {
  if (absl::Status joined = CheckJoined(); !joined.ok()) return Ticket::Failed(joined);
  Ticket ticket = table_.client_->RunAsync(
      [table = table_, keys, vals, worker = worker_, clock = clock_](const CallOptions& c) {
        return table.DoPush(keys, vals, worker, clock, c);
      },
      call);
  adds_in_flight_.push_back(ticket);
  return ticket;
}

absl::Status KvWorker::Clock(const CallOptions& call) {
  PS_RETURN_IF_ERROR(CheckJoined());
  // The clock promises the adds made before it: wait for the async ones.
  std::vector<Ticket> adds;
  adds.swap(adds_in_flight_);
  for (const Ticket& add : adds) {
    PS_RETURN_IF_ERROR(
        add.Wait(std::max(absl::ZeroDuration(), table_.client_->Deadline(call) - absl::Now())));
  }
  PS_ASSIGN_OR_RETURN(clock_, ClockOp(v1::ClockRequest::TICK, call));
  return absl::OkStatus();
}

absl::Status KvWorker::Leave(const CallOptions& call) {
  PS_RETURN_IF_ERROR(CheckJoined());
  left_ = true;
  absl::Status status = ClockOp(v1::ClockRequest::LEAVE, call).status();
  // A retried leave finds the worker gone: it left.
  return absl::IsNotFound(status) ? absl::OkStatus() : status;
}

}  // namespace pserver
