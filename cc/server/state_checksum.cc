#include "cc/server/state_checksum.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cc/core/crc32c.h"
#include "cc/core/status_macros.h"
#include "cc/core/tables.h"
#include "cc/server/applied_sequences.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message_lite.h"
#include "pserver/v1/registry.pb.h"
#include "pserver/v1/table.pb.h"

namespace pserver {
namespace {

// A running CRC32C over length-framed fields.
class Digest {
 public:
  void Bytes(absl::string_view bytes) {
    U64(bytes.size());
    crc_ = Crc32c(bytes, crc_);
  }
  void U64(uint64_t value) {
    char le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<char>(value >> (8 * i));
    crc_ = Crc32c(absl::string_view(le, sizeof(le)), crc_);
  }
  // A message in deterministic serialization (map fields sorted).
  void Message(const google::protobuf::MessageLite& message) {
    std::string bytes;
    {
      google::protobuf::io::StringOutputStream out(&bytes);
      google::protobuf::io::CodedOutputStream coded(&out);
      coded.SetSerializationDeterministic(true);
      message.SerializeToCodedStream(&coded);
    }
    Bytes(bytes);
  }
  uint32_t crc() const { return crc_; }

 private:
  uint32_t crc_ = 0;
};

uint64_t LoadU64(const std::string& array, size_t i) {
  uint64_t value = 0;
  std::memcpy(&value, array.data() + i * sizeof(uint64_t), sizeof(value));
  return value;  // compared for order only: byte order need not be the host's
}

absl::Status Unparsed(absl::string_view extension, absl::string_view why) {
  return absl::DataLossError(
      absl::StrCat("state checksum: extension '", extension, "' ", why));
}

template <typename Proto>
absl::Status Parse(absl::string_view extension, const std::string& bytes, Proto* out) {
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int>::max()) ||
      !out->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Unparsed(extension, "does not parse");
  }
  return absl::OkStatus();
}

// The bytes per row of `array` for `rows` rows; an error unless it divides.
absl::StatusOr<size_t> PerRow(absl::string_view extension, const char* field,
                              const std::string& array, uint64_t rows) {
  if (rows == 0) {
    if (!array.empty()) return Unparsed(extension, absl::StrCat("has '", field, "' but no rows"));
    return 0;
  }
  if (array.size() % rows != 0) {
    return Unparsed(extension, absl::StrCat("field '", field, "' of ", array.size(),
                                            " bytes is not a whole number of ", rows, " rows"));
  }
  return array.size() / rows;
}

// The rows' indices ordered by their uint64 key in `keys`.
std::vector<size_t> OrderByKey(const std::string& keys, uint64_t rows) {
  std::vector<size_t> order(rows);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return LoadU64(keys, a) < LoadU64(keys, b); });
  return order;
}

absl::Status AddTable(absl::string_view extension, const std::string& bytes, Digest* digest) {
  v1::SparseTableSnapshot table;
  PS_RETURN_IF_ERROR(Parse(extension, bytes, &table));
  const uint64_t rows = table.rows();
  if (table.keys().size() != rows * sizeof(uint64_t)) {
    return Unparsed(extension, absl::StrCat("has ", table.keys().size(), " key bytes for ",
                                            rows, " rows"));
  }
  PS_ASSIGN_OR_RETURN(size_t value_bytes, PerRow(extension, "values", table.values(), rows));
  PS_ASSIGN_OR_RETURN(size_t state_bytes, PerRow(extension, "state", table.state(), rows));
  PS_ASSIGN_OR_RETURN(size_t step_bytes, PerRow(extension, "steps", table.steps(), rows));
  digest->Bytes(table.name());
  digest->Message(table.config());
  digest->U64(table.state_per_row());
  digest->U64(rows);
  for (size_t row : OrderByKey(table.keys(), rows)) {
    digest->Bytes(absl::string_view(table.keys()).substr(row * sizeof(uint64_t), sizeof(uint64_t)));
    digest->Bytes(absl::string_view(table.values()).substr(row * value_bytes, value_bytes));
    digest->Bytes(absl::string_view(table.state()).substr(row * state_bytes, state_bytes));
    digest->Bytes(absl::string_view(table.steps()).substr(row * step_bytes, step_bytes));
  }
  const uint64_t pending = table.pending_keys().size() / sizeof(uint64_t);
  if (table.pending_keys().size() != pending * sizeof(uint64_t) ||
      table.pending_counts().size() != pending * sizeof(uint32_t)) {
    return Unparsed(extension, "has pending keys and counts that disagree");
  }
  digest->U64(pending);
  for (size_t i : OrderByKey(table.pending_keys(), pending)) {
    digest->Bytes(absl::string_view(table.pending_keys()).substr(i * sizeof(uint64_t), sizeof(uint64_t)));
    digest->Bytes(
        absl::string_view(table.pending_counts()).substr(i * sizeof(uint32_t), sizeof(uint32_t)));
  }
  digest->U64(table.keys_pushed());
  return absl::OkStatus();
}

absl::Status AddClocks(absl::string_view extension, const std::string& bytes, Digest* digest) {
  v1::WorkerClocksSnapshot clocks;
  PS_RETURN_IF_ERROR(Parse(extension, bytes, &clocks));
  std::vector<std::pair<std::string, int64_t>> workers;
  for (const auto& w : clocks.workers()) workers.emplace_back(w.id(), w.clock());
  std::sort(workers.begin(), workers.end());
  digest->U64(workers.size());
  for (const auto& [id, clock] : workers) {
    digest->Bytes(id);
    digest->U64(static_cast<uint64_t>(clock));
  }
  return absl::OkStatus();
}

absl::Status AddApplied(absl::string_view extension, const std::string& bytes, Digest* digest) {
  v1::AppliedSequences applied;
  PS_RETURN_IF_ERROR(Parse(extension, bytes, &applied));
  struct Client {
    uint64_t id;
    uint64_t low_water;
    std::vector<uint64_t> applied;
  };
  std::vector<Client> clients;
  for (const v1::ClientSequences& c : applied.clients()) {
    Client client{c.client_id(), c.low_water(), {c.applied().begin(), c.applied().end()}};
    std::sort(client.applied.begin(), client.applied.end());
    clients.push_back(std::move(client));
  }
  std::sort(clients.begin(), clients.end(),
            [](const Client& a, const Client& b) { return a.id < b.id; });
  digest->U64(clients.size());
  for (const Client& c : clients) {
    digest->U64(c.id);
    digest->U64(c.low_water);
    digest->U64(c.applied.size());
    for (uint64_t s : c.applied) digest->U64(s);
  }
  return absl::OkStatus();
}

absl::Status AddExtension(const std::string& name, const std::string& bytes, Digest* digest) {
  digest->Bytes(name);
  if (absl::StartsWith(name, Tables::kTablePrefix)) return AddTable(name, bytes, digest);
  if (absl::StartsWith(name, Tables::kClocksPrefix)) return AddClocks(name, bytes, digest);
  if (name == AppliedSequences::kExtensionName) return AddApplied(name, bytes, digest);
  // Held-back adds are kept in clock order, then arrival order: the order
  // the writes came in, the same on every replica.
  digest->Bytes(bytes);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<uint32_t> ShardStateChecksum(const StoreSnapshot& snapshot) {
  Digest digest;
  digest.U64(snapshot.initialized ? 1 : 0);
  std::vector<const BlockSnapshot*> blocks;
  blocks.reserve(snapshot.blocks.size());
  for (const BlockSnapshot& b : snapshot.blocks) blocks.push_back(&b);
  std::sort(blocks.begin(), blocks.end(), [](const BlockSnapshot* a, const BlockSnapshot* b) {
    return std::make_pair(a->name, a->block.index()) < std::make_pair(b->name, b->block.index());
  });
  digest.U64(blocks.size());
  for (const BlockSnapshot* b : blocks) {
    digest.Bytes(b->name);
    digest.U64(static_cast<uint64_t>(b->type));
    digest.U64(b->shape.size());
    for (int64_t dim : b->shape) digest.U64(static_cast<uint64_t>(dim));
    digest.Message(b->block);
    digest.Message(b->config);
    digest.Bytes(b->content);
    digest.U64(b->optimizer.steps);
    digest.U64(b->optimizer.slots.size());
    for (const auto& [slot, bytes] : b->optimizer.slots) {
      digest.Bytes(slot);
      digest.Bytes(bytes);
    }
  }
  digest.U64(snapshot.extensions.size());
  for (const auto& [name, bytes] : snapshot.extensions) {  // std::map: by name
    PS_RETURN_IF_ERROR(AddExtension(name, bytes, &digest));
  }
  return digest.crc();
}

}  // namespace pserver
