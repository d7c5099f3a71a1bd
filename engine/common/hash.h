#pragma once
/// Content hashes: template ids, cache keys and checksums of disk entries.
/// All functions are pure and thread-safe.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace infill {

/// 64-bit FNV-1a: cheap keys for in-memory maps and file names (not for integrity).
uint64_t fnv1a64(std::string_view bytes);
uint64_t fnv1a64(std::span<const std::byte> bytes, uint64_t seed = 14695981039346656037ull);

/// SHA-256 of `bytes` as 64 lower-case hex digits: the template id.
std::string sha256_hex(std::span<const std::byte> bytes);

/// 16 lower-case hex digits.
std::string hex64(uint64_t value);

/// XXH64 (xxHash, 64-bit variant, bit-compatible with the reference implementation):
/// a fast checksum (several GB/s, 32 bytes per round) for detecting corrupt or truncated
/// disk entries. Not cryptographic: it detects accidents, not tampering.
uint64_t xxh64(std::span<const std::byte> bytes, uint64_t seed = 0);
inline uint64_t xxh64(std::string_view bytes, uint64_t seed = 0) {
  return xxh64(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())), seed);
}

}  // namespace infill
