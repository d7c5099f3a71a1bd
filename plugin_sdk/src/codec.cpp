#include "codec.h"

#include <algorithm>
#include <array>

#include <zlib.h>

namespace infill::sdk {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void put_u32(std::string& out, uint32_t v) {
  out.push_back(static_cast<char>(v >> 24));
  out.push_back(static_cast<char>(v >> 16));
  out.push_back(static_cast<char>(v >> 8));
  out.push_back(static_cast<char>(v));
}

void put_chunk(std::string& out, const char* type, const std::string& data) {
  put_u32(out, static_cast<uint32_t>(data.size()));
  std::string body(type, 4);
  body += data;
  out += body;
  put_u32(out, static_cast<uint32_t>(::crc32(0L, reinterpret_cast<const Bytef*>(body.data()), static_cast<uInt>(body.size()))));
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8) | uint8_t(bytes[i + 2]);
    out += {kAlphabet[v >> 18], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], kAlphabet[v & 63]};
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = uint32_t(uint8_t(bytes[i])) << 16;
    out += {kAlphabet[v >> 18], kAlphabet[(v >> 12) & 63], '=', '='};
  } else if (i + 2 == bytes.size()) {
    const uint32_t v = (uint32_t(uint8_t(bytes[i])) << 16) | (uint32_t(uint8_t(bytes[i + 1])) << 8);
    out += {kAlphabet[v >> 18], kAlphabet[(v >> 12) & 63], kAlphabet[(v >> 6) & 63], '='};
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  static const std::array<int8_t, 256> value = [] {
    std::array<int8_t, 256> v{};
    v.fill(-1);
    for (int i = 0; i < 64; ++i) v[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int8_t>(i);
    return v;
  }();
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  size_t padding = 0;
  for (char ch : text) {
    if (ch == '=') {
      ++padding;
      continue;
    }
    if (ch == '\n' || ch == '\r') continue;
    const int8_t v = value[static_cast<unsigned char>(ch)];
    if (v < 0 || padding > 0) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  if (padding > 2) return std::nullopt;
  return out;
}

std::string encode_grey_png(const uint8_t* pixels, uint32_t width, uint32_t height, size_t stride) {
  // Raw scanlines: a filter byte (0 = none) and the row.
  std::string raw;
  raw.reserve((size_t(width) + 1) * height);
  for (uint32_t y = 0; y < height; ++y) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(pixels + y * stride), width);
  }
  // Deflated by zlib: a mask is mostly runs of 0 and 255, which shrink a hundredfold or more,
  // so a 4K mask is a few kB on the wire instead of 8 MB. Level 6 costs a few ms for 4K.
  uLongf size = compressBound(static_cast<uLong>(raw.size()));
  std::string z(size, '\0');
  const int rc = compress2(reinterpret_cast<Bytef*>(z.data()), &size, reinterpret_cast<const Bytef*>(raw.data()),
                           static_cast<uLong>(raw.size()), 6);
  if (rc != Z_OK) return {};  // only Z_MEM_ERROR is possible with a compressBound buffer
  z.resize(size);

  std::string png = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  put_u32(ihdr, width);
  put_u32(ihdr, height);
  ihdr += {'\x08', '\x00', '\x00', '\x00', '\x00'};  // 8-bit grey, deflate, filter 0, no interlace
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", z);
  put_chunk(png, "IEND", "");
  return png;
}

}  // namespace infill::sdk
