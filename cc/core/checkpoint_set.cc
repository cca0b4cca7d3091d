#include "cc/core/checkpoint_set.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cc/core/status_macros.h"

namespace pserver {
namespace {

namespace fs = std::filesystem;

// The newest of a server's checkpoints that opens, or the first error.
absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenNewest(
    const std::vector<CheckpointEntry>& entries) {
  absl::Status first;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> r = CheckpointReader::Open(it->path);
    if (r.ok()) return r;
    if (first.ok()) first = r.status();
  }
  return first;
}

// The subdirectories of `path`, sorted.
absl::StatusOr<std::vector<std::string>> Subdirectories(const std::string& path) {
  std::error_code ec;
  std::vector<std::string> subdirs;
  for (const fs::directory_entry& e : fs::directory_iterator(path, ec)) {
    if (e.is_directory(ec)) subdirs.push_back(e.path().string());
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", path, ": ", ec.message()));
  std::sort(subdirs.begin(), subdirs.end());
  return subdirs;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointSet>> CheckpointSet::Open(const std::string& path) {
  std::unique_ptr<CheckpointSet> set(new CheckpointSet());
  PS_RETURN_IF_ERROR(set->OpenReaders(path));
  PS_RETURN_IF_ERROR(set->IndexParams());
  set->IndexTables();
  return set;
}

absl::Status CheckpointSet::OpenReaders(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint at ", path, ": it does not exist"));
  }
  if (fs::exists(fs::path(path) / kManifestFileName, ec)) {
    PS_ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(path));
    readers_.push_back(std::move(reader));
    return absl::OkStatus();
  }
  PS_ASSIGN_OR_RETURN(std::vector<CheckpointEntry> entries, ListCheckpointsInLoadOrder(path));
  if (!entries.empty()) {
    PS_ASSIGN_OR_RETURN(auto reader, OpenNewest(entries));
    readers_.push_back(std::move(reader));
    return absl::OkStatus();
  }
  PS_ASSIGN_OR_RETURN(std::vector<std::string> subdirs, Subdirectories(path));
  for (const std::string& sub : subdirs) {
    PS_ASSIGN_OR_RETURN(std::vector<CheckpointEntry> shard, ListCheckpointsInLoadOrder(sub));
    if (shard.empty()) continue;
    PS_ASSIGN_OR_RETURN(auto reader, OpenNewest(shard));
    readers_.push_back(std::move(reader));
  }
  if (readers_.empty()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint at ", path,
                                            ": no MANIFEST, no ckpt-* directory in it or in "
                                            "its subdirectories"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointSet::IndexParams() {
  for (const auto& reader : readers_) {
    const auto& params = reader->manifest().parameters();
    for (int i = 0; i < params.size(); ++i) {
      const v1::CheckpointParameter& p = params[i];
      const uint32_t count = std::max<uint32_t>(1, p.block().count());
      Shape shape(p.shape().begin(), p.shape().end());
      auto [it, fresh] = params_.try_emplace(p.name());
      Param& cp = it->second;
      if (fresh) {
        cp.info = ParamInfo{p.element_type(), shape};
        cp.count = count;
      } else if (cp.info.type != p.element_type() || cp.info.shape != shape || cp.count != count) {
        return absl::DataLossError(
            absl::StrCat("checkpoints disagree on parameter '", p.name(),
                         "': ", ElementTypeName(cp.info.type), ShapeString(cp.info.shape), " in ",
                         cp.count, " blocks vs ", ElementTypeName(p.element_type()),
                         ShapeString(shape), " in ", count, " blocks (", reader->path(), ")"));
      }
      if (!cp.blocks.emplace(p.block().index(), std::make_pair(reader.get(), i)).second) {
        return absl::DataLossError(
            absl::StrCat("parameter '", p.name(), "' block ", p.block().index(),
                         " is in two opened checkpoints, the second ", reader->path()));
      }
    }
  }
  for (const auto& [name, param] : params_) param_names_.push_back(name);
  return absl::OkStatus();
}

void CheckpointSet::IndexTables() {
  for (const auto& reader : readers_) {
    const auto& extensions = reader->manifest().extensions();
    for (int i = 0; i < extensions.size(); ++i) {
      absl::string_view name = extensions[i].name();
      if (absl::ConsumePrefix(&name, "table/")) {
        tables_[std::string(name)].emplace_back(reader.get(), i);
      }
    }
  }
  for (const auto& [name, parts] : tables_) table_names_.push_back(name);
}

absl::StatusOr<const CheckpointSet::Param*> CheckpointSet::FindParam(
    const std::string& name) const {
  auto it = params_.find(name);
  if (it == params_.end()) {
    return absl::NotFoundError(absl::StrCat("parameter '", name, "' is not in the checkpoint"));
  }
  return &it->second;
}

absl::StatusOr<CheckpointSet::ParamInfo> CheckpointSet::param_info(const std::string& name) const {
  PS_ASSIGN_OR_RETURN(const Param* p, FindParam(name));
  return p->info;
}

absl::Status CheckpointSet::ReadParam(const std::string& name, absl::Span<char> out) const {
  PS_ASSIGN_OR_RETURN(const Param* p, FindParam(name));
  const std::string what = absl::StrCat("parameter '", name, "'");
  const size_t esize = ElementSize(p->info.type);
  // Read and check every block before writing any of it.
  std::vector<std::pair<size_t, std::string>> parts;
  size_t total = 0;
  for (uint32_t b = 0; b < p->count; ++b) {
    auto it = p->blocks.find(b);
    if (it == p->blocks.end()) {
      return absl::DataLossError(
          absl::StrCat(what, " is cut into ", p->count, " blocks and block ", b,
                       " is in none of the opened checkpoints (open the directory holding every "
                       "shard's checkpoints)"));
    }
    const auto& [ckpt, index] = it->second;
    const v1::CheckpointParameter& cp = ckpt->manifest().parameters(index);
    PS_ASSIGN_OR_RETURN(std::string bytes, ckpt->ReadData(cp.content()));
    const size_t offset = static_cast<size_t>(cp.block().offset()) * esize;
    if (offset > out.size() || bytes.size() > out.size() - offset) {
      return absl::DataLossError(
          absl::StrCat(what, " block ", b, " in ", ckpt->path(), " lies outside the parameter"));
    }
    total += bytes.size();
    parts.emplace_back(offset, std::move(bytes));
  }
  if (total != out.size()) {
    return absl::DataLossError(
        absl::StrCat(what, ": its blocks hold ", total, " bytes, the parameter has ", out.size()));
  }
  for (const auto& [offset, bytes] : parts) {
    if (!bytes.empty()) std::memcpy(out.data() + offset, bytes.data(), bytes.size());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<v1::SparseTableSnapshot>> CheckpointSet::ReadTableParts(
    const std::string& name) const {
  auto it = tables_.find(name);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("table '", name, "' is not in the checkpoint"));
  }
  std::vector<v1::SparseTableSnapshot> out;
  for (const auto& [ckpt, index] : it->second) {
    const v1::CheckpointExtension& ext = ckpt->manifest().extensions(index);
    PS_ASSIGN_OR_RETURN(std::string bytes, ckpt->ReadData(ext.data()));
    v1::SparseTableSnapshot snapshot;
    if (!snapshot.ParseFromString(bytes)) {
      return absl::DataLossError(absl::StrCat("extension '", ext.name(), "' in ", ckpt->path(),
                                              " is not a table snapshot"));
    }
    v1::TableConfig& config = *snapshot.mutable_config();
    if (config.element_type() == v1::ELEMENT_TYPE_UNSPECIFIED) {
      config.set_element_type(v1::FLOAT32);
    }
    const size_t esize = ElementSize(config.element_type());
    if (config.dim() == 0 || esize == 0 || snapshot.keys().size() != snapshot.rows() * 8 ||
        snapshot.values().size() != snapshot.rows() * config.dim() * esize) {
      return absl::DataLossError(absl::StrCat("table '", name, "' in ", ckpt->path(),
                                              ": its keys and values do not match ",
                                              snapshot.rows(), " rows"));
    }
    if (!out.empty() && (out[0].config().dim() != config.dim() ||
                         out[0].config().element_type() != config.element_type())) {
      return absl::DataLossError(absl::StrCat("checkpoints disagree on table '", name, "': dim ",
                                              out[0].config().dim(), " vs ", config.dim(), " (",
                                              ckpt->path(), ")"));
    }
    out.push_back(std::move(snapshot));
  }
  return out;
}

absl::StatusOr<CheckpointSet::TableInfo> CheckpointSet::table_info(const std::string& name) const {
  PS_ASSIGN_OR_RETURN(std::vector<v1::SparseTableSnapshot> parts, ReadTableParts(name));
  TableInfo info{parts[0].config().dim(), parts[0].config().element_type(), 0};
  for (const auto& p : parts) info.rows += p.rows();
  return info;
}

absl::Status CheckpointSet::ReadTable(const std::string& name, uint64_t* keys, size_t keys_bytes,
                                      void* values, size_t values_bytes) const {
  PS_ASSIGN_OR_RETURN(std::vector<v1::SparseTableSnapshot> parts, ReadTableParts(name));
  const v1::TableConfig& config = parts[0].config();
  const size_t row = config.dim() * ElementSize(config.element_type());
  uint64_t total = 0;
  for (const auto& p : parts) total += p.rows();
  if (keys_bytes != total * 8 || values_bytes != total * row) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", name, "': ", total, " rows need ", total * 8, " bytes of keys and ", total * row,
        " of values, the buffers have ", keys_bytes, " and ", values_bytes));
  }
  if (total > 0 && (keys == nullptr || values == nullptr)) {
    return absl::InvalidArgumentError("keys or values is NULL");
  }
  // (key, part, row in part), sorted by key.
  std::vector<std::tuple<uint64_t, size_t, size_t>> order;
  order.reserve(total);
  for (size_t p = 0; p < parts.size(); ++p) {
    for (size_t i = 0; i < parts[p].rows(); ++i) {
      uint64_t k;
      std::memcpy(&k, parts[p].keys().data() + i * 8, 8);
      order.emplace_back(k, p, i);
    }
  }
  std::sort(order.begin(), order.end());
  for (size_t j = 0; j < order.size(); ++j) {
    const auto& [k, p, i] = order[j];
    keys[j] = k;
    std::memcpy(static_cast<char*>(values) + j * row, parts[p].values().data() + i * row, row);
  }
  return absl::OkStatus();
}

absl::Status CheckpointSet::Verify() const {
  for (const auto& r : readers_) PS_RETURN_IF_ERROR(r->Verify());
  return absl::OkStatus();
}

}  // namespace pserver
