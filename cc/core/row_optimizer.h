// RowOptimizer: the update a sparse table applies to one row for one (summed)
// gradient. The row's values and its optimizer state are owned by the table;
// the optimizer holds only the validated hyper-parameters.
//
//   PS_ASSIGN_OR_RETURN(RowOptimizer opt,
//                       RowOptimizer::Create(config.optimizer(), "table 'emb'"));
//   std::vector<float> state(opt.state_per_row(dim));
//   opt.InitState(state.data(), dim);
//   opt.Apply(w, state.data(), grad, dim, /*step=*/++row_steps);
//
// Rules, as in proto/pserver/v1/table.proto (defaults in brackets):
//   sgd      w -= lr * g                                      [lr 0.01]
//   adagrad  acc += g^2; w -= lr * g / (sqrt(acc) + eps)       [lr 0.01, eps 1e-10]
//   adam     m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//            w -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps), t = the row's
//            own step count 1, 2, ...                  [lr 1e-3, b1 0.9, b2 0.999, eps 1e-8]
//   ftrl     FTRL-Proximal per coordinate with state z and n; w is computed
//            from z and n after each step                  [alpha 0.05, beta 1]
//   add      w += g (KV tables)
// State layout per row (state_per_row values of the element type): adagrad
// acc[dim]; adam m[dim] then v[dim]; ftrl z[dim] then n[dim]; sgd and add none.
//
// Precision: values and state are stored in the element type T (float or
// double); every update is computed in double and rounded to T once per
// stored value, so float32 rows follow the double formulas to within one
// float rounding per step.
//
// Thread-safe: immutable after Create; Apply on distinct rows may run
// concurrently (the caller serializes updates of one row).
#ifndef PSERVER_CC_CORE_ROW_OPTIMIZER_H_
#define PSERVER_CC_CORE_ROW_OPTIMIZER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "pserver/v1/table.pb.h"

namespace pserver {

class RowOptimizer {
 public:
  enum class Kind { kSgd, kAdagrad, kAdam, kFtrl, kAdd };

  // INVALID_ARGUMENT naming the field, prefixed with `what`, e.g.
  // "table 'emb': adam.beta1 must be in [0, 1), got 1.5". An unset oneof is
  // sgd with its defaults.
  static absl::StatusOr<RowOptimizer> Create(const v1::RowOptimizer& config,
                                             absl::string_view what);

  Kind kind() const { return kind_; }
  // "sgd", "adagrad", "adam", "ftrl" or "add".
  const char* name() const;

  // State values per row for a row of `dim` values: sgd 0, adagrad dim,
  // adam 2*dim, ftrl 2*dim, add 0.
  uint32_t state_per_row(uint32_t dim) const { return state_factor_ * dim; }
  uint32_t state_per_row_factor() const { return state_factor_; }

  // Fills the state of a new row (state_per_row(dim) values): adagrad's
  // initial_accumulator, zeros otherwise. T is float or double.
  template <typename T>
  void InitState(T* state, uint32_t dim) const;

  // Applies the summed gradient `g` (dim values) to the row `w` (dim values)
  // and its `state`. `step` is the row's step count including this update
  // (1 for the first). T is float or double; G (the gradient's type) is
  // double, or T, read as is (no temporary) and computed in double alike.
  template <typename T, typename G = double>
  void Apply(T* w, T* state, const G* g, uint32_t dim, uint64_t step) const;

 private:
  RowOptimizer() = default;

  Kind kind_ = Kind::kSgd;
  uint32_t state_factor_ = 0;
  double lr_ = 0.01;
  double epsilon_ = 0;
  double initial_accumulator_ = 0;
  double beta1_ = 0, beta2_ = 0;
  double alpha_ = 0, beta_ = 0, l1_ = 0, l2_ = 0;
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_ROW_OPTIMIZER_H_
