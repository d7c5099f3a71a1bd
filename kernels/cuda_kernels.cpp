#include "kernels/cuda_kernels.h"

#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "kernels/cuda/infill_cuda_abi.h"

namespace infill::kernels {
namespace {

constexpr const char* kLibraryName = "libinfill_kernels_cuda.so";

struct CudaLibrary {
  void* handle = nullptr;
  std::string path;
  std::string status;
  bool available = false;
  int (*abi_version)() = nullptr;
  int (*device_count)(char*, int) = nullptr;
  const char* (*last_error)() = nullptr;
  int (*gather_rows)(const void*, int64_t, int64_t, int64_t, const int64_t*, int64_t,
                     void*) = nullptr;
  int (*scatter_rows)(void*, int64_t, int64_t, int64_t, const int64_t*, int64_t, const void*,
                      int64_t) = nullptr;
  int (*masked_attention)(const float*, int64_t, const float*, int64_t, const float*, int64_t,
                          int64_t, int64_t, int64_t, int64_t, float, float*) = nullptr;
};

std::filesystem::path executable_dir() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : exe.parent_path();
}

std::vector<std::string> candidate_paths() {
  std::vector<std::string> paths;
#ifdef INFILL_CUDA_LIBRARY_BUILD_DIR
  paths.push_back(std::string(INFILL_CUDA_LIBRARY_BUILD_DIR) + "/" + kLibraryName);
#endif
  const auto dir = executable_dir();
  if (!dir.empty()) {
    paths.push_back((dir / kLibraryName).string());
    paths.push_back((dir / ".." / "lib" / kLibraryName).lexically_normal().string());
    paths.push_back((dir / ".." / "lib" / "infill" / kLibraryName).lexically_normal().string());  // packages
  }
  return paths;
}

template <class Fn>
bool bind(void* handle, const char* name, Fn& fn, std::string& missing) {
  fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (!fn) missing += missing.empty() ? name : std::string(", ") + name;
  return fn != nullptr;
}

void probe(CudaLibrary& lib) {
  const char* disable = std::getenv("INFILL_DISABLE_CUDA");
  if (disable && *disable && std::string(disable) != "0") {
    lib.status = std::string("CUDA disabled by INFILL_DISABLE_CUDA=") + disable;
    return;
  }

  std::string tried;
  for (const auto& path : candidate_paths()) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) continue;
    lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib.handle) {
      lib.path = path;
      break;
    }
    tried += std::string("; ") + dlerror();
  }
  if (!lib.handle) {
    lib.handle = dlopen(kLibraryName, RTLD_NOW | RTLD_LOCAL);
    if (lib.handle) {
      Dl_info info{};
      lib.path = kLibraryName;
      void* sym = dlsym(lib.handle, "infill_cuda_abi_version");
      if (sym && dladdr(sym, &info) && info.dli_fname) lib.path = info.dli_fname;
    } else {
      tried += std::string("; ") + dlerror();
    }
  }
  if (!lib.handle) {
    lib.status = std::string(kLibraryName) + " not found (CUDA kernels not built or not installed" +
                 tried + ")";
    return;
  }

  std::string missing;
  bind(lib.handle, "infill_cuda_abi_version", lib.abi_version, missing);
  bind(lib.handle, "infill_cuda_device_count", lib.device_count, missing);
  bind(lib.handle, "infill_cuda_last_error", lib.last_error, missing);
  bind(lib.handle, "infill_cuda_gather_rows", lib.gather_rows, missing);
  bind(lib.handle, "infill_cuda_scatter_rows", lib.scatter_rows, missing);
  bind(lib.handle, "infill_cuda_masked_attention", lib.masked_attention, missing);
  if (!missing.empty()) {
    lib.status = lib.path + " lacks the symbols " + missing;
    return;
  }
  if (lib.abi_version() != INFILL_CUDA_ABI_VERSION) {
    lib.status = lib.path + " has C ABI version " + std::to_string(lib.abi_version()) +
                 ", expected " + std::to_string(INFILL_CUDA_ABI_VERSION);
    return;
  }
  std::array<char, 256> name{};
  const int count = lib.device_count(name.data(), static_cast<int>(name.size()));
  if (count < 0) {
    lib.status = std::string("no CUDA device: ") + lib.last_error();
    return;
  }
  if (count == 0) {
    lib.status = "no CUDA device: the CUDA runtime reports 0 devices";
    return;
  }
  lib.available = true;
  lib.status = std::string(name.data()) + " (" + std::to_string(count) + " CUDA device" +
               (count > 1 ? "s)" : ")");
}

const CudaLibrary& library() {
  static std::once_flag once;
  static CudaLibrary lib;
  std::call_once(once, [] { probe(lib); });
  return lib;
}

const CudaLibrary& usable_library(const char* what) {
  const CudaLibrary& lib = library();
  TORCH_CHECK(lib.available, what, " needs a CUDA device: ", lib.status);
  return lib;
}

void check_rows(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 2, name, " must be a 2-D CPU tensor, got ",
              t.sizes(), " on ", t.device());
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kHalf, name,
              " must be float32 or float16, got ", t.scalar_type());
}

void check_index(const at::Tensor& index) {
  TORCH_CHECK(index.device().is_cpu() && index.dim() == 1 && index.scalar_type() == at::kLong,
              "index must be a 1-D int64 CPU tensor, got ", index.scalar_type(), " ",
              index.sizes());
}

int64_t row_stride_bytes(const at::Tensor& t) {
  const int64_t row_bytes = t.size(1) * static_cast<int64_t>(t.element_size());
  return t.size(0) <= 1 ? row_bytes : t.stride(0) * static_cast<int64_t>(t.element_size());
}

// A view whose rows are dense and do not overlap; copies otherwise.
at::Tensor with_dense_rows(const at::Tensor& t) {
  const bool dense =
      (t.size(1) <= 1 || t.stride(1) == 1) && (t.size(0) <= 1 || t.stride(0) >= t.size(1));
  return dense ? t : t.contiguous();
}

}  // namespace

bool cuda_available() { return library().available; }

std::string cuda_status() { return library().status; }

std::string cuda_library_path() { return library().path; }

std::string cuda_library_build_dir() {
#ifdef INFILL_CUDA_LIBRARY_BUILD_DIR
  return INFILL_CUDA_LIBRARY_BUILD_DIR;
#else
  return {};
#endif
}

at::Tensor cuda_gather_rows(const at::Tensor& src_in, const at::Tensor& index_in) {
  const CudaLibrary& lib = usable_library("cuda_gather_rows");
  check_rows(src_in, "src");
  check_index(index_in);
  const at::Tensor src = with_dense_rows(src_in);
  const at::Tensor index = index_in.contiguous();
  at::Tensor out = at::empty({index.size(0), src.size(1)}, src.options());
  const int rc = lib.gather_rows(src.data_ptr(), src.size(0), row_stride_bytes(src),
                                 src.size(1) * static_cast<int64_t>(src.element_size()),
                                 index.data_ptr<int64_t>(), index.size(0), out.data_ptr());
  TORCH_CHECK(rc == INFILL_CUDA_OK, "cuda_gather_rows: ", lib.last_error());
  return out;
}

void cuda_scatter_rows(at::Tensor& dst, const at::Tensor& index_in, const at::Tensor& rows_in) {
  const CudaLibrary& lib = usable_library("cuda_scatter_rows");
  check_rows(dst, "dst");
  check_rows(rows_in, "rows");
  check_index(index_in);
  TORCH_CHECK(dst.scalar_type() == rows_in.scalar_type() && dst.size(1) == rows_in.size(1),
              "rows is ", rows_in.scalar_type(), " ", rows_in.sizes(), ", dst is ",
              dst.scalar_type(), " ", dst.sizes(), "; dtype and columns must match");
  TORCH_CHECK(index_in.size(0) == rows_in.size(0), "index has ", index_in.size(0),
              " entries, rows has ", rows_in.size(0), " rows; they must match");
  TORCH_CHECK((dst.size(1) <= 1 || dst.stride(1) == 1) &&
                  (dst.size(0) <= 1 || dst.stride(0) >= dst.size(1)),
              "dst must have dense, non-overlapping rows, got strides ", dst.strides());
  const at::Tensor rows = with_dense_rows(rows_in);
  const at::Tensor index = index_in.contiguous();
  const int rc = lib.scatter_rows(dst.data_ptr(), dst.size(0), row_stride_bytes(dst),
                                  dst.size(1) * static_cast<int64_t>(dst.element_size()),
                                  index.data_ptr<int64_t>(), index.size(0), rows.data_ptr(),
                                  row_stride_bytes(rows));
  TORCH_CHECK(rc == INFILL_CUDA_OK, "cuda_scatter_rows: ", lib.last_error());
}

at::Tensor cuda_masked_attention(const at::Tensor& q_in, const at::Tensor& k_in,
                                 const at::Tensor& v_in, int64_t heads, double scale) {
  const CudaLibrary& lib = usable_library("cuda_masked_attention");
  for (const auto* t : {&q_in, &k_in, &v_in}) {
    TORCH_CHECK(t->device().is_cpu() && t->dim() == 2 && t->scalar_type() == at::kFloat,
                "cuda_masked_attention: q, k, v must be 2-D float32 CPU tensors, got ",
                t->scalar_type(), " ", t->sizes());
  }
  TORCH_CHECK(heads > 0 && q_in.size(1) % heads == 0 && k_in.size(1) == q_in.size(1) &&
                  v_in.size(1) == q_in.size(1) && k_in.size(0) == v_in.size(0),
              "cuda_masked_attention: expected q [M, heads * d], k, v [L, heads * d], got q ",
              q_in.sizes(), ", k ", k_in.sizes(), ", v ", v_in.sizes(), ", heads ", heads);
  const at::Tensor q = with_dense_rows(q_in);
  const at::Tensor k = with_dense_rows(k_in);
  const at::Tensor v = with_dense_rows(v_in);
  const int64_t width = q.size(1);
  at::Tensor out = at::empty({q.size(0), width}, q.options());
  auto stride = [](const at::Tensor& t) { return row_stride_bytes(t) / 4; };
  const int rc =
      lib.masked_attention(q.data_ptr<float>(), stride(q), k.data_ptr<float>(), stride(k),
                           v.data_ptr<float>(), stride(v), q.size(0), k.size(0), heads,
                           width / heads, static_cast<float>(scale), out.data_ptr<float>());
  TORCH_CHECK(rc == INFILL_CUDA_OK, "cuda_masked_attention: ", lib.last_error());
  return out;
}

}  // namespace infill::kernels
