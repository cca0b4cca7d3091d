// CheckpointSet: the checkpoints of every shard of a cluster read as one
// model, for tools that inspect or export a saved model offline.
//
//   PS_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointSet> set, CheckpointSet::Open(dir));
//   for (const std::string& name : set->param_names()) {
//     PS_ASSIGN_OR_RETURN(CheckpointSet::ParamInfo info, set->param_info(name));
//     PS_ASSIGN_OR_RETURN(int64_t n, NumElements(info.shape));
//     std::string bytes(n * ElementSize(info.type), '\0');
//     PS_RETURN_IF_ERROR(set->ReadParam(name, absl::MakeSpan(bytes)));
//   }
//
// `path` is one checkpoint (a directory with a MANIFEST), a server's
// checkpoint directory (its newest checkpoint that opens is read), or a
// directory of such directories, one per shard (each shard's newest). A
// parameter cut into blocks over several shards is put back together; a
// sparse table's rows are gathered from every shard, sorted by key.
//
// Thread-compatible: const methods may run concurrently once Open returned.
#ifndef PSERVER_CC_CORE_CHECKPOINT_SET_H_
#define PSERVER_CC_CORE_CHECKPOINT_SET_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cc/core/checkpoint.h"
#include "cc/core/element_type.h"
#include "cc/core/tensor.h"
#include "pserver/v1/table.pb.h"

namespace pserver {

class CheckpointSet {
 public:
  struct ParamInfo {
    ElementType type = v1::ELEMENT_TYPE_UNSPECIFIED;
    Shape shape;
  };
  struct TableInfo {
    uint32_t dim = 0;
    ElementType type = v1::ELEMENT_TYPE_UNSPECIFIED;
    uint64_t rows = 0;  // over every shard
  };

  // NOT_FOUND when `path` does not exist or holds no checkpoint; DATA_LOSS
  // when the checkpoints disagree on a parameter or hold a block twice;
  // errors of CheckpointReader::Open for a checkpoint that does not open.
  static absl::StatusOr<std::unique_ptr<CheckpointSet>> Open(const std::string& path);

  // The checkpoints opened, one per shard (in directory-name order).
  size_t num_checkpoints() const { return readers_.size(); }
  const std::string& checkpoint_path(size_t i) const { return readers_[i]->path(); }

  // Parameter names, sorted.
  const std::vector<std::string>& param_names() const { return param_names_; }
  // NOT_FOUND "parameter '<name>' is not in the checkpoint".
  absl::StatusOr<ParamInfo> param_info(const std::string& name) const;
  // Reads the whole parameter into `out`, which must hold exactly its bytes;
  // DATA_LOSS naming a block no checkpoint holds or one that does not fit.
  // Every block is read and checked before any of `out` is written.
  absl::Status ReadParam(const std::string& name, absl::Span<char> out) const;

  // Sparse table names, sorted.
  const std::vector<std::string>& table_names() const { return table_names_; }
  // NOT_FOUND "table '<name>' is not in the checkpoint".
  absl::StatusOr<TableInfo> table_info(const std::string& name) const;
  // Every row of the table, sorted by key: rows * 8 bytes of keys and
  // rows * dim values; INVALID_ARGUMENT naming both sizes when a buffer is
  // not exactly that.
  absl::Status ReadTable(const std::string& name, uint64_t* keys, size_t keys_bytes, void* values,
                         size_t values_bytes) const;

  // Verifies every opened checkpoint's data (CheckpointReader::Verify).
  absl::Status Verify() const;

 private:
  // Where the blocks of one parameter are.
  struct Param {
    ParamInfo info;
    uint32_t count = 1;
    // block index -> (checkpoint, index into its manifest's parameters)
    std::map<uint32_t, std::pair<const CheckpointReader*, int>> blocks;
  };
  // (checkpoint, index into its manifest's extensions) of a table's part.
  using TablePart = std::pair<const CheckpointReader*, int>;

  CheckpointSet() = default;
  absl::Status OpenReaders(const std::string& path);
  absl::Status IndexParams();
  void IndexTables();
  absl::StatusOr<const Param*> FindParam(const std::string& name) const;
  // The table's snapshots, one per checkpoint holding part of it, checked
  // for consistent configs and sizes.
  absl::StatusOr<std::vector<v1::SparseTableSnapshot>> ReadTableParts(
      const std::string& name) const;

  std::vector<std::unique_ptr<CheckpointReader>> readers_;
  std::map<std::string, Param> params_;
  std::vector<std::string> param_names_;
  std::map<std::string, std::vector<TablePart>> tables_;
  std::vector<std::string> table_names_;
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_CHECKPOINT_SET_H_
