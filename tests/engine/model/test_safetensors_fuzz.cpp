#include "support/catch.h"
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

#include <ATen/ATen.h>

#include "common/remove_tree.h"
#include "model/safetensors.h"
#include "model/safetensors_torch.h"

namespace fs = std::filesystem;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Characters that move a JSON parser between states, so header mutations reach the
// validation code and not only the "invalid JSON" branch.
constexpr char kJsonChars[] = "{}[]\":,-0123456789eE. FBIU";

// Applies one random mutation to `bytes`; `header_end` is 8 + the original header length.
void mutate(std::string& bytes, size_t header_end, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  if (bytes.empty()) {
    bytes.push_back(static_cast<char>(rng()));
    return;
  }
  const size_t header_lo = std::min<size_t>(8, bytes.size() - 1);
  const size_t header_hi = std::max(header_lo + 1, std::min(header_end, bytes.size()));
  switch (pick(8)) {
    case 0:  // bit flip anywhere
      bytes[pick(bytes.size())] ^= static_cast<char>(1u << pick(8));
      break;
    case 1:  // JSON-significant byte in the header
      bytes[header_lo + pick(header_hi - header_lo)] = kJsonChars[pick(sizeof(kJsonChars) - 1)];
      break;
    case 2:  // random byte in the header
      bytes[header_lo + pick(header_hi - header_lo)] = static_cast<char>(rng());
      break;
    case 3: {  // header length: small perturbation or random
      uint64_t n = 0;
      std::memcpy(&n, bytes.data(), std::min<size_t>(8, bytes.size()));
      n = pick(2) == 0 ? n + static_cast<uint64_t>(static_cast<int64_t>(pick(33)) - 16) : rng();
      std::memcpy(bytes.data(), &n, std::min<size_t>(8, bytes.size()));
      break;
    }
    case 4:  // truncation
      bytes.resize(pick(bytes.size()));
      break;
    case 5: {  // insertion of a few bytes
      const size_t at = pick(bytes.size() + 1);
      std::string extra(1 + pick(4), '\0');
      for (char& c : extra)
        c = pick(2) == 0 ? kJsonChars[pick(sizeof(kJsonChars) - 1)] : static_cast<char>(rng());
      bytes.insert(at, extra);
      break;
    }
    case 6: {  // digit change in the header: retargets offsets and dims
      std::vector<size_t> digits;
      for (size_t i = header_lo; i < header_hi; ++i) {
        if (bytes[i] >= '0' && bytes[i] <= '9') digits.push_back(i);
      }
      if (!digits.empty()) bytes[digits[pick(digits.size())]] = static_cast<char>('0' + pick(10));
      break;
    }
    case 7: {  // all-ones bytes in the data section: NaN in every float format
      if (header_end + 4 > bytes.size()) break;
      const size_t at = header_end + pick(bytes.size() - header_end - 3);
      std::memset(bytes.data() + at, 0xff, 4);
      break;
    }
  }
}

}  // namespace

TEST_CASE("safetensors survives seeded random mutations", "[safetensors][fuzz]") {
  const fs::path dir =
      fs::temp_directory_path() / ("infill_test_safetensors_fuzz_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string original_path = (dir / "original.safetensors").string();
  REQUIRE(infill::write_safetensors(original_path,
                                    {{"a.weight", at::linspace(-1, 1, 12).reshape({3, 4})},
                                     {"b.half", at::linspace(0, 2, 6).to(at::kHalf)},
                                     {"c.bf16", at::linspace(-4, 4, 5).to(at::kBFloat16)}},
                                    {{"format", "pt"}})
              .ok());
  const std::string original = read_all(original_path);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, original.data(), 8);

  constexpr int kCases = 400;
  int opened = 0;
  int rejected = 0;
  int tensors_loaded = 0;
  int tensors_rejected = 0;
  std::mt19937_64 rng(20240611);
  const std::string path = (dir / "mutated.safetensors").string();
  for (int i = 0; i < kCases; ++i) {
    std::string bytes = original;
    const int mutations = 1 + static_cast<int>(rng() % 3);
    for (int m = 0; m < mutations; ++m) mutate(bytes, 8 + header_bytes, rng);
    write_all(path, bytes);

    INFO("case " << i << ", " << bytes.size() << " bytes");
    auto file = infill::SafetensorsFile::open(path);
    if (!file.ok()) {
      ++rejected;
      REQUIRE(file.status().code() != infill::ErrorCode::kOk);
      REQUIRE_FALSE(file.status().message().empty());
      continue;
    }
    ++opened;
    for (const infill::TensorInfo& info : file->tensors()) {
      // Every accepted tensor lies inside the file.
      REQUIRE(info.begin <= info.end);
      REQUIRE(info.end <= bytes.size());
      REQUIRE(file->bytes(info).size() ==
              static_cast<size_t>(info.numel()) * infill::dtype_size(info.dtype));
      auto t = infill::load_float_tensor(*file, info.name);
      if (t.ok()) {
        ++tensors_loaded;
        REQUIRE(t->numel() == info.numel());
        REQUIRE(at::isfinite(*t).all().item<bool>());
      } else {
        ++tensors_rejected;
        REQUIRE(t.status().code() != infill::ErrorCode::kOk);
        REQUIRE_FALSE(t.status().message().empty());
      }
    }
  }
  infill::remove_tree(dir.string());

  WARN("fuzz: " << kCases << " mutated files, " << opened << " opened, " << rejected
                << " rejected; " << tensors_loaded << " tensors loaded, " << tensors_rejected
                << " rejected at load");
  // The mutations must exercise both paths, or the test proves little.
  CHECK(opened >= kCases / 20);
  CHECK(rejected >= kCases / 2);
  CHECK(tensors_rejected > 0);
}
