// Linear algebra: Cholesky and triangular solves through StableHLO's own ops;
// QR and the symmetric eigendecomposition through the custom calls XLA's
// compiler expands ("Qr", "ProductOfElementaryHouseholderReflectors",
// "Eigh"); LU with partial pivoting written out column by column in the IR
// (static shapes: one block of nodes per column); solve, inverse,
// determinants and LU solves on top of it; the SVD from the eigenvectors of
// the symmetric matrix [[0, A], [A^T, 0]]. Backwards are PyTorch's own
// formulas over these kernels. Only float32 and float64 lower.
#include <ATen/native/LinearAlgebraUtils.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "aten/lowering.h"

namespace tpj::aten {
namespace {

using ir::CompareDir;
using ir::Op;
using ir::Value;

// Refuses half types (complex inputs never get here: RealOrCpu, below, sends them to the CPU).
void CheckRealFloat(const at::Tensor& a, const char* op) {
  TORCH_CHECK(a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble, op,
              ": the pjrt device computes linear algebra in float32 and float64, got ", a.scalar_type(),
              "; convert the input (A.float()) or run this op on the CPU (A.cpu())");
}

// The empty tensor PyTorch returns for a result it was asked not to compute.
at::Tensor NotComputed(at::ScalarType t, int d) { return Empty(std::vector<int64_t>{0}, t, d); }

// Shape helpers over the last two dimensions.
std::vector<int64_t> BatchOf(const std::vector<int64_t>& dims) { return {dims.begin(), dims.end() - 2}; }

std::vector<int64_t> With(std::vector<int64_t> batch, std::initializer_list<int64_t> tail) {
  batch.insert(batch.end(), tail.begin(), tail.end());
  return batch;
}

// Swaps the last two dimensions.
Value MT(ir::Builder& b, Value x) {
  const int64_t r = b.shape(x).rank();
  std::vector<int64_t> perm(r);
  for (int64_t i = 0; i < r; ++i) perm[i] = i;
  std::swap(perm[r - 1], perm[r - 2]);
  return b.Transpose(x, perm);
}

// tril(x, k) (lower: keeps column <= row + k) or triu(x, k) (column >= row + k).
Value Triangle(ir::Builder& b, Value x, bool lower, int64_t k = 0) {
  const ir::Shape s = b.shape(x);
  const int64_t r = s.rank();
  Value row = b.Iota({ir::DType::I64, s.dims}, r - 2);
  Value col = b.Iota({ir::DType::I64, s.dims}, r - 1);
  Value shifted = b.Binary(Op::Add, row, b.Full(ir::DType::I64, s.dims, static_cast<double>(k)));
  Value keep = lower ? b.Compare(CompareDir::LE, col, shifted) : b.Compare(CompareDir::GE, col, shifted);
  return b.Select(keep, x, b.Full(s.dtype, s.dims, 0));
}

// The diagonal of the last two dimensions (square or not): [..., min(m, n)].
Value Diagonal(ir::Builder& b, Value x) {
  const ir::Shape s = b.shape(x);
  const int64_t r = s.rank();
  const int64_t m = s.dims[r - 2], n = s.dims[r - 1], k = std::min(m, n);
  std::vector<int64_t> dims = s.dims;
  Value row = b.Iota({ir::DType::I64, dims}, r - 2);
  Value col = b.Iota({ir::DType::I64, dims}, r - 1);
  Value on = b.Compare(CompareDir::EQ, row, col);
  // Sum over rows of the masked matrix: exact, one nonzero term per column
  // (a select, not a multiply, so inf and NaN elsewhere stay out).
  Value masked = b.Select(on, x, b.Full(s.dtype, dims, 0));
  Value sum = b.Reduce(masked, b.ScalarConstant(s.dtype, 0), {r - 2}, ir::ReduceKind::Sum);
  std::vector<int64_t> starts(r - 1, 0), limits = BatchOf(dims), strides(r - 1, 1);
  limits.push_back(k);
  return b.Slice(sum, starts, limits, strides);
}

Value Identity(ir::Builder& b, ir::DType t, const std::vector<int64_t>& dims) {
  const int64_t r = static_cast<int64_t>(dims.size());
  Value eq = b.Compare(CompareDir::EQ, b.Iota({ir::DType::I64, dims}, r - 2), b.Iota({ir::DType::I64, dims}, r - 1));
  return b.Select(eq, b.Full(t, dims, 1), b.Full(t, dims, 0));
}

Value Matmul(ir::Builder& b, Value x, Value y) {
  const int64_t r = b.shape(x).rank();
  ir::DotDims d;
  for (int64_t i = 0; i < r - 2; ++i) {
    d.lhs_batch.push_back(i);
    d.rhs_batch.push_back(i);
  }
  d.lhs_contract = {r - 1};
  d.rhs_contract = {r - 2};
  return b.DotGeneral(x, y, d, ProductPrecision(b.shape(x).dtype));
}

// ---------------------------------------------------------------- Cholesky

// True per matrix where the factor failed: XLA fills the whole factor with
// NaN when a leading minor is not positive-definite.
Value CholeskyFailed(ir::Builder& b, Value factor) {
  const ir::Shape s = b.shape(factor);
  const int64_t r = s.rank();
  Value bad = b.Unary(Op::Not, b.IsFinite(factor));
  return b.Reduce(bad, b.ScalarConstant(ir::DType::Bool, 0), {r - 2, r - 1}, ir::ReduceKind::Or);
}

// LAPACK's info: the 1-based order of the first leading minor that is not
// positive-definite, 0 when there is none. XLA's factor tells only whether
// one failed; failure is monotone in the order (a minor of a positive-definite
// matrix is positive-definite), so a bisection finds it: ceil(log2(n + 1))
// more factorizations, each of the matrix with all but its leading `mid`
// rows and columns replaced by the identity.
Value CholeskyInfo(ir::Builder& b, Value a, bool upper) {
  const ir::Shape s = b.shape(a);
  const int64_t r = s.rank(), n = s.dims.back();
  const std::vector<int64_t> bd = BatchOf(s.dims);
  std::vector<int64_t> batch_dims(r - 2);
  for (int64_t i = 0; i < r - 2; ++i) batch_dims[i] = i;
  Value row = b.Iota({ir::DType::I64, s.dims}, r - 2);
  Value col = b.Iota({ir::DType::I64, s.dims}, r - 1);
  Value eye = b.Select(b.Compare(CompareDir::EQ, row, col), b.Full(s.dtype, s.dims, 1), b.Full(s.dtype, s.dims, 0));
  // Orders up to lo are positive-definite; order hi is not (n + 1: none fails).
  Value lo = b.Full(ir::DType::I64, bd, 0), hi = b.Full(ir::DType::I64, bd, static_cast<double>(n + 1));
  for (int64_t gap = n + 1; gap > 1; gap = (gap + 1) / 2) {
    Value mid = b.Binary(Op::Div, b.Binary(Op::Add, lo, hi), b.Full(ir::DType::I64, bd, 2));
    Value m = b.BroadcastInDim(mid, s.dims, batch_dims);
    Value inside = b.Binary(Op::And, b.Compare(CompareDir::LT, row, m), b.Compare(CompareDir::LT, col, m));
    Value failed = CholeskyFailed(b, b.Cholesky(b.Select(inside, a, eye), !upper));
    hi = b.Select(failed, mid, hi);
    lo = b.Select(failed, lo, mid);
  }
  Value none = b.Compare(CompareDir::EQ, hi, b.Full(ir::DType::I64, bd, static_cast<double>(n + 1)));
  return b.Convert(b.Select(none, b.Full(ir::DType::I64, bd, 0), hi), ir::DType::I32);
}

std::tuple<at::Tensor, at::Tensor> linalg_cholesky_ex(const at::Tensor& A, bool upper, bool check_errors) {
  TraceScope s;
  at::native::squareCheckInputs(A, "linalg.cholesky");
  at::native::checkFloatingOrComplex(A, "linalg.cholesky");
  CheckRealFloat(A, "linalg.cholesky");
  const int d = DeviceIndex(A);
  ir::Builder& b = B(d);
  Value a = Val(A);
  Value factor = Triangle(b, b.Cholesky(a, !upper), !upper);
  Value failed = CholeskyFailed(b, factor);
  Value info = CholeskyInfo(b, a, upper);
  if (check_errors) {
    CheckNone(d, failed, runtime::ErrorKind::kLinAlg,
              "linalg.cholesky: The factorization could not be completed because the input is not positive-definite "
              "(a leading minor is not positive-definite; linalg.cholesky_ex returns its order in info)");
  }
  return {Wrap(factor, d), Wrap(info, d)};
}

at::Tensor cholesky(const at::Tensor& A, bool upper) {
  TraceScope s;
  TORCH_CHECK(A.dim() >= 2, "cholesky: A must have at least 2 dimensions");
  return std::get<0>(tpj::aten::linalg_cholesky_ex(A, upper, /*check_errors=*/true));
}

// A^-1 B from A's Cholesky factor (lower: A = L L^T; upper: A = U^T U).
Value CholeskySolve(ir::Builder& b, Value factor, Value rhs, bool upper) {
  Value y = b.TriangularSolve(factor, rhs, true, !upper, false, upper);
  return b.TriangularSolve(factor, y, true, !upper, false, !upper);
}

// The kernel of cholesky_solve, which broadcasts the batches before it.
at::Tensor cholesky_solve_helper(const at::Tensor& Bt, const at::Tensor& A, bool upper) {
  TraceScope s;
  CheckRealFloat(A, "cholesky_solve");
  const int d = CommonDevice({&A, &Bt});
  return Wrap(CholeskySolve(B(d), ValAs(A, A.scalar_type()), ValAs(Bt, A.scalar_type()), upper), d);
}

at::Tensor cholesky_inverse(const at::Tensor& A, bool upper) {
  TraceScope s;
  at::native::squareCheckInputs(A, "cholesky_inverse");
  CheckRealFloat(A, "cholesky_inverse");
  const int d = DeviceIndex(A);
  ir::Builder& b = B(d);
  return Wrap(CholeskySolve(b, Val(A), Identity(b, ToIr(A.scalar_type()), A.sizes().vec()), upper), d);
}

// The check the composite ops (linalg.cholesky, linalg.inv, linalg.solve,
// linalg.lu_factor) run on the info of their _ex kernels: compiled into the
// program (raised when a result is read) instead of reading info on the host,
// which would run the program at once, every call.
void linalg_check_errors(const at::Tensor& info, c10::string_view api_name, bool is_matrix) {
  const std::string api(api_name);
  std::string what;
  if (api.find("cholesky") != std::string::npos) {
    what = api + ": The factorization could not be completed because the input is not positive-definite (the "
                 "_ex variant returns the order of the first failing leading minor in info).";
  } else if (api.find("lu_factor") != std::string::npos) {
    what = api + ": a diagonal element of U is zero and using it on lu_solve would result in a division by zero "
                 "(linalg.lu_factor_ex returns its position in info).";
  } else {
    what = api + ": The solver failed because the input matrix is singular.";
  }
  if (!IsPending(info) && HasBuffer(info)) {
    // info computed already (a complex input's kernel ran on the CPU): read
    // now, as the CPU does; a deferred check would wait for an unrelated program.
    TORCH_CHECK_LINALG(info.cpu().eq(0).all().item<bool>(), what);
    return;
  }
  TraceScope s;
  const int d = DeviceIndex(info);
  ir::Builder& b = B(d);
  Value v = Val(info);
  CheckNone(d, b.Compare(CompareDir::NE, v, b.Full(b.shape(v).dtype, b.shape(v).dims, 0)), runtime::ErrorKind::kLinAlg,
            what);
}

// ------------------------------------------------------ triangular solves

// A and B with their batch dimensions broadcast to one shape.
std::pair<Value, Value> BroadcastBatch(int d, const at::Tensor& A, const at::Tensor& Bt, at::ScalarType t,
                                       std::vector<int64_t>* a_dims, std::vector<int64_t>* b_dims) {
  std::vector<int64_t> batch =
      at::infer_size(A.sizes().slice(0, A.dim() - 2), Bt.sizes().slice(0, Bt.dim() - 2));
  *a_dims = With(batch, {A.size(-2), A.size(-1)});
  *b_dims = With(batch, {Bt.size(-2), Bt.size(-1)});
  return {BroadcastTo(d, ValAs(A, t), *a_dims), BroadcastTo(d, ValAs(Bt, t), *b_dims)};
}

at::Tensor linalg_solve_triangular(const at::Tensor& A, const at::Tensor& Bt, bool upper, bool left, bool unitriangular) {
  TraceScope s;
  at::native::checkInputsSolver(A, Bt, left, "linalg.solve_triangular");
  const at::ScalarType t = at::result_type(A, Bt);
  TORCH_CHECK(A.scalar_type() == Bt.scalar_type(), "linalg.solve_triangular: Expected A and B to have the same dtype, but found A of type ",
              A.scalar_type(), " and B of type ", Bt.scalar_type(), " instead");
  CheckRealFloat(A, "linalg.solve_triangular");
  const int d = CommonDevice({&A, &Bt});
  std::vector<int64_t> ad, bd;
  auto [a, rhs] = BroadcastBatch(d, A, Bt, t, &ad, &bd);
  return Wrap(B(d).TriangularSolve(a, rhs, left, !upper, unitriangular, false), d);
}

std::tuple<at::Tensor, at::Tensor> triangular_solve(const at::Tensor& Bt, const at::Tensor& A, bool upper, bool transpose,
                                                    bool unitriangular) {
  TraceScope s;
  TORCH_CHECK(A.dim() >= 2 && Bt.dim() >= 2, "torch.triangular_solve: Expected b and A to have at least 2 dimensions");
  at::native::squareCheckInputs(A, "triangular_solve");
  TORCH_CHECK(A.scalar_type() == Bt.scalar_type(), "triangular_solve: Expected b and A to have the same dtype");
  CheckRealFloat(A, "triangular_solve");
  const int d = CommonDevice({&A, &Bt});
  std::vector<int64_t> ad, bd;
  auto [a, rhs] = BroadcastBatch(d, A, Bt, A.scalar_type(), &ad, &bd);
  ir::Builder& b = B(d);
  Value x = b.TriangularSolve(a, rhs, true, !upper, unitriangular, transpose);
  return {Wrap(x, d), Wrap(a, d)};
}

// ----------------------------------------------- LU with partial pivoting

struct Lu {
  Value lu;      // [..., m, n]: L below the diagonal (unit diagonal implied), U on and above
  Value pivots;  // i32 [..., k], 1-based, LAPACK's
  Value perm;    // i64 [..., m]: row i of L U is row perm[i] of A
  Value info;    // i32 [...]: 1-based first zero pivot, 0 when none
};

// LAPACK's getrf, unrolled: for each column the first row of largest
// magnitude among the rest becomes the pivot, rows swap, the multipliers
// below it are stored, and the trailing rows take the rank-1 update. A zero
// pivot is recorded in info and its column left unscaled, as LAPACK does.
Lu LuFactor(ir::Builder& b, Value a) {
  const ir::Shape s = b.shape(a);
  const ir::DType t = s.dtype;
  const std::vector<int64_t> batch = BatchOf(s.dims);
  const int64_t m = s.dims[s.rank() - 2], n = s.dims[s.rank() - 1], k = std::min(m, n);
  int64_t nb = 1;
  for (int64_t v : batch) nb *= v;
  const std::vector<int64_t> mat{nb, m, n}, col{nb, m}, vec{nb};
  Value x = b.Reshape(a, mat);
  Value row_of = b.Iota({ir::DType::I64, mat}, 1);
  Value col_of = b.Iota({ir::DType::I64, mat}, 2);
  Value row_idx = b.Iota({ir::DType::I64, col}, 1);
  Value perm = row_idx;
  Value info = b.Full(ir::DType::I32, vec, 0);
  Value base = b.Binary(Op::Mul, b.Iota({ir::DType::I64, vec}, 0), b.Full(ir::DType::I64, vec, static_cast<double>(m)));
  std::vector<Value> pivots;
  auto i64 = [&](const std::vector<int64_t>& dims, double v) { return b.Full(ir::DType::I64, dims, v); };
  auto column = [&](Value v, int64_t j) {
    return b.Reshape(b.Slice(v, {0, 0, j}, {nb, m, j + 1}, {1, 1, 1}), col);
  };
  ir::GatherDims rows;
  rows.offset_dims = {1};
  rows.collapsed_slice_dims = {0};
  rows.start_index_map = {0};
  rows.index_vector_dim = 1;
  // An empty batch has nothing to factor (its row gathers have no rows).
  for (int64_t j = 0; j < (nb > 0 ? k : 0); ++j) {
    // Pivot: the first row r >= j of largest |x[r, j]|.
    Value c = column(x, j);
    Value below = b.Compare(CompareDir::GE, row_idx, i64(col, j));
    Value mag = b.Select(below, b.Unary(Op::Abs, c), b.Full(t, col, -1));
    Value top = b.Reduce(mag, b.ScalarConstant(t, -1), {1}, ir::ReduceKind::Max);
    // (a NaN is the largest, as LAPACK's idamax takes the first NaN it meets
    // before anything larger: the factors are NaN, not a zero pivot)
    Value hit = b.Binary(Op::Or, b.Compare(CompareDir::EQ, mag, b.BroadcastInDim(top, col, {0})),
                         b.Compare(CompareDir::NE, mag, mag));
    Value cand = b.Select(hit, row_idx, i64(col, static_cast<double>(m)));
    Value p = b.Reduce(cand, b.ScalarConstant(ir::DType::I64, static_cast<double>(m)), {1}, ir::ReduceKind::Min);
    p = b.Select(b.Compare(CompareDir::EQ, p, i64(vec, static_cast<double>(m))), i64(vec, static_cast<double>(j)), p);  // NaN column
    pivots.push_back(b.Convert(b.Binary(Op::Add, p, i64(vec, 1)), ir::DType::I32));
    // Swap rows j and p (all columns, as LAPACK's laswp).
    Value flat = b.Reshape(x, {nb * m, n});
    Value row_p = b.Gather(flat, b.Reshape(b.Binary(Op::Add, base, p), {nb, 1}), rows, {1, n});  // [nb, n]
    Value row_j = b.Reshape(b.Slice(x, {0, j, 0}, {nb, j + 1, n}, {1, 1, 1}), {nb, n});
    Value p_mat = b.BroadcastInDim(p, mat, {0});
    Value is_j = b.Compare(CompareDir::EQ, row_of, i64(mat, static_cast<double>(j)));
    Value is_p = b.Compare(CompareDir::EQ, row_of, p_mat);
    x = b.Select(is_j, b.BroadcastInDim(row_p, mat, {0, 2}), b.Select(is_p, b.BroadcastInDim(row_j, mat, {0, 2}), x));
    Value p_col = b.BroadcastInDim(p, col, {0});
    Value perm_j = b.BroadcastInDim(b.Reshape(b.Slice(perm, {0, j}, {nb, j + 1}, {1, 1}), vec), col, {0});
    Value perm_p = b.Reduce(b.Select(b.Compare(CompareDir::EQ, row_idx, p_col), perm, i64(col, 0)),
                            b.ScalarConstant(ir::DType::I64, 0), {1}, ir::ReduceKind::Sum);
    Value is_j_col = b.Compare(CompareDir::EQ, row_idx, i64(col, static_cast<double>(j)));
    perm = b.Select(is_j_col, b.BroadcastInDim(perm_p, col, {0}),
                    b.Select(b.Compare(CompareDir::EQ, row_idx, p_col), perm_j, perm));
    // Multipliers below the pivot, then the rank-1 update of the trailing block.
    Value pivot = b.Reshape(b.Slice(row_p, {0, j}, {nb, j + 1}, {1, 1}), vec);
    Value nonzero = b.Compare(CompareDir::NE, pivot, b.Full(t, vec, 0));
    Value first_zero = b.Binary(Op::And, b.Unary(Op::Not, nonzero), b.Compare(CompareDir::EQ, info, b.Full(ir::DType::I32, vec, 0)));
    info = b.Select(first_zero, b.Full(ir::DType::I32, vec, static_cast<double>(j + 1)), info);
    Value cj = column(x, j);
    Value scaled = b.Select(b.BroadcastInDim(nonzero, col, {0}), b.Binary(Op::Div, cj, b.BroadcastInDim(pivot, col, {0})), cj);
    Value l_mat = b.BroadcastInDim(scaled, mat, {0, 1});
    Value lower_rows = b.Compare(CompareDir::GT, row_of, i64(mat, static_cast<double>(j)));
    Value right_cols = b.Compare(CompareDir::GT, col_of, i64(mat, static_cast<double>(j)));
    Value at_col = b.Compare(CompareDir::EQ, col_of, i64(mat, static_cast<double>(j)));
    Value update = b.Binary(Op::Sub, x, b.Binary(Op::Mul, l_mat, b.BroadcastInDim(row_p, mat, {0, 2})));
    x = b.Select(b.Binary(Op::And, lower_rows, right_cols), update,
                 b.Select(b.Binary(Op::And, lower_rows, at_col), l_mat, x));
  }
  Lu r;
  r.lu = b.Reshape(x, s.dims);
  Value piv = !pivots.empty() ? b.Concatenate([&] {
    std::vector<Value> cols;
    for (Value v : pivots) cols.push_back(b.Reshape(v, {nb, 1}));
    return cols;
  }(), 1)
                              : b.Full(ir::DType::I32, {nb, k}, 0);
  r.pivots = b.Reshape(piv, With(batch, {k}));
  std::vector<int64_t> perm_dims = batch;
  perm_dims.push_back(m);
  r.perm = b.Reshape(perm, perm_dims);
  r.info = b.Reshape(info, batch);
  return r;
}

// The row permutation [..., m] (i64) that LAPACK's 1-based row swaps
// `pivots` [..., k] apply in order: row i of P^T A is row perm[i] of A.
Value PermFromPivots(ir::Builder& b, Value pivots, int64_t m) {
  const ir::Shape ps = b.shape(pivots);
  const int64_t k = ps.dims.back();
  std::vector<int64_t> batch(ps.dims.begin(), ps.dims.end() - 1);
  int64_t nb = 1;
  for (int64_t v : batch) nb *= v;
  const std::vector<int64_t> col{nb, m}, vec{nb};
  Value piv = b.Binary(Op::Sub, b.Convert(b.Reshape(pivots, {nb, k}), ir::DType::I64), b.Full(ir::DType::I64, {nb, k}, 1));
  Value idx = b.Iota({ir::DType::I64, col}, 1);
  Value perm = idx;
  for (int64_t j = 0; j < k; ++j) {
    Value p = b.Reshape(b.Slice(piv, {0, j}, {nb, j + 1}, {1, 1}), vec);
    Value p_col = b.BroadcastInDim(p, col, {0});
    Value is_p = b.Compare(CompareDir::EQ, idx, p_col);
    Value is_j = b.Compare(CompareDir::EQ, idx, b.Full(ir::DType::I64, col, static_cast<double>(j)));
    Value perm_j = b.BroadcastInDim(b.Reshape(b.Slice(perm, {0, j}, {nb, j + 1}, {1, 1}), vec), col, {0});
    Value perm_p = b.Reduce(b.Select(is_p, perm, b.Full(ir::DType::I64, col, 0)), b.ScalarConstant(ir::DType::I64, 0), {1},
                            ir::ReduceKind::Sum);
    perm = b.Select(is_j, b.BroadcastInDim(perm_p, col, {0}), b.Select(is_p, perm_j, perm));
  }
  batch.push_back(m);
  return b.Reshape(perm, batch);
}

// The permutation matrix P [..., m, m] with A = P L U: P[perm[i], i] = 1.
Value PermMatrix(ir::Builder& b, Value perm, ir::DType t) {
  const std::vector<int64_t> pd = b.shape(perm).dims;
  const int64_t r = static_cast<int64_t>(pd.size());
  std::vector<int64_t> dims = pd;
  dims.push_back(pd.back());
  std::vector<int64_t> bcast(r);
  for (int64_t i = 0; i < r - 1; ++i) bcast[i] = i;
  bcast[r - 1] = r;  // perm[..., i] varies along the column
  Value pm = b.BroadcastInDim(perm, dims, bcast);
  Value eq = b.Compare(CompareDir::EQ, pm, b.Iota({ir::DType::I64, dims}, r - 1));
  return b.Select(eq, b.Full(t, dims, 1), b.Full(t, dims, 0));
}

// Rows of x [..., m, c] permuted: out[i] = x[perm[i]] (or, inverse,
// out[perm[i]] = x[i]), as a product with the 0/1 permutation matrix, which
// is exact for finite x.
Value PermuteRows(ir::Builder& b, Value x, Value perm, bool inverse) {
  Value p = PermMatrix(b, perm, b.shape(x).dtype);  // P[perm[i], i] = 1; P^T x = x[perm]
  return Matmul(b, inverse ? p : MT(b, p), x);
}

// Solves A X = B (or A^T X = B) for X from A's LU factors; all [..., n, *].
Value LuSolveLeft(ir::Builder& b, Value lu, Value perm, Value rhs, bool adjoint) {
  if (!adjoint) {
    Value y = b.TriangularSolve(lu, PermuteRows(b, rhs, perm, false), true, true, true, false);
    return b.TriangularSolve(lu, y, true, false, false, false);
  }
  Value y = b.TriangularSolve(lu, rhs, true, false, false, true);
  Value z = b.TriangularSolve(lu, y, true, true, true, true);
  return PermuteRows(b, z, perm, true);
}

void CheckLuInputs(const at::Tensor& A, const char* op) {
  at::native::checkIsMatrix(A, op);
  at::native::checkFloatingOrComplex(A, op);
  CheckRealFloat(A, op);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linalg_lu_factor_ex(const at::Tensor& A, bool pivot, bool check_errors) {
  TraceScope s;
  CheckLuInputs(A, "torch.linalg.lu_factor");
  TORCH_CHECK(pivot, "linalg.lu_factor: LU without pivoting is not implemented on the CPU");
  const int d = DeviceIndex(A);
  ir::Builder& b = B(d);
  Lu f = LuFactor(b, Val(A));
  if (check_errors) {
    CheckNone(d, b.Compare(CompareDir::NE, f.info, b.Full(ir::DType::I32, b.shape(f.info).dims, 0)), runtime::ErrorKind::kLinAlg,
              "torch.linalg.lu_factor: a diagonal element of U is zero and using it on lu_solve would result in a "
              "division by zero; linalg.lu_factor_ex returns its position in info");
  }
  return {Wrap(f.lu, d), Wrap(f.pivots, d), Wrap(f.info, d)};
}

// P, L, U from packed factors [..., m, n] and a permutation [..., m].
std::tuple<at::Tensor, at::Tensor, at::Tensor> Unpack(int d, Value lu, Value perm, bool data, bool pivots) {
  ir::Builder& b = B(d);
  const ir::Shape s = b.shape(lu);
  const std::vector<int64_t> batch = BatchOf(s.dims);
  const int64_t m = s.dims[s.rank() - 2], n = s.dims[s.rank() - 1], k = std::min(m, n);
  const at::ScalarType t = ToAten(s.dtype);
  at::Tensor P = pivots ? Wrap(PermMatrix(b, perm, s.dtype), d) : NotComputed(t, d);
  if (!data) return {P, NotComputed(t, d), NotComputed(t, d)};
  const int64_t r = s.rank();
  std::vector<int64_t> zeros(r, 0), step(r, 1);
  std::vector<int64_t> lim_l = With(batch, {m, k}), lim_u = With(batch, {k, n});
  Value l = b.Slice(lu, zeros, lim_l, step);
  l = b.Binary(Op::Add, Triangle(b, l, true, -1), Identity(b, s.dtype, lim_l));
  Value u = Triangle(b, b.Slice(lu, zeros, lim_u, step), false);
  return {P, Wrap(l, d), Wrap(u, d)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> linalg_lu(const at::Tensor& A, bool pivot) {
  TraceScope s;
  CheckLuInputs(A, "torch.linalg.lu");
  TORCH_CHECK(pivot, "linalg.lu: LU without pivoting is not implemented on the CPU");
  const int d = DeviceIndex(A);
  Lu f = LuFactor(B(d), Val(A));
  return Unpack(d, f.lu, f.perm, true, true);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lu_unpack(const at::Tensor& LU, const at::Tensor& pivots, bool unpack_data,
                                                         bool unpack_pivots) {
  TraceScope s;
  TORCH_CHECK(LU.dim() >= 2, "torch.lu_unpack: Expected tensor with 2 or more dimensions. Got size: ", LU.sizes(), " instead");
  TORCH_CHECK(pivots.scalar_type() == at::kInt, "torch.lu_unpack: LU_pivots is expected to be a contiguous tensor of torch.int32 dtype.");
  CheckRealFloat(LU, "torch.lu_unpack");
  const int d = CommonDevice({&LU, &pivots});
  ir::Builder& b = B(d);
  Value perm = unpack_pivots ? PermFromPivots(b, Val(pivots), LU.size(-2)) : Value{};
  return Unpack(d, Val(LU), perm, unpack_data, unpack_pivots);
}

// Solves with factors `lu` [batch_a..., n, n] and their permutation against
// rhs [..., n, c] (batches broadcast), left or right, plain or adjoint.
Value SolveWithLu(ir::Builder& b, int d, Value lu, Value perm, Value rhs, bool left, bool adjoint) {
  const std::vector<int64_t> ld = b.shape(lu).dims, rd = b.shape(rhs).dims;
  std::vector<int64_t> batch = at::infer_size(BatchOf(ld), BatchOf(rd));
  const int64_t n = ld.back();
  lu = BroadcastTo(d, lu, With(batch, {n, n}));
  std::vector<int64_t> pd = batch;
  pd.push_back(n);
  perm = BroadcastTo(d, perm, pd);
  rhs = BroadcastTo(d, rhs, With(batch, {rd[rd.size() - 2], rd.back()}));
  if (left) return LuSolveLeft(b, lu, perm, rhs, adjoint);
  // X A = B  <=>  A^T X^T = B^T;  X A^T = B  <=>  A X^T = B^T.
  return MT(b, LuSolveLeft(b, lu, perm, MT(b, rhs), !adjoint));
}

at::Tensor linalg_lu_solve(const at::Tensor& LU, const at::Tensor& pivots, const at::Tensor& Bt, bool left, bool adjoint) {
  TraceScope s;
  TORCH_CHECK(LU.dim() >= 2, "linalg.lu_solve: Expected LU to have at least 2 dimensions");
  at::native::squareCheckInputs(LU, "torch.linalg.lu_solve");
  at::native::checkInputsSolver(LU, Bt, left, "linalg.lu_solve");
  TORCH_CHECK(LU.size(-1) == pivots.size(-1), "linalg.lu_solve: Number of pivots per batch should be same as the dimension of the matrix");
  TORCH_CHECK(pivots.scalar_type() == at::kInt, "linalg.lu_solve: pivots should be a Tensor of scalar type torch.int32");
  TORCH_CHECK(LU.scalar_type() == Bt.scalar_type(), "linalg.lu_solve: Expected LU and B to have the same dtype");
  CheckRealFloat(LU, "linalg.lu_solve");
  const int d = CommonDevice({&LU, &pivots, &Bt});
  ir::Builder& b = B(d);
  Value perm = PermFromPivots(b, Val(pivots), LU.size(-1));
  return Wrap(SolveWithLu(b, d, Val(LU), perm, Val(Bt), left, adjoint), d);
}

// ----------------------------------------- solve, inverse, determinants

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> _linalg_solve_ex(const at::Tensor& A, const at::Tensor& Bt, bool left,
                                                                           bool check_errors) {
  TraceScope s;
  at::native::checkFloatingOrComplex(A, "linalg.solve");
  TORCH_CHECK(A.scalar_type() == Bt.scalar_type(), "linalg.solve: Expected A and B to have the same dtype, but found A of type ",
              A.scalar_type(), " and B of type ", Bt.scalar_type(), " instead");
  CheckRealFloat(A, "linalg.solve");
  const bool vector_case = at::native::linalg_solve_is_vector_rhs(A, Bt);
  const at::Tensor B_ = vector_case ? Bt.unsqueeze(-1) : Bt;
  at::native::checkInputsSolver(A, B_, left, "linalg.solve");
  const int d = CommonDevice({&A, &Bt});
  ir::Builder& b = B(d);
  Lu f = LuFactor(b, Val(A));
  Value x = SolveWithLu(b, d, f.lu, f.perm, Val(B_), left, false);
  if (vector_case) {
    std::vector<int64_t> dims = b.shape(x).dims;
    dims.pop_back();
    x = b.Reshape(x, dims);
  }
  if (check_errors) {
    CheckNone(d, b.Compare(CompareDir::NE, f.info, b.Full(ir::DType::I32, b.shape(f.info).dims, 0)), runtime::ErrorKind::kLinAlg,
              "torch.linalg.solve: The solver failed because the input matrix is singular.");
  }
  return {Wrap(x, d), Wrap(f.lu, d), Wrap(f.pivots, d), Wrap(f.info, d)};
}

std::tuple<at::Tensor, at::Tensor> linalg_inv_ex(const at::Tensor& A, bool check_errors) {
  TraceScope s;
  at::native::squareCheckInputs(A, "linalg.inv");
  at::native::checkFloatingOrComplex(A, "linalg.inv", /*allow_low_precision_dtypes*/ false);
  CheckRealFloat(A, "linalg.inv");
  const int d = DeviceIndex(A);
  ir::Builder& b = B(d);
  Lu f = LuFactor(b, Val(A));
  Value x = LuSolveLeft(b, f.lu, f.perm, Identity(b, ToIr(A.scalar_type()), A.sizes().vec()), false);
  if (check_errors) {
    CheckNone(d, b.Compare(CompareDir::NE, f.info, b.Full(ir::DType::I32, b.shape(f.info).dims, 0)), runtime::ErrorKind::kLinAlg,
              "linalg.inv: A diagonal element of U is zero, the inversion could not be completed because the input matrix is "
              "singular.");
  }
  return {Wrap(x, d), Wrap(f.info, d)};
}

// +1 or -1 per matrix: the parity of LAPACK's row swaps.
Value PivotSign(ir::Builder& b, Value pivots, ir::DType t) {
  const std::vector<int64_t> pd = b.shape(pivots).dims;
  const int64_t r = static_cast<int64_t>(pd.size());
  Value pos = b.Binary(Op::Add, b.Iota({ir::DType::I32, pd}, r - 1), b.Full(ir::DType::I32, pd, 1));
  Value swapped = b.Compare(CompareDir::NE, pivots, pos);
  Value flips = b.Select(swapped, b.Full(t, pd, -1), b.Full(t, pd, 1));
  return b.Reduce(flips, b.ScalarConstant(t, 1), {r - 1}, ir::ReduceKind::Prod);
}

// What the determinants factor, as the CPU: A^T when A is contiguous (the
// factorization wants column-major input, and det(A^T) = det(A)). The
// backward reads the same contiguity to solve with the LU the right way.
Value DetOperand(ir::Builder& b, const at::Tensor& A) { return A.is_contiguous() ? MT(b, Val(A)) : Val(A); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> _linalg_det(const at::Tensor& A) {
  TraceScope s;
  at::native::squareCheckInputs(A, "linalg.det");
  at::native::checkFloatingOrComplex(A, "linalg.det");
  CheckRealFloat(A, "linalg.det");
  const int d = DeviceIndex(A);
  ir::Builder& b = B(d);
  Lu f = LuFactor(b, DetOperand(b, A));
  const ir::DType t = ToIr(A.scalar_type());
  Value diag = Diagonal(b, f.lu);
  Value prod = b.Reduce(diag, b.ScalarConstant(t, 1), {b.shape(diag).rank() - 1}, ir::ReduceKind::Prod);
  Value det = b.Binary(Op::Mul, prod, PivotSign(b, f.pivots, t));
  return {Wrap(det, d), Wrap(f.lu, d), Wrap(f.pivots, d)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> _linalg_slogdet(const at::Tensor& A) {
  TraceScope s;
  at::native::squareCheckInputs(A, "linalg.slogdet");
  at::native::checkFloatingOrComplex(A, "linalg.slogdet", /*allow_low_precision_dtypes*/ false);
  CheckRealFloat(A, "linalg.slogdet");
  const int d = DeviceIndex(A);
  ir::Builder& b = B(d);
  Lu f = LuFactor(b, DetOperand(b, A));
  const ir::DType t = ToIr(A.scalar_type());
  Value diag = Diagonal(b, f.lu);
  const int64_t last = b.shape(diag).rank() - 1;
  Value sign = b.Binary(Op::Mul, b.Reduce(b.Unary(Op::Sign, diag), b.ScalarConstant(t, 1), {last}, ir::ReduceKind::Prod),
                        PivotSign(b, f.pivots, t));
  Value logabs = b.Reduce(b.Unary(Op::Log, b.Unary(Op::Abs, diag)), b.ScalarConstant(t, 0), {last}, ir::ReduceKind::Sum);
  return {Wrap(sign, d), Wrap(logabs, d), Wrap(f.lu, d), Wrap(f.pivots, d)};
}

// ------------------------------------------------ QR, eigh and the SVD

// Q [..., m, c] from the Householder vectors `h` [..., m, c] (c >= k) and
// their scales `taus` [..., k].
Value HouseholderProduct(ir::Builder& b, Value h, Value taus) {
  return b.CustomCall("ProductOfElementaryHouseholderReflectors", {h, taus}, {b.shape(h)})[0];
}

// `h` [..., m, n] cut or zero-padded to `cols` columns: Householder vectors
// for the first `cols` columns of Q.
Value ColumnsOf(ir::Builder& b, Value h, int64_t cols) {
  const ir::Shape s = b.shape(h);
  const int64_t r = s.rank(), n = s.dims[r - 1];
  if (n > cols) {
    std::vector<int64_t> limits = s.dims;
    limits[r - 1] = cols;
    return b.Slice(h, std::vector<int64_t>(r, 0), limits, std::vector<int64_t>(r, 1));
  }
  if (n < cols) {
    std::vector<int64_t> lo(r, 0), hi(r, 0), in(r, 0);
    hi[r - 1] = cols - n;
    return b.Pad(h, b.ScalarConstant(s.dtype, 0), lo, hi, in);
  }
  return h;
}

// Least squares by the SVD: X = V diag(1/s) U^T B over the singular values
// above rcond * s_max (PyTorch's rank rule), the minimum-norm solution the
// CPU's default 'gelsy' and 'gelsd' give (for rank-deficient A too). The
// outputs each driver fills are the CPU's: rank for gelsy/gelsd/gelss,
// singular values for gelsd/gelss, residuals when m > n for gels, and for
// gelsd/gelss when every matrix has full rank (a number read from the
// device, as the result's shape depends on it).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> linalg_lstsq(const at::Tensor& A, const at::Tensor& B,
                                                                        std::optional<double> rcond,
                                                                        std::optional<c10::string_view> driver_opt) {
  TORCH_CHECK(A.dim() >= 2, "torch.linalg.lstsq: input must have at least 2 dimensions.");
  const bool vector = B.dim() == A.dim() - 1;
  TORCH_CHECK(vector || B.dim() == A.dim(), "torch.linalg.lstsq: input.dim() must be greater or equal to other.dim() and "
              "(input.dim() - other.dim()) <= 1");
  const std::string driver = driver_opt ? std::string(*driver_opt) : "gelsy";
  TORCH_CHECK(driver == "gels" || driver == "gelsy" || driver == "gelsd" || driver == "gelss",
              "torch.linalg.lstsq: parameter `driver` should be one of (gels, gelsy, gelsd, gelss)");
  TORCH_CHECK(A.scalar_type() == B.scalar_type(), "torch.linalg.lstsq: Expected input and other to have the same dtype, "
              "but got input's dtype ", A.scalar_type(), " and other's dtype ", B.scalar_type());
  CheckRealFloat(A, "linalg.lstsq");
  const at::Tensor b = vector ? B.unsqueeze(-1) : B;
  const int64_t m = A.size(-2), n = A.size(-1);
  TORCH_CHECK(b.size(-2) == m, "torch.linalg.lstsq: input.size(-2) should match other.size(-2)");
  const std::vector<int64_t> batch = at::infer_size(A.sizes().slice(0, A.dim() - 2), b.sizes().slice(0, b.dim() - 2));
  const at::Tensor a = A.expand(With(batch, {m, n})), rhs = b.expand(With(batch, {m, b.size(-1)}));
  auto [u, sv, vh] = at::linalg_svd(a, /*full_matrices=*/false);
  const double eps = A.scalar_type() == at::kDouble ? DBL_EPSILON : FLT_EPSILON;
  const double tol = rcond.value_or(eps * static_cast<double>(std::max(m, n)));
  const at::Tensor top = sv.numel() > 0 ? sv.amax(-1, /*keepdim=*/true) : sv.sum(-1, true);
  const at::Tensor keep = sv > top * tol;
  const at::Tensor inv = at::where(keep, sv.reciprocal(), at::zeros_like(sv));
  at::Tensor x = at::matmul(vh.mH(), inv.unsqueeze(-1) * at::matmul(u.mH(), rhs));
  const at::TensorOptions longs = A.options().dtype(at::kLong);
  const at::Tensor none = at::empty({0}, A.options());
  const at::Tensor rank = driver == "gels" ? at::empty({0}, longs) : keep.sum(-1);
  bool residuals = m > n && driver != "gelsy";
  if (residuals && driver != "gels") residuals = rank.eq(n).all().item<bool>();
  at::Tensor res = residuals ? (at::matmul(a, x) - rhs).pow(2).sum(-2) : none;
  const at::Tensor s_out = driver == "gelsd" || driver == "gelss" ? sv : none;
  if (vector) {
    x = x.squeeze(-1);
    if (residuals) res = res.squeeze(-1);
  }
  return {x, res, rank, s_out};
}

// exp(A) by scaling and squaring: A / 2^s has a 1-norm within theta, where
// the Taylor polynomial of degree 18 is exact to the dtype's precision
// (PyTorch's own bound for its degree-18 approximant), evaluated with 7
// matrix products (Paterson-Stockmeyer); then s squarings. s is read from
// the device, one number for the batch (its largest; matrices that need
// fewer squarings keep their value), as PyTorch's CUDA kernel does, so a
// step that calls matrix_exp syncs once there.
at::Tensor linalg_matrix_exp(const at::Tensor& a) {
  at::native::squareCheckInputs(a, "linalg.matrix_exp");
  at::native::checkFloatingOrComplex(a, "linalg.matrix_exp");
  CheckRealFloat(a, "linalg.matrix_exp");
  const int64_t n = a.size(-1);
  if (a.numel() == 0) return a.clone(at::MemoryFormat::Contiguous);
  if (n == 1) return a.exp();
  const double theta = a.scalar_type() == at::kDouble ? 1.090863719290036 : 3.010066362817634;
  const at::Tensor norm = a.abs().sum(-2).amax(-1);
  const at::Tensor s = at::ceil(at::log2(norm / theta)).clamp_min(0);
  const double most = s.max().item<double>();
  // Past 2^62 the input is inf or NaN (or exp overflows anyway): the Taylor
  // sum then carries the inf/NaN, as the CPU's result does.
  const int64_t squarings = std::isfinite(most) ? static_cast<int64_t>(std::min(most, 62.0)) : 0;
  const at::Tensor scale = at::exp2(s.neg()).unsqueeze(-1).unsqueeze(-1);
  const at::Tensor x = std::isfinite(most) ? a * scale : a;
  const at::Tensor eye = at::eye(n, a.options()).expand_as(a);
  const at::Tensor x2 = at::matmul(x, x), x3 = at::matmul(x2, x), x4 = at::matmul(x2, x2);
  double inv_fact[19];
  inv_fact[0] = 1;
  for (int k = 1; k <= 18; ++k) inv_fact[k] = inv_fact[k - 1] / k;
  // Block j: sum over i < 4 of A^i / (4j + i)!; the result is Horner's rule
  // over the blocks in A^4.
  auto block = [&](int j) {
    at::Tensor out = eye * inv_fact[4 * j];
    const at::Tensor* pow[3] = {&x, &x2, &x3};
    for (int i = 1; i < 4 && 4 * j + i <= 18; ++i) out = out + *pow[i - 1] * inv_fact[4 * j + i];
    return out;
  };
  at::Tensor e = block(4);
  for (int j = 3; j >= 0; --j) e = at::matmul(e, x4) + block(j);
  for (int64_t i = 0; i < squarings; ++i) {
    const at::Tensor sq = at::matmul(e, e);
    e = a.dim() == 2 ? sq : at::where(s.gt(static_cast<double>(i)).unsqueeze(-1).unsqueeze(-1), sq, e);
  }
  return e;
}

// Q's first n columns [..., m, n] from the reflectors stored below the
// diagonal of `input` [..., m, n] and their scales `tau` [..., k] (LAPACK's
// orgqr; torch.nn.utils.parametrizations.orthogonal's "householder" map).
at::Tensor linalg_householder_product(const at::Tensor& input, const at::Tensor& tau) {
  TraceScope s;
  TORCH_CHECK(input.dim() >= 2, "torch.linalg.householder_product: input must have at least 2 dimensions.");
  TORCH_CHECK(input.size(-2) >= input.size(-1),
              "torch.linalg.householder_product: input.shape[-2] must be greater than or equal to input.shape[-1]");
  TORCH_CHECK(input.size(-1) >= tau.size(-1),
              "torch.linalg.householder_product: input.shape[-1] must be greater than or equal to tau.shape[-1]");
  TORCH_CHECK(input.dim() - tau.dim() == 1,
              "torch.linalg.householder_product: Expected tau to have one dimension less than input, but got tau.ndim equal to ",
              tau.dim(), " and input.ndim is equal to ", input.dim());
  TORCH_CHECK(input.sizes().slice(0, input.dim() - 2) == tau.sizes().slice(0, tau.dim() - 1),
              "torch.linalg.householder_product: Expected batch dimensions of tau to be equal to input.shape[:-2], but got ",
              tau.sizes().slice(0, tau.dim() - 1));
  TORCH_CHECK(tau.scalar_type() == input.scalar_type(),
              "torch.linalg.householder_product: tau dtype ", tau.scalar_type(), " does not match input dtype ",
              input.scalar_type());
  CheckRealFloat(input, "linalg.householder_product");
  const int d = DeviceIndex(input);
  if (input.numel() == 0) return Empty(input.sizes().vec(), input.scalar_type(), d);
  return Wrap(HouseholderProduct(B(d), Val(input), Val(tau)), d);
}

std::tuple<at::Tensor, at::Tensor> linalg_qr(const at::Tensor& A, c10::string_view mode) {
  TraceScope s;
  at::native::checkIsMatrix(A, "linalg.qr");
  at::native::checkFloatingOrComplex(A, "linalg.qr");
  TORCH_CHECK(mode == "reduced" || mode == "complete" || mode == "r",
              "qr received unrecognized mode '", mode, "' but expected one of 'reduced' (default), 'r', or 'complete'");
  CheckRealFloat(A, "linalg.qr");
  const int d = DeviceIndex(A);
  ir::Builder& b = B(d);
  const ir::DType t = ToIr(A.scalar_type());
  const std::vector<int64_t> dims = A.sizes().vec(), batch = BatchOf(dims);
  const int64_t m = A.size(-2), n = A.size(-1), k = std::min(m, n), r = A.dim();
  std::vector<int64_t> kdims = batch;
  kdims.push_back(k);
  auto qr = b.CustomCall("Qr", {Val(A)}, {{t, dims}, {t, kdims}});
  const bool complete = mode == "complete";
  std::vector<int64_t> zeros(r, 0), step(r, 1);
  const int64_t r_rows = complete ? m : k;
  Value R = Triangle(b, b.Slice(qr[0], zeros, With(batch, {r_rows, n}), step), false);
  if (mode == "r") return {NotComputed(A.scalar_type(), d), Wrap(R, d)};
  const Value h = ColumnsOf(b, qr[0], complete ? m : k);
  return {Wrap(HouseholderProduct(b, h, qr[1]), d), Wrap(R, d)};
}

// LAPACK's geqrf: R on and above the diagonal, the Householder vectors
// below it (their leading 1 implied) and their scales tau [..., min(m, n)].
// XLA's QR expander computes that very form (its reflections are LAPACK's
// dlarfg); linalg_qr builds Q and R from it. Not differentiable, as on the
// CPU.
std::tuple<at::Tensor, at::Tensor> geqrf(const at::Tensor& A) {
  TraceScope s;
  TORCH_CHECK(A.dim() >= 2, "torch.geqrf: input must have at least 2 dimensions.");
  CheckRealFloat(A, "geqrf");
  const int d = DeviceIndex(A);
  const std::vector<int64_t> dims = A.sizes().vec(), batch = BatchOf(dims);
  std::vector<int64_t> kdims = batch;
  kdims.push_back(std::min(A.size(-2), A.size(-1)));
  if (A.numel() == 0) return {Empty(dims, A.scalar_type(), d), Empty(kdims, A.scalar_type(), d)};
  ir::Builder& b = B(d);
  const ir::DType t = ToIr(A.scalar_type());
  auto qr = b.CustomCall("Qr", {Val(A)}, {{t, dims}, {t, kdims}});
  return {Wrap(qr[0], d), Wrap(qr[1], d)};
}

// LAPACK's ormqr: `other` multiplied by Q = H_1 ... H_k (or its transpose)
// from the left or the right, where geqrf's `input` [..., mn, c] holds the
// reflectors and `tau` [..., k] their scales. Q [mn, mn] is built whole
// (orgqr on the reflectors, padded with zero columns), then multiplied.
at::Tensor ormqr(const at::Tensor& input, const at::Tensor& tau, const at::Tensor& other, bool left, bool transpose) {
  TraceScope s;
  TORCH_CHECK(input.dim() >= 2, "torch.ormqr: input must have at least 2 dimensions.");
  TORCH_CHECK(other.dim() >= 2, "torch.ormqr: other must have at least 2 dimensions.");
  const int64_t side = left ? -2 : -1;
  TORCH_CHECK(other.size(side) == input.size(-2), "torch.ormqr: other.shape[", side,
              "] must be equal to input.shape[-2]");
  TORCH_CHECK(tau.dim() >= 1 && tau.size(-1) == std::min(other.size(side), input.size(-1)),
              "torch.ormqr: tau.shape[-1] must be equal to min(other.shape[", side, "], input.shape[-1])");
  TORCH_CHECK(input.dim() - tau.dim() == 1,
              "torch.ormqr: Expected tau to have one dimension less than input, but got tau.ndim equal to ",
              tau.dim(), " and input.ndim is equal to ", input.dim());
  TORCH_CHECK(input.dim() == other.dim(),
              "torch.ormqr: Expected other to have the same number of dimensions as input, but got other.ndim equal to ",
              other.dim(), " and input.ndim is equal to ", input.dim());
  TORCH_CHECK(input.sizes().slice(0, input.dim() - 2) == tau.sizes().slice(0, tau.dim() - 1),
              "torch.ormqr: Expected batch dimensions of tau to be equal to input.shape[:-2], but got ",
              tau.sizes().slice(0, tau.dim() - 1));
  TORCH_CHECK(input.sizes().slice(0, input.dim() - 2) == other.sizes().slice(0, other.dim() - 2),
              "torch.ormqr: Expected batch dimensions of other to be equal to input.shape[:-2], but got ",
              other.sizes().slice(0, other.dim() - 2));
  TORCH_CHECK(input.scalar_type() == tau.scalar_type(),
              "torch.ormqr: Expected input and tau to have the same dtype, but input has dtype", input.scalar_type(),
              " and tau has dtype ", tau.scalar_type());
  TORCH_CHECK(input.scalar_type() == other.scalar_type(),
              "torch.ormqr: Expected input and other to have the same dtype, but input has dtype", input.scalar_type(),
              " and other has dtype ", other.scalar_type());
  CheckRealFloat(input, "ormqr");
  const int d = DeviceIndex(input);
  if (other.numel() == 0) return Empty(other.sizes().vec(), other.scalar_type(), d);
  ir::Builder& b = B(d);
  const ir::DType t = ToIr(input.scalar_type());
  const int64_t mn = input.size(-2);
  const std::vector<int64_t> batch = BatchOf(input.sizes().vec());
  Value q = tau.size(-1) == 0 ? Identity(b, t, With(batch, {mn, mn}))
                              : HouseholderProduct(b, ColumnsOf(b, Val(input), mn), Val(tau));
  if (transpose) q = MT(b, q);
  Value x = Val(other);
  return Wrap(left ? Matmul(b, q, x) : Matmul(b, x, q), d);
}

// One step of Ogita and Aishima's refinement of approximate eigenvectors X
// of the symmetric A (SIAM J. Matrix Anal. Appl. 2018; quadratic: errors of
// 1e-8 become rounding's): R = I - X^T X, S = X^T A X, eigenvalues
// s_ii / (1 - r_ii), X + X E with E_ij = (s_ij + l_j r_ij) / (l_j - l_i)
// where eigenvalues are apart, r_ij / 2 within clusters (whose vectors need
// only span their space). Sorted ascending again.
std::pair<Value, Value> RefineEigh(ir::Builder& b, Value a, Value x) {
  const ir::Shape s = b.shape(a);
  const int64_t r = s.rank();
  const std::vector<int64_t> all = s.dims, batch = BatchOf(s.dims);
  std::vector<int64_t> wdims(all.begin(), all.end() - 1), bmap, rows, cols;
  for (int64_t i = 0; i < r - 2; ++i) bmap.push_back(i);
  rows = cols = bmap;
  rows.push_back(r - 2);
  cols.push_back(r - 1);
  Value R = b.Binary(Op::Sub, Identity(b, s.dtype, all), Matmul(b, MT(b, x), x));
  Value S = Matmul(b, MT(b, x), Matmul(b, a, x));
  Value lam = b.Binary(Op::Div, Diagonal(b, S), b.Binary(Op::Sub, b.Full(s.dtype, wdims, 1), Diagonal(b, R)));
  Value lam_i = b.BroadcastInDim(lam, all, rows), lam_j = b.BroadcastInDim(lam, all, cols);
  auto fro = [&](Value m) {
    return b.Unary(Op::Sqrt, b.Reduce(b.Binary(Op::Mul, m, m), b.ScalarConstant(s.dtype, 0), {r - 2, r - 1},
                                      ir::ReduceKind::Sum));
  };
  Value is_diag = b.Compare(CompareDir::EQ, b.Iota({ir::DType::I64, all}, r - 2), b.Iota({ir::DType::I64, all}, r - 1));
  Value off = b.Select(is_diag, b.Binary(Op::Sub, S, lam_j), S);  // S - diag(lam)
  // Eigenvalues closer than delta form a cluster (the paper's 2 (|S - D| + |A| |R|), in Frobenius norms)
  Value delta = b.Binary(Op::Mul, b.Full(s.dtype, batch, 2),
                         b.Binary(Op::Add, fro(off), b.Binary(Op::Mul, fro(a), fro(R))));
  Value gap = b.Binary(Op::Sub, lam_j, lam_i);
  Value apart = b.Compare(CompareDir::GT, b.Unary(Op::Abs, gap), b.BroadcastInDim(delta, all, bmap));
  Value half_r = b.Binary(Op::Mul, R, b.Full(s.dtype, all, 0.5));
  Value safe_gap = b.Select(apart, gap, b.Full(s.dtype, all, 1));
  Value e = b.Select(apart, b.Binary(Op::Div, b.Binary(Op::Add, S, b.Binary(Op::Mul, lam_j, R)), safe_gap), half_r);
  Value refined = b.Binary(Op::Add, x, Matmul(b, x, e));
  auto sorted = b.Sort({b.BroadcastInDim(lam, all, cols), refined}, r - 1, false);
  return {Diagonal(b, sorted[0]), sorted[1]};
}

// Eigenvalues ascending [..., n] and eigenvectors [..., n, n] (columns) of
// symmetric matrices read from one triangle, by XLA's Jacobi expander. Its
// sweeps stop when the off-diagonal norm, computed as the square root of
// |A|_F^2 - |diag A|^2, is under eps |A|_F; that difference cancels to noise
// near sqrt(eps) |A|_F, so float64 stopped with errors of about 1e-8 |A|
// (the CPU's: 1e-15), and more sweeps on X^T A X cannot start for the same
// reason: float64 takes two refinement steps (RefineEigh) instead.
// XLA's sweeps stop at once on a NaN norm and return the diagonal: a
// non-finite element in the triangle read makes its matrix's eigenvalues
// and vectors NaN (LAPACK's are NaN where the NaN reaches, as for inf).
std::pair<Value, Value> Eigh(ir::Builder& b, Value a, bool lower) {
  const ir::Shape s = b.shape(a);
  const int64_t r = s.rank();
  std::vector<int64_t> wdims(s.dims.begin(), s.dims.end() - 1);
  const bool f64 = s.dtype == ir::DType::F64;
  char cfg[64];
  std::snprintf(cfg, sizeof(cfg), "%d,1,100,%g", lower ? 1 : 0, f64 ? DBL_EPSILON : FLT_EPSILON);
  auto out = b.CustomCall("Eigh", {a}, {s, {s.dtype, wdims}}, cfg);
  Value w = out[1], v = out[0];
  Value tri = Triangle(b, a, lower);
  if (f64 && s.dims[r - 1] > 1) {
    Value diag = b.Select(b.Compare(CompareDir::EQ, b.Iota({ir::DType::I64, s.dims}, r - 2),
                                    b.Iota({ir::DType::I64, s.dims}, r - 1)),
                          tri, b.Full(s.dtype, s.dims, 0));
    const Value full = b.Binary(Op::Sub, b.Binary(Op::Add, tri, MT(b, tri)), diag);
    std::tie(w, v) = RefineEigh(b, full, v);
    std::tie(w, v) = RefineEigh(b, full, v);  // clusters the first step could not tell apart (gaps under 1e-8 |A|)
  }
  std::vector<int64_t> all(s.dims.begin(), s.dims.end()), keep;
  for (int64_t i = 0; i < r - 2; ++i) keep.push_back(i);
  Value finite = b.Reduce(b.IsFinite(tri), b.ScalarConstant(ir::DType::Bool, 1), {r - 2, r - 1},
                          ir::ReduceKind::And);
  w = b.Select(b.BroadcastInDim(finite, wdims, keep), w, b.Full(s.dtype, wdims, std::nan("")));
  v = b.Select(b.BroadcastInDim(finite, all, keep), v, b.Full(s.dtype, all, std::nan("")));
  return {w, v};
}

std::tuple<at::Tensor, at::Tensor> _linalg_eigh(const at::Tensor& A, c10::string_view uplo, bool compute_v) {
  TraceScope s;
  at::native::squareCheckInputs(A, "linalg.eigh");
  at::native::checkFloatingOrComplex(A, "linalg.eigh");
  TORCH_CHECK(uplo == "L" || uplo == "U", "Expected UPLO argument to be 'L' or 'U', but got ", uplo);
  CheckRealFloat(A, "linalg.eigh");
  const int d = DeviceIndex(A);
  auto [w, v] = Eigh(B(d), Val(A), uplo == "L");
  return {Wrap(w, d), compute_v ? Wrap(v, d) : NotComputed(A.scalar_type(), d)};
}

// Orthonormal columns from x [..., rows, k] (rows >= k) by Householder QR:
// Q's first k columns, each signed so that R's diagonal is >= 0 (x's own
// columns, where they are orthonormal already), and with `complete` the
// rows - k columns that complete them to a basis. A zero or dependent
// column of x gets a unit column orthogonal to the others: Householder's Q
// is orthogonal whatever x is.
Value Orthonormalize(ir::Builder& b, Value x, bool complete) {
  const ir::Shape s = b.shape(x);
  const int64_t r = s.rank(), rows = s.dims[r - 2], k = s.dims[r - 1], cols = complete ? rows : k;
  const std::vector<int64_t> batch = BatchOf(s.dims);
  auto qr = b.CustomCall("Qr", {x}, {s, {s.dtype, With(batch, {k})}});
  Value q = HouseholderProduct(b, ColumnsOf(b, qr[0], cols), qr[1]);  // rows x cols
  const std::vector<int64_t> kd = With(batch, {k});
  Value sign = b.Select(b.Compare(CompareDir::GE, Diagonal(b, qr[0]), b.Full(s.dtype, kd, 0)), b.Full(s.dtype, kd, 1),
                        b.Full(s.dtype, kd, -1));
  if (cols > k) sign = b.Concatenate({sign, b.Full(s.dtype, With(batch, {cols - k}), 1)}, r - 2);
  std::vector<int64_t> keep(r - 1);
  for (int64_t i = 0; i < r - 2; ++i) keep[i] = i;
  keep[r - 2] = r - 1;
  return b.Binary(Op::Mul, q, b.BroadcastInDim(sign, With(batch, {rows, cols}), keep));
}

// The SVD from the eigendecomposition of the symmetric [[0, A], [A^T, 0]]
// ((m+n) x (m+n)): its eigenvalues are +-s_i and |m-n| zeros, the
// eigenvector of +s_i is [u_i; v_i] / sqrt(2). Errors stay at eps * |A| as
// in LAPACK's SVD (no squaring of A as through A^T A).
//
// Where s_i is small next to |A| (zero: a rank-deficient A), the
// eigenvectors of +s_i and -s_i (and of the |m-n| zeros) are as close as
// rounding and mix: the halves of the one taken are then still along u_i
// and v_i, but neither of length 1/sqrt(2) nor of the same sign, and for
// s_i = 0 one half may be zero. So V is made orthonormal (Householder QR),
// U is recomputed as A v_i / s_i where s_i is well above rounding and made
// orthonormal too, and S, rounded below 0 there, is clamped at 0.
std::tuple<at::Tensor, at::Tensor, at::Tensor> _linalg_svd(const at::Tensor& A, bool full_matrices, bool compute_uv,
                                                           std::optional<c10::string_view> driver) {
  TraceScope s;
  at::native::checkIsMatrix(A, "linalg.svd");
  at::native::checkFloatingOrComplex(A, "linalg.svd");
  TORCH_CHECK(!driver.has_value(), "torch.linalg.svd: keyword argument `driver=` is only supported on CUDA inputs with cuSOLVER backend.");
  CheckRealFloat(A, "linalg.svd");
  const int d = DeviceIndex(A);
  ir::Builder& b = B(d);
  const ir::DType t = ToIr(A.scalar_type());
  const std::vector<int64_t> dims = A.sizes().vec(), batch = BatchOf(dims);
  const int64_t m = A.size(-2), n = A.size(-1), k = std::min(m, n), r = A.dim(), N = m + n;
  Value a = Val(A);
  // The CPU's LAPACK refuses NaN (inf gives NaN factors, as Eigh does here)
  CheckNone(d, b.Compare(CompareDir::NE, a, a), runtime::ErrorKind::kLinAlg,
            "linalg.svd: The algorithm failed to converge because the input matrix contained non-finite values.");
  std::vector<int64_t> lo(r, 0), in(r, 0);
  std::vector<int64_t> lo_top(r, 0), hi_top(r, 0);
  lo_top[r - 1] = m;
  Value top = b.Pad(a, b.ScalarConstant(t, 0), lo_top, hi_top, in);  // [0 | A]: m x N
  std::vector<int64_t> hi_bot(r, 0);
  hi_bot[r - 1] = n;
  Value bottom = b.Pad(MT(b, a), b.ScalarConstant(t, 0), lo, hi_bot, in);  // [A^T | 0]: n x N
  Value h = b.Concatenate({top, bottom}, r - 2);
  auto [w, v] = Eigh(b, h, true);
  // The k largest eigenvalues, descending, and their vectors.
  std::vector<int64_t> zeros(r, 0), step(r, 1);
  std::vector<int64_t> wstart(r - 1, 0), wlim = batch;
  wstart[r - 2] = N - k;
  wlim.push_back(N);
  const std::vector<int64_t> kd = With(batch, {k});
  Value S = b.Binary(Op::Max, b.Reverse(b.Slice(w, wstart, wlim, std::vector<int64_t>(r - 1, 1)), {r - 2}),
                     b.Full(t, kd, 0));
  if (!compute_uv) return {NotComputed(A.scalar_type(), d), Wrap(S, d), NotComputed(A.scalar_type(), d)};
  if (k == 0) {  // no singular vectors; the full factors are identities
    auto eye = [&](int64_t size) { return Identity(b, t, With(batch, {size, size})); };
    return {Wrap(full_matrices ? eye(m) : b.Full(t, With(batch, {m, 0}), 0), d), Wrap(S, d),
            Wrap(full_matrices ? eye(n) : b.Full(t, With(batch, {0, n}), 0), d)};
  }
  std::vector<int64_t> vstart(r, 0);
  vstart[r - 1] = N - k;
  Value vk = b.Reverse(b.Slice(v, vstart, With(batch, {N, N}), step), {r - 1});  // N x k
  std::vector<int64_t> ustart(r, 0), vtop(r, 0);
  vtop[r - 2] = m;
  Value U = b.Slice(vk, ustart, With(batch, {m, k}), step);  // along u_i (length 1/sqrt(2) where s_i is clear)
  Value V = Orthonormalize(b, b.Slice(vk, vtop, With(batch, {N, k}), step), full_matrices && n > m);
  Value Vk = full_matrices && n > m ? b.Slice(V, zeros, With(batch, {n, k}), step) : V;
  // s_i well above rounding: s_max * max(m, n) * eps, LAPACK's rank rule.
  const double eps = t == ir::DType::F64 ? std::numeric_limits<double>::epsilon()
                                         : static_cast<double>(std::numeric_limits<float>::epsilon());
  std::vector<int64_t> first(r - 1, 0), first_lim = batch, keep(r - 1);
  first_lim.push_back(1);
  for (int64_t i = 0; i < r - 1; ++i) keep[i] = i;
  Value smax = b.BroadcastInDim(b.Reshape(b.Slice(S, first, first_lim, std::vector<int64_t>(r - 1, 1)), batch), kd,
                                {keep.begin(), keep.end() - 1});
  Value clear = b.Compare(CompareDir::GT, S, b.Binary(Op::Mul, smax, b.Full(t, kd, static_cast<double>(std::max(m, n)) * eps)));
  Value safe = b.Select(clear, S, b.Full(t, kd, 1));
  std::vector<int64_t> cols(r - 1);
  for (int64_t i = 0; i < r - 2; ++i) cols[i] = i;
  cols[r - 2] = r - 1;
  const std::vector<int64_t> mk = With(batch, {m, k});
  Value av = b.Binary(Op::Div, Matmul(b, a, Vk), b.BroadcastInDim(safe, mk, cols));
  U = Orthonormalize(b, b.Select(b.BroadcastInDim(clear, mk, cols), av, U), full_matrices && m > n);
  return {Wrap(U, d), Wrap(S, d), Wrap(MT(b, V), d)};
}

// Complex inputs run on the CPU (counted fallbacks, as linalg.eig): the
// lowerings above are real-valued, and PyTorch's own backward formulas reach
// them with complex operands (linalg.eig's gradient solves a complex system).
bool AnyComplex(const c10::OperatorHandle& op, const c10::Stack& stack) {
  const size_t n = op.schema().arguments().size();
  for (size_t i = stack.size() - n; i < stack.size(); ++i) {
    if (stack[i].isTensor() && stack[i].toTensor().defined() && stack[i].toTensor().is_complex()) return true;
  }
  return false;
}

template <auto fn>
void RealOrCpu(const c10::OperatorHandle& op, c10::DispatchKeySet ks, c10::Stack* stack) {
  if (AnyComplex(op, *stack)) return CpuFallback(op, stack);
  static const c10::KernelFunction kernel = c10::KernelFunction::makeFromUnboxedFunction(TORCH_FN(fn));
  kernel.callBoxed(op, ks, stack);
}

}  // namespace
}  // namespace tpj::aten

#define K(name, fn) \
  m.impl(name, torch::CppFunction::makeFromBoxedFunction<&tpj::aten::RealOrCpu<&tpj::aten::fn>>())

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  K("linalg_cholesky_ex", linalg_cholesky_ex);
  K("cholesky", cholesky);
  K("_linalg_check_errors", linalg_check_errors);
  K("_cholesky_solve_helper", cholesky_solve_helper);
  K("cholesky_inverse", cholesky_inverse);
  K("linalg_solve_triangular", linalg_solve_triangular);
  K("triangular_solve", triangular_solve);
  K("linalg_lu_factor_ex", linalg_lu_factor_ex);
  K("linalg_lu", linalg_lu);
  K("lu_unpack", lu_unpack);
  K("linalg_lu_solve", linalg_lu_solve);
  K("_linalg_solve_ex", _linalg_solve_ex);
  K("linalg_inv_ex", linalg_inv_ex);
  K("_linalg_det", _linalg_det);
  K("_linalg_slogdet", _linalg_slogdet);
  K("linalg_qr", linalg_qr);
  K("linalg_householder_product", linalg_householder_product);
  K("geqrf", geqrf);
  K("ormqr", ormqr);
  K("linalg_matrix_exp", linalg_matrix_exp);
  K("linalg_lstsq", linalg_lstsq);
  K("_linalg_eigh", _linalg_eigh);
  K("_linalg_svd", _linalg_svd);
}
