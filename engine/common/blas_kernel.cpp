#include "common/blas_kernel.h"

#include <dlfcn.h>
#include <strings.h>

#include <array>
#include <cstdlib>
#include <mutex>
#include <optional>

namespace infill {

namespace {

// OpenBLAS's x86-64 cores by the widest vectors their kernels use. The names are those of
// openblas_get_corename(); OPENBLAS_CORETYPE takes the same names in any case.
enum class VectorWidth { kSse, kAvx, kAvx2, kAvx512 };

struct KnownCore {
  const char* name;
  VectorWidth width;
};

constexpr std::array kKnownCores = {
    KnownCore{"Unknown", VectorWidth::kSse},
    KnownCore{"Katmai", VectorWidth::kSse},
    KnownCore{"Coppermine", VectorWidth::kSse},
    KnownCore{"Northwood", VectorWidth::kSse},
    KnownCore{"Prescott", VectorWidth::kSse},
    KnownCore{"Banias", VectorWidth::kSse},
    KnownCore{"Atom", VectorWidth::kSse},
    KnownCore{"Core2", VectorWidth::kSse},
    KnownCore{"Penryn", VectorWidth::kSse},
    KnownCore{"Dunnington", VectorWidth::kSse},
    KnownCore{"Nehalem", VectorWidth::kSse},
    KnownCore{"Athlon", VectorWidth::kSse},
    KnownCore{"Opteron", VectorWidth::kSse},
    KnownCore{"Opteron_SSE3", VectorWidth::kSse},
    KnownCore{"Barcelona", VectorWidth::kSse},
    KnownCore{"Nano", VectorWidth::kSse},
    KnownCore{"Bobcat", VectorWidth::kSse},
    KnownCore{"Sandybridge", VectorWidth::kAvx},
    KnownCore{"Bulldozer", VectorWidth::kAvx},
    KnownCore{"Piledriver", VectorWidth::kAvx},
    KnownCore{"Steamroller", VectorWidth::kAvx},
    KnownCore{"Excavator", VectorWidth::kAvx},
    KnownCore{"Haswell", VectorWidth::kAvx2},
    KnownCore{"Zen", VectorWidth::kAvx2},
    KnownCore{"SkylakeX", VectorWidth::kAvx512},
    KnownCore{"Cooperlake", VectorWidth::kAvx512},
    KnownCore{"SapphireRapids", VectorWidth::kAvx512},
};

const KnownCore* find_core(std::string_view name) {
  for (const KnownCore& core : kKnownCores) {
    const std::string_view known(core.name);
    if (known.size() == name.size() && strncasecmp(known.data(), name.data(), name.size()) == 0)
      return &core;
  }
  return nullptr;
}

// The widest kernels `cpu` can run, and the core OpenBLAS builds them for (Intel's: they run
// on AMD CPUs of the same width too, as OpenBLAS's own Zen core reuses Haswell's kernels).
const KnownCore* widest_core_for(const CpuVectorFeatures& cpu) {
  // SkylakeX's kernels use AVX-512 F, BW, VL, DQ and CD instructions.
  if (cpu.avx512f && cpu.avx512bw && cpu.avx512vl && cpu.avx512dq && cpu.avx512cd)
    return find_core("SkylakeX");
  if (cpu.avx2 && cpu.fma) return find_core("Haswell");
  if (cpu.avx) return find_core("Sandybridge");
  return nullptr;
}

// OpenBLAS's own entry points, looked up in the process: present only when libtorch's
// libblas.so.3 is OpenBLAS. gotoblas_dynamic_quit / gotoblas_dynamic_init are the pair its
// library constructor uses to pick the kernel table (DYNAMIC_ARCH builds only); the init reads
// OPENBLAS_CORETYPE.
struct OpenBlas {
  const char* (*get_corename)() = nullptr;
  const char* (*get_config)() = nullptr;
  void (*dynamic_quit)() = nullptr;
  void (*dynamic_init)() = nullptr;

  static OpenBlas find() {
    OpenBlas b;
    b.get_corename =
        reinterpret_cast<const char* (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
    b.get_config = reinterpret_cast<const char* (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
    b.dynamic_quit = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
    b.dynamic_init = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
    return b;
  }
  bool present() const { return get_corename != nullptr && get_config != nullptr; }
  bool switchable() const {
    return present() && dynamic_quit != nullptr && dynamic_init != nullptr;
  }
  std::string corename() const { return get_corename(); }
};

// The kernel table of `core` is exported as gotoblas_<CORE> where the library has one.
bool has_kernels_for(std::string_view core) {
  std::string symbol = "gotoblas_";
  for (char c : core) symbol += static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return dlsym(RTLD_DEFAULT, symbol.c_str()) != nullptr;
}

std::mutex choice_mutex;
BlasKernelChoice last_choice;

}  // namespace

CpuVectorFeatures detect_cpu_vector_features() {
  __builtin_cpu_init();
  CpuVectorFeatures f;
  f.avx = __builtin_cpu_supports("avx");
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512cd = __builtin_cpu_supports("avx512cd");
  return f;
}

std::string wider_openblas_core(std::string_view current, const CpuVectorFeatures& cpu) {
  const KnownCore* now = find_core(current);
  const KnownCore* best = widest_core_for(cpu);
  if (now == nullptr || best == nullptr || best->width <= now->width) return {};
  return best->name;
}

std::string use_openblas_core(std::string_view core) {
  const OpenBlas blas = OpenBlas::find();
  if (!blas.switchable() || core.empty() || !has_kernels_for(core)) return {};
  // The init reads the core from the environment; the user's own setting (or its absence) is
  // put back after, so child processes make their own choice rather than inherit ours as if
  // the user had named it.
  const char* before = std::getenv("OPENBLAS_CORETYPE");
  const std::optional<std::string> saved =
      before ? std::optional<std::string>(before) : std::nullopt;
  setenv("OPENBLAS_CORETYPE", std::string(core).c_str(), 1);
  blas.dynamic_quit();
  blas.dynamic_init();
  if (saved) {
    setenv("OPENBLAS_CORETYPE", saved->c_str(), 1);
  } else {
    unsetenv("OPENBLAS_CORETYPE");
  }
  return blas.corename();
}

BlasKernelChoice select_blas_kernel() {
  std::lock_guard lock(choice_mutex);
  // After our own switch the core in use is not the one OpenBLAS chose: keep that record.
  if (last_choice.changed) return last_choice;
  BlasKernelChoice c;
  const OpenBlas blas = OpenBlas::find();
  if (!blas.present()) {
    c.library = "not OpenBLAS (openblas_get_corename is not in the process)";
    c.reason = "left to the BLAS libtorch links";
    return last_choice = c;
  }
  c.library = blas.get_config();
  c.detected = c.in_use = blas.corename();
  if (const char* named = std::getenv("OPENBLAS_CORETYPE"); named != nullptr && *named != '\0') {
    c.reason = std::string("OPENBLAS_CORETYPE=") + named + " in the environment";
    return last_choice = c;
  }
  const std::string wider = wider_openblas_core(c.detected, detect_cpu_vector_features());
  if (wider.empty()) {
    c.reason = "OpenBLAS's own choice for this CPU";
    return last_choice = c;
  }
  if (!blas.switchable() || !has_kernels_for(wider)) {
    c.reason = "this CPU runs " + wider + " kernels, which this OpenBLAS cannot switch to";
    return last_choice = c;
  }
  c.in_use = use_openblas_core(wider);
  c.changed = c.in_use != c.detected;
  c.library = blas.get_config();  // it names the core in use
  c.reason = "OpenBLAS fell back to " + c.detected + " kernels; this CPU runs " + wider + "'s";
  return last_choice = c;
}

const BlasKernelChoice& blas_kernel_choice() {
  std::lock_guard lock(choice_mutex);
  return last_choice;
}

std::string describe(const BlasKernelChoice& choice) {
  if (choice.in_use.empty()) return choice.library;
  return choice.library + ": " + choice.in_use + " kernels (" + choice.reason + ")";
}

}  // namespace infill
