#include "support/catch.h"
#include "support/temp_dir.h"
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include <ATen/ATen.h>

#include "model/safetensors.h"
#include "model/safetensors_torch.h"

using infill::test::TempDir;

namespace fs = std::filesystem;
using infill::ErrorCode;
using infill::SafetensorsFile;

namespace {


/// Writes a file by hand: 8-byte length (the header's, unless overridden), header, data.
std::string write_raw(const TempDir& dir, const std::string& header, const std::string& data = "",
                      std::optional<uint64_t> header_length = std::nullopt) {
  static int counter = 0;
  const std::string path = dir.file("raw" + std::to_string(counter++) + ".safetensors");
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = header_length.value_or(header.size());
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
  return path;
}

/// Opens a hand-written file that must be rejected; returns its Status.
infill::Status open_status(const TempDir& dir, const std::string& header,
                           const std::string& data = "") {
  auto file = SafetensorsFile::open(write_raw(dir, header, data));
  REQUIRE_FALSE(file.ok());
  return file.status();
}

void require_error(const infill::Status& s, ErrorCode code, const std::string& substring) {
  INFO(s.to_string());
  REQUIRE(s.code() == code);
  REQUIRE_THAT(s.message(), Catch::Matchers::Contains(substring));
}

std::string bytes_of(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

}  // namespace

TEST_CASE("safetensors round trip keeps dtype, shape, values, order and metadata",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("rt.safetensors");
  // Values exactly representable in each dtype, so the comparison is exact.
  const at::Tensor f32 = at::linspace(-3.5, 7.25, 24).reshape({2, 3, 4});
  const at::Tensor f16 = (at::arange(0, 15, at::kFloat) * 0.125 - 1).reshape({3, 5}).to(at::kHalf);
  const at::Tensor bf16 = (at::arange(0, 8, at::kFloat) * -0.75 + 3).to(at::kBFloat16);
  const at::Tensor scalar = at::full({}, 42.5f);
  const at::Tensor empty = at::zeros({0, 4});
  // A strided view: the writer must store the logical (contiguous) order.
  const at::Tensor transposed = at::arange(0, 6, at::kFloat).reshape({2, 3}).t();
  REQUIRE(infill::write_safetensors(path,
                                    {{"zeta.f32", f32},
                                     {"alpha.f16", f16},
                                     {"mid.bf16", bf16},
                                     {"scalar", scalar},
                                     {"empty", empty},
                                     {"transposed", transposed}},
                                    {{"format", "pt"}, {"note", "ünïcode"}})
              .ok());

  auto file = SafetensorsFile::open(path);
  REQUIRE(file.ok());
  const auto& tensors = file->tensors();
  REQUIRE(tensors.size() == 6);
  // Header order is the caller's order, not alphabetical.
  CHECK(tensors[0].name == "zeta.f32");
  CHECK(tensors[1].name == "alpha.f16");
  CHECK(tensors[2].name == "mid.bf16");
  CHECK(tensors[0].dtype == infill::DType::kF32);
  CHECK(tensors[1].dtype == infill::DType::kF16);
  CHECK(tensors[2].dtype == infill::DType::kBF16);
  CHECK(tensors[1].shape == std::vector<int64_t>{3, 5});
  CHECK(tensors[3].shape.empty());
  CHECK(tensors[3].numel() == 1);
  CHECK(file->metadata().at("format") == "pt");
  CHECK(file->metadata().at("note") == "ünïcode");
  CHECK(file->find("nope") == nullptr);

  // The header is padded so that the data section starts 8-byte aligned.
  std::ifstream in(path, std::ios::binary);
  uint64_t header_bytes = 0;
  in.read(reinterpret_cast<char*>(&header_bytes), 8);
  CHECK(header_bytes % 8 == 0);

  // Raw bytes of the F16 tensor are the tensor's own half-precision bits.
  const auto raw = file->bytes(*file->find("alpha.f16"));
  REQUIRE(raw.size() == 30);
  CHECK(std::memcmp(raw.data(), f16.data_ptr(), raw.size()) == 0);

  auto loaded_f32 = infill::load_float_tensor(*file, "zeta.f32", {2, 3, 4});
  auto loaded_f16 = infill::load_float_tensor(*file, "alpha.f16");
  auto loaded_bf16 = infill::load_float_tensor(*file, "mid.bf16", {8});
  auto loaded_scalar = infill::load_float_tensor(*file, "scalar");
  auto loaded_empty = infill::load_float_tensor(*file, "empty", {0, 4});
  auto loaded_t = infill::load_float_tensor(*file, "transposed", {3, 2});
  REQUIRE(loaded_f32.ok());
  REQUIRE(loaded_f16.ok());
  REQUIRE(loaded_bf16.ok());
  REQUIRE(loaded_scalar.ok());
  REQUIRE(loaded_empty.ok());
  REQUIRE(loaded_t.ok());
  for (const at::Tensor* t : {&*loaded_f32, &*loaded_f16, &*loaded_bf16}) {
    CHECK(t->scalar_type() == at::kFloat);
    CHECK(t->is_contiguous());
  }
  CHECK(at::equal(*loaded_f32, f32));
  CHECK(at::equal(*loaded_f16, f16.to(at::kFloat)));
  CHECK(at::equal(*loaded_bf16, bf16.to(at::kFloat)));
  // Hand-checked values, independent of torch's own conversion.
  CHECK(loaded_f16->index({0, 1}).item<float>() == -0.875f);
  CHECK(loaded_bf16->index({7}).item<float>() == -2.25f);
  CHECK(loaded_scalar->dim() == 0);
  CHECK(loaded_scalar->item<float>() == 42.5f);
  CHECK(loaded_empty->sizes() == at::IntArrayRef({0, 4}));
  CHECK(at::equal(*loaded_t, transposed));

  // No temporary file is left beside the result.
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    (void)entry;
    ++files;
  }
  CHECK(files == 1);
}

TEST_CASE("safetensors reads unaligned data sections", "[safetensors]") {
  TempDir dir;
  // A 61-byte header puts the data section at file offset 69, not aligned for float.
  const std::vector<float> values = {1.5f, -2.25f, 1e-3f};
  std::string header = R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})";
  header.append(61 - header.size(), ' ');
  REQUIRE((8 + header.size()) % 4 != 0);
  const std::string path = write_raw(dir, header, bytes_of(values));
  auto file = SafetensorsFile::open(path);
  REQUIRE(file.ok());
  auto w = infill::load_float_tensor(*file, "w");
  REQUIRE(w.ok());
  CHECK(w->index({0}).item<float>() == 1.5f);
  CHECK(w->index({1}).item<float>() == -2.25f);
  CHECK(w->index({2}).item<float>() == 1e-3f);
}

TEST_CASE("safetensors rejects malformed files with specific messages", "[safetensors]") {
  TempDir dir;
  const std::string d12(12, '\0');
  const auto tensor = [](const std::string& name, const std::string& body) {
    return "\"" + name + "\":{" + body + "}";
  };

  SECTION("missing file") {
    auto f = SafetensorsFile::open(dir.file("absent.safetensors"));
    require_error(f.status(), ErrorCode::kNotFound, "absent.safetensors");
  }
  SECTION("shorter than 8 bytes") {
    const std::string path = dir.file("short.safetensors");
    std::ofstream(path, std::ios::binary) << "abc";
    auto f = SafetensorsFile::open(path);
    require_error(f.status(), ErrorCode::kCorruptData, "file is 3 bytes");
    CHECK_THAT(f.status().message(), Catch::Matchers::Contains("short.safetensors"));
  }
  SECTION("header length past the end of the file") {
    auto f = SafetensorsFile::open(write_raw(dir, "{}", "", 1000));
    require_error(f.status(), ErrorCode::kCorruptData, "header length 1000 runs past the end");
  }
  SECTION("absurdly large header length") {
    auto f = SafetensorsFile::open(write_raw(dir, "{}", "", std::numeric_limits<uint64_t>::max()));
    require_error(f.status(), ErrorCode::kCorruptData, "absurdly large");
  }
  SECTION("invalid JSON") {
    require_error(open_status(dir, "{\"a\": [1, "), ErrorCode::kCorruptData, "not valid JSON");
  }
  SECTION("empty header") {
    require_error(open_status(dir, ""), ErrorCode::kCorruptData, "not valid JSON");
  }
  SECTION("header not an object") {
    require_error(open_status(dir, "[1, 2]"), ErrorCode::kCorruptData,
                  "header is a JSON array, expected an object");
  }
  SECTION("entry not an object") {
    require_error(open_status(dir, R"({"w": 3})"), ErrorCode::kCorruptData,
                  "tensor 'w' is a number, expected an object");
  }
  SECTION("missing dtype") {
    require_error(
        open_status(dir, "{" + tensor("w", R"("shape":[3],"data_offsets":[0,12])") + "}", d12),
        ErrorCode::kCorruptData, "tensor 'w' has no dtype");
  }
  SECTION("missing shape") {
    require_error(
        open_status(dir, "{" + tensor("w", R"("dtype":"F32","data_offsets":[0,12])") + "}", d12),
        ErrorCode::kCorruptData, "tensor 'w' has no shape");
  }
  SECTION("missing data_offsets") {
    require_error(open_status(dir, "{" + tensor("w", R"("dtype":"F32","shape":[3])") + "}", d12),
                  ErrorCode::kCorruptData, "tensor 'w' has no data_offsets");
  }
  SECTION("dtype of the wrong type") {
    require_error(
        open_status(dir, "{" + tensor("w", R"("dtype":4,"shape":[3],"data_offsets":[0,12])") + "}",
                    d12),
        ErrorCode::kCorruptData, "dtype is a number, expected a string");
  }
  SECTION("shape of the wrong type") {
    require_error(
        open_status(dir,
                    "{" + tensor("w", R"("dtype":"F32","shape":"3","data_offsets":[0,12])") + "}",
                    d12),
        ErrorCode::kCorruptData, "shape is a string, expected an array");
  }
  SECTION("fractional dim") {
    require_error(
        open_status(dir,
                    "{" + tensor("w", R"("dtype":"F32","shape":[1.5],"data_offsets":[0,12])") + "}",
                    d12),
        ErrorCode::kCorruptData, "shape[0] is a number, expected an integer");
  }
  SECTION("data_offsets of the wrong arity") {
    require_error(
        open_status(
            dir, "{" + tensor("w", R"("dtype":"F32","shape":[3],"data_offsets":[12])") + "}", d12),
        ErrorCode::kCorruptData, "data_offsets is [12], expected [begin, end]");
  }
  SECTION("unknown dtype") {
    require_error(
        open_status(
            dir, "{" + tensor("w", R"("dtype":"F4","shape":[3],"data_offsets":[0,12])") + "}",
            d12),
        ErrorCode::kCorruptData, "tensor 'w': unknown dtype 'F4'");
  }
  SECTION("negative dim") {
    require_error(
        open_status(
            dir, "{" + tensor("w", R"("dtype":"F32","shape":[3,-1],"data_offsets":[0,12])") + "}",
            d12),
        ErrorCode::kCorruptData, "tensor 'w': shape[1] is negative (-1)");
  }
  SECTION("huge dims do not wrap around") {
    // 2^32 * 2^32 * 4 bytes wraps a uint64 to 0; the reader must not accept it as empty.
    require_error(
        open_status(dir, "{" +
                             tensor("w", R"("dtype":"F32","shape":[4294967296,4294967296],)"
                                         R"("data_offsets":[0,0])") +
                             "}"),
        ErrorCode::kCorruptData, "is too large");
  }
  SECTION("begin after end") {
    require_error(
        open_status(
            dir, "{" + tensor("w", R"("dtype":"F32","shape":[0],"data_offsets":[8,4])") + "}", d12),
        ErrorCode::kCorruptData, "tensor 'w': data_offsets begin 8 is after end 4");
  }
  SECTION("end past the data section") {
    require_error(
        open_status(dir,
                    "{" + tensor("w", R"("dtype":"F32","shape":[4],"data_offsets":[0,16])") + "}",
                    d12),
        ErrorCode::kCorruptData, "tensor 'w': data ends at 16, past the data section of 12 bytes");
  }
  SECTION("byte size does not match the shape") {
    require_error(
        open_status(dir,
                    "{" + tensor("w", R"("dtype":"F16","shape":[2,3],"data_offsets":[0,8])") + "}",
                    d12),
        ErrorCode::kCorruptData, "tensor 'w' holds 8 bytes, expected 12 for F16 [2,3]");
  }
  SECTION("overlapping tensors") {
    require_error(
        open_status(dir,
                    "{" + tensor("a", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])") + "," +
                        tensor("b", R"("dtype":"F32","shape":[1],"data_offsets":[4,8])") + "}",
                    d12),
        ErrorCode::kCorruptData, "tensor 'b' [4, 8) overlaps tensor 'a' [0, 8)");
  }
  SECTION("duplicate names") {
    require_error(
        open_status(dir,
                    "{" + tensor("a", R"("dtype":"F32","shape":[1],"data_offsets":[0,4])") + "," +
                        tensor("a", R"("dtype":"F32","shape":[1],"data_offsets":[4,8])") + "}",
                    d12),
        ErrorCode::kCorruptData, "tensor 'a' appears twice");
  }
  SECTION("metadata with a non-string value") {
    require_error(open_status(dir, R"({"__metadata__":{"format":"pt","epoch":3}})"),
                  ErrorCode::kCorruptData, "__metadata__['epoch'] is a number, expected a string");
  }
  SECTION("metadata not an object") {
    require_error(open_status(dir, R"({"__metadata__":"pt"})"), ErrorCode::kCorruptData,
                  "__metadata__ is a string");
  }
}

TEST_CASE("load_float_tensor checks name, dtype, shape and finiteness", "[safetensors]") {
  TempDir dir;
  std::vector<float> with_nan(6, 1.0f);
  with_nan[5] = std::numeric_limits<float>::quiet_NaN();
  const uint16_t half_inf = 0x7c00;  // +Inf in IEEE half precision
  std::string data = bytes_of({1, 2, 3, 4, 5, 6}) + bytes_of(with_nan);
  data.append(2, '\0');  // half 0.0
  data.append(reinterpret_cast<const char*>(&half_inf), 2);
  data.append(8, '\0');  // I32 [2]
  const std::string header =
      R"({"blocks.3.attn.qkv.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("nan":{"dtype":"F32","shape":[2,3],"data_offsets":[24,48]},)"
      R"("inf":{"dtype":"F16","shape":[2],"data_offsets":[48,52]},)"
      R"("ints":{"dtype":"I32","shape":[2],"data_offsets":[52,60]}})";
  auto file = SafetensorsFile::open(write_raw(dir, header, data));
  REQUIRE(file.ok());

  auto good = infill::load_float_tensor(*file, "blocks.3.attn.qkv.weight", {2, 3});
  REQUIRE(good.ok());
  CHECK(good->index({1, 2}).item<float>() == 6.0f);

  require_error(infill::load_float_tensor(*file, "blocks.3.attn.qkv.weight", {2, 4}).status(),
                ErrorCode::kInvalidArgument, "blocks.3.attn.qkv.weight is [2, 3], expected [2, 4]");
  require_error(infill::load_float_tensor(*file, "missing").status(), ErrorCode::kNotFound,
                "no tensor 'missing'");
  require_error(infill::load_float_tensor(*file, "ints").status(), ErrorCode::kInvalidArgument,
                "ints is I32, expected F32, F16 or BF16");
  require_error(infill::load_float_tensor(*file, "nan").status(), ErrorCode::kCorruptData,
                "nan has a non-finite value (nan) at flat index 5");
  require_error(infill::load_float_tensor(*file, "inf").status(), ErrorCode::kCorruptData,
                "inf has a non-finite value (inf) at flat index 1");
}

TEST_CASE("write_safetensors rejects bad input and reports I/O failures", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  require_error(infill::write_safetensors(path, {{"i", at::arange(3, at::kLong)}}),
                ErrorCode::kInvalidArgument, "tensor 'i' is Long, expected float32");
  require_error(infill::write_safetensors(path, {{"a", at::ones({1})}, {"a", at::ones({1})}}),
                ErrorCode::kInvalidArgument, "tensor 'a' is given twice");
  require_error(infill::write_safetensors(path, {{"__metadata__", at::ones({1})}}),
                ErrorCode::kInvalidArgument, "reserved");
  require_error(infill::write_safetensors(path, {{"bad\xff", at::ones({1})}}),
                ErrorCode::kInvalidArgument, "cannot be written as JSON");
  CHECK_FALSE(fs::exists(path));
  require_error(
      infill::write_safetensors(dir.file("no/such/dir/w.safetensors"), {{"a", at::ones({1})}}),
      ErrorCode::kIoError, "cannot create temporary file");

  // Overwriting replaces the previous content whole.
  REQUIRE(infill::write_safetensors(path, {{"a", at::ones({4})}}).ok());
  REQUIRE(infill::write_safetensors(path, {{"b", at::zeros({2})}}).ok());
  auto file = SafetensorsFile::open(path);
  REQUIRE(file.ok());
  REQUIRE(file->tensors().size() == 1);
  CHECK(file->tensors()[0].name == "b");
}

TEST_CASE("safetensors mapping outlives the first handle", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  REQUIRE(infill::write_safetensors(path, {{"w", at::arange(0, 16, at::kFloat)}}).ok());
  std::optional<SafetensorsFile> copy;
  {
    auto file = SafetensorsFile::open(path);
    REQUIRE(file.ok());
    copy = *file;
  }
  // The file may even be deleted: the mapping keeps the data alive.
  fs::remove(path);
  auto w = infill::load_float_tensor(*copy, "w", {16});
  REQUIRE(w.ok());
  CHECK(w->index({15}).item<float>() == 15.0f);
}
