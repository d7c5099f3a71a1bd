#include "png_text.h"

#include <cstdint>
#include <cstring>
#include <fstream>

#include <zlib.h>

namespace infill::render {
namespace {

constexpr unsigned char kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

uint32_t be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

void put_be32(std::vector<unsigned char>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<unsigned char>(v >> s));
}

bool printable_latin1(const std::string& s, bool allow_newline) {
  for (unsigned char ch : s) {
    if (ch == 0) return false;
    if (ch < 32 && !(allow_newline && ch == '\n')) return false;
    if (ch >= 127 && ch < 161) return false;
  }
  return true;
}

}  // namespace

Result<std::vector<std::byte>> add_png_text(const std::vector<std::byte>& png,
                                            const std::vector<std::pair<std::string, std::string>>& texts) {
  const auto* p = reinterpret_cast<const unsigned char*>(png.data());
  // Signature, then IHDR: length 13, type, data, CRC = 25 bytes.
  constexpr size_t kAfterIhdr = 8 + 4 + 4 + 13 + 4;
  if (png.size() < kAfterIhdr || std::memcmp(p, kSignature, 8) != 0 || std::memcmp(p + 12, "IHDR", 4) != 0 ||
      be32(p + 8) != 13)
    return invalid_argument("add_png_text: the data is not a PNG (signature or IHDR missing)");
  std::vector<unsigned char> chunks;
  for (const auto& [keyword, text] : texts) {
    if (keyword.empty() || keyword.size() > 79 || !printable_latin1(keyword, false) || keyword.front() == ' ' ||
        keyword.back() == ' ')
      return invalid_argument("add_png_text: keyword \"" + keyword + "\" is not 1-79 printable Latin-1 characters");
    if (!printable_latin1(text, true)) return invalid_argument("add_png_text: text of " + keyword + " is not Latin-1");
    std::vector<unsigned char> body = {'t', 'E', 'X', 't'};
    body.insert(body.end(), keyword.begin(), keyword.end());
    body.push_back(0);
    body.insert(body.end(), text.begin(), text.end());
    put_be32(chunks, static_cast<uint32_t>(body.size() - 4));
    chunks.insert(chunks.end(), body.begin(), body.end());
    put_be32(chunks, static_cast<uint32_t>(::crc32(0L, body.data(), static_cast<uInt>(body.size()))));
  }
  std::vector<std::byte> out;
  out.reserve(png.size() + chunks.size());
  out.insert(out.end(), png.begin(), png.begin() + kAfterIhdr);
  for (unsigned char ch : chunks) out.push_back(static_cast<std::byte>(ch));
  out.insert(out.end(), png.begin() + kAfterIhdr, png.end());
  return out;
}

std::optional<std::string> read_png_text(const std::string& path, const std::string& keyword) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  unsigned char sig[8];
  if (!in.read(reinterpret_cast<char*>(sig), 8) || std::memcmp(sig, kSignature, 8) != 0) return std::nullopt;
  for (int chunk = 0; chunk < 1000; ++chunk) {
    unsigned char head[8];
    if (!in.read(reinterpret_cast<char*>(head), 8)) return std::nullopt;
    const uint32_t length = be32(head);
    const std::string type(reinterpret_cast<const char*>(head + 4), 4);
    if (type == "IDAT" || type == "IEND" || length > (1u << 24)) return std::nullopt;
    if (type == "tEXt") {
      std::string body(length, '\0');
      if (!in.read(body.data(), length)) return std::nullopt;
      const size_t nul = body.find('\0');
      if (nul != std::string::npos && body.compare(0, nul, keyword) == 0 && nul == keyword.size())
        return body.substr(nul + 1);
      in.seekg(4, std::ios::cur);  // CRC
    } else {
      in.seekg(static_cast<std::streamoff>(length) + 4, std::ios::cur);
    }
  }
  return std::nullopt;
}

}  // namespace infill::render
