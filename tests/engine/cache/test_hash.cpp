
#include "support/catch.h"
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/hash.h"

using namespace infill;

namespace {

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

// 0, 1, 2, ... (mod 256): the pattern the padding-boundary vectors below were computed on.
std::string counting_bytes(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i & 0xff);
  return s;
}

}  // namespace

TEST_CASE("sha256_hex matches the FIPS 180-2 test vectors", "[hash]") {
  CHECK(sha256_hex(bytes_of("")) ==
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex(bytes_of("abc")) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex(bytes_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")) ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha256_hex(bytes_of(std::string(1000000, 'a'))) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Lengths around the 55/56/64-byte padding boundaries, where a one- or two-block tail is
// chosen; expected values from Python's hashlib.sha256 on the same bytes.
TEST_CASE("sha256_hex handles the padding boundaries", "[hash]") {
  const std::vector<std::pair<size_t, std::string>> cases = {
      {55, "463eb28e72f82e0a96c0a4cc53690c571281131f672aa229e0d45ae59b598b59"},
      {56, "da2ae4d6b36748f2a318f23e7ab1dfdf45acdc9d049bd80e59de82a60895f562"},
      {63, "29af2686fd53374a36b0846694cc342177e428d1647515f078784d69cdb9e488"},
      {64, "fdeab9acf3710362bd2658cdc9a29e8f9c757fcf9811603a8c447cd1d9151108"},
      {119, "da18797ed7c3a777f0847f429724a2d8cd5138e6ed2895c3fa1a6d39d18f7ec6"},
      {120, "f52b23db1fbb6ded89ef42a23ce0c8922c45f25c50b568a93bf1c075420bbb7c"},
  };
  for (const auto& [n, expected] : cases) {
    INFO("length " << n);
    CHECK(sha256_hex(bytes_of(counting_bytes(n))) == expected);
  }
}

// Reference values of the FNV-1a 64 specification (offset basis 0xcbf29ce484222325).
TEST_CASE("fnv1a64 matches the published test vectors", "[hash]") {
  CHECK(fnv1a64(std::string_view("")) == 0xcbf29ce484222325ull);
  CHECK(fnv1a64(std::string_view("a")) == 0xaf63dc4c8601ec8cull);
  CHECK(fnv1a64(std::string_view("foobar")) == 0x85944171f73967e8ull);
  // The span overload with the default seed agrees with the string overload, and chaining
  // through `seed` equals hashing the concatenation.
  const std::string foo = "foo", bar = "bar";
  CHECK(fnv1a64(bytes_of("foobar")) == fnv1a64(std::string_view("foobar")));
  CHECK(fnv1a64(bytes_of(bar), fnv1a64(bytes_of(foo))) == 0x85944171f73967e8ull);
}

TEST_CASE("hex64 prints 16 lower-case digits", "[hash]") {
  CHECK(hex64(0) == "0000000000000000");
  CHECK(hex64(0xcbf29ce484222325ull) == "cbf29ce484222325");
  CHECK(hex64(0xFFFFFFFFFFFFFFFFull) == "ffffffffffffffff");
  CHECK(hex64(0x1ull) == "0000000000000001");
}

// XXH64 references: python-xxhash's documentation (short inputs) and the zstd frame checksum,
// which is the low 32 bits of XXH64(content, 0), for inputs over 32 bytes
// (`zstd --check` on the same bytes; last 4 bytes of the frame, little-endian).
TEST_CASE("xxh64 matches the reference implementation", "[hash]") {
  CHECK(xxh64(std::string_view("")) == 0xef46db3751d8e999ull);
  CHECK(xxh64(std::string_view("abc")) == 0x44bc2cf5ad770999ull);
  CHECK(xxh64(std::string_view("xxhash")) == 0x32dd38952c4bc720ull);
  CHECK(xxh64(std::string_view("xxhash"), 20141025) == 0xb559b98d844e0635ull);
  CHECK(xxh64(std::string_view("I want an unsigned 64-bit seed!"), 0) == 0xd4cb0a70a2b8c7c1ull);
  CHECK(xxh64(std::string_view("I want an unsigned 64-bit seed!"), 1) == 0xce5087f12470d961ull);
  // 39 bytes: one 32-byte stripe, then an 8-byte lane... and the tail.
  CHECK(xxh64(std::string_view("Nobody inspects the spammish repetition")) == 0xfbcea83c8a378bf1ull);
  std::string pattern(1000, '\0');
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<char>((i * 31 + 7) & 0xff);
  CHECK((xxh64(std::string_view(pattern)) & 0xffffffffull) == 0x28043d35ull);
}

TEST_CASE("xxh64 detects every single-bit flip of a buffer", "[hash]") {
  std::string data = counting_bytes(257);
  const uint64_t clean = xxh64(std::string_view(data));
  for (size_t i = 0; i < data.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      data[i] = static_cast<char>(data[i] ^ (1 << bit));
      REQUIRE(xxh64(std::string_view(data)) != clean);
      data[i] = static_cast<char>(data[i] ^ (1 << bit));
    }
  }
}
