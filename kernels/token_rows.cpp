#include "kernels/token_rows.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include <ATen/ATen.h>

#include "kernels/cpu/parallel.h"

namespace infill::kernels {
namespace {

// Copying fewer bytes than this per thread costs less than waking another thread.
constexpr int64_t kBytesPerThread = 64 * 1024;

void check_rows_tensor(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor, got ", t.device());
  TORCH_CHECK(t.dim() == 2, name, " must be 2-D [rows, C], got shape ", t.sizes());
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf, name,
              " must be float32 or float16, got ", t.scalar_type());
  TORCH_CHECK(t.size(1) <= 1 || t.stride(1) == 1, name,
              " must have contiguous rows (stride(1) == 1), got strides ", t.strides());
  TORCH_CHECK(t.size(0) <= 1 || t.stride(0) >= t.size(1), name,
              " rows must not overlap (stride(0) >= C), got strides ", t.strides());
}

// Validates every index against [0, rows) before any copy, so a bad index throws on the
// calling thread and leaves the destination untouched.
const int64_t* checked_index(const at::Tensor& index, int64_t rows, const char* rows_name) {
  TORCH_CHECK(index.device().is_cpu(), "index must be a CPU tensor, got ", index.device());
  TORCH_CHECK(index.dim() == 1, "index must be 1-D [M], got shape ", index.sizes());
  TORCH_CHECK(index.scalar_type() == at::kLong, "index must be int64, got ", index.scalar_type());
  TORCH_CHECK(index.is_contiguous(), "index must be contiguous");
  const int64_t* idx = index.data_ptr<int64_t>();
  for (int64_t i = 0; i < index.size(0); ++i) {
    TORCH_CHECK(idx[i] >= 0 && idx[i] < rows, "index[", i, "] = ", idx[i], " is outside [0, ", rows,
                ") (the rows of ", rows_name, ")");
  }
  return idx;
}

int64_t grain_rows(int64_t row_bytes) {
  return std::max<int64_t>(1, kBytesPerThread / std::max<int64_t>(1, row_bytes));
}

}  // namespace

at::Tensor gather_rows(const at::Tensor& src, const at::Tensor& index) {
  check_rows_tensor(src, "src");
  const int64_t* idx = checked_index(index, src.size(0), "src");
  const int64_t m = index.size(0);
  const int64_t c = src.size(1);
  at::Tensor out = at::empty({m, c}, src.options());
  const int64_t row_bytes = c * static_cast<int64_t>(src.element_size());
  if (m == 0 || row_bytes == 0) return out;

  const auto* src_bytes = static_cast<const char*>(src.data_ptr());
  auto* out_bytes = static_cast<char*>(out.data_ptr());
  const int64_t src_stride_bytes = src.stride(0) * static_cast<int64_t>(src.element_size());
  cpu::parallel_for(0, m, grain_rows(row_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      std::memcpy(out_bytes + i * row_bytes, src_bytes + idx[i] * src_stride_bytes,
                  static_cast<size_t>(row_bytes));
    }
  });
  return out;
}

void scatter_rows(at::Tensor& dst, const at::Tensor& index, const at::Tensor& rows) {
  check_rows_tensor(dst, "dst");
  check_rows_tensor(rows, "rows");
  TORCH_CHECK(dst.scalar_type() == rows.scalar_type(), "rows is ", rows.scalar_type(), ", dst is ",
              dst.scalar_type(), "; they must match");
  TORCH_CHECK(dst.size(1) == rows.size(1), "rows has ", rows.size(1), " columns, dst has ",
              dst.size(1), "; they must match");
  TORCH_CHECK(index.dim() == 1 && index.size(0) == rows.size(0), "index has shape ", index.sizes(),
              ", expected [", rows.size(0), "] (one entry per row of rows)");
  const int64_t* idx = checked_index(index, dst.size(0), "dst");
  const int64_t m = index.size(0);
#ifndef NDEBUG
  {
    std::vector<int64_t> sorted(idx, idx + m);
    std::sort(sorted.begin(), sorted.end());
    const auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    TORCH_CHECK(dup == sorted.end(), "index must be distinct, ", *dup, " appears twice");
  }
#endif
  const int64_t row_bytes = dst.size(1) * static_cast<int64_t>(dst.element_size());
  if (m == 0 || row_bytes == 0) return;

  auto* dst_bytes = static_cast<char*>(dst.data_ptr());
  const auto* rows_bytes = static_cast<const char*>(rows.data_ptr());
  const int64_t dst_stride_bytes = dst.stride(0) * static_cast<int64_t>(dst.element_size());
  const int64_t rows_stride_bytes = rows.stride(0) * static_cast<int64_t>(rows.element_size());
  cpu::parallel_for(0, m, grain_rows(row_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      std::memcpy(dst_bytes + idx[i] * dst_stride_bytes, rows_bytes + i * rows_stride_bytes,
                  static_cast<size_t>(row_bytes));
    }
  });
}

}  // namespace infill::kernels
