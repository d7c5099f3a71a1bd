#include "cache/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <system_error>
#include <vector>

#include "common/hash.h"

namespace infill {

static_assert(std::endian::native == std::endian::little,
              "the .iact format is little-endian; add byte swapping for big-endian hosts");

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'I', 'N', 'F', 'L', 'A', 'C', 'T', '\x1a'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kFixedHeaderBytes = 64;
constexpr size_t kMaxKeyBytes = 1 << 16;
constexpr uint64_t kMaxSlabs = 1 << 24;
constexpr const char* kSuffix = ".iact";
constexpr const char* kTempMarker = ".tmp-";

struct FixedHeader {
  char magic[8];
  uint32_t version;
  uint32_t key_bytes;
  int32_t steps, blocks, tokens, hidden;
  uint64_t header_bytes;
  uint64_t slab_bytes;
  uint64_t file_bytes;
  uint64_t reserved;
};
static_assert(sizeof(FixedHeader) == kFixedHeaderBytes);

size_t header_bytes_for(size_t key_bytes, size_t slabs) {
  const size_t raw = kFixedHeaderBytes + key_bytes + 16 * slabs + 8;
  return (raw + 63) / 64 * 64;
}

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Reads exactly `n` bytes at `offset`; false on a short read (a truncated file) or an error.
bool pread_all(int fd, void* out, size_t n, uint64_t offset) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return true;
}

bool write_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

uint64_t checksum(const void* data, size_t n) {
  return xxh64(std::span<const std::byte>(static_cast<const std::byte*>(data), n));
}

struct ParsedHeader {
  ActivationLayout layout;
  std::string canonical;
  std::vector<uint64_t> half_checksums;  // K and V of each slab, (step, block, kv) order
  uint64_t header_bytes = 0;
  uint64_t slab_bytes = 0;
  uint64_t file_bytes = 0;
};

// Reads and verifies the header of the open file `fd` whose size is `actual_bytes`.
// `expected_canonical`, if given, must match the stored key exactly.
Result<ParsedHeader> read_header(int fd, uint64_t actual_bytes, const std::string& path,
                                 const std::string* expected_canonical) {
  FixedHeader fixed{};
  if (actual_bytes < kFixedHeaderBytes || !pread_all(fd, &fixed, sizeof fixed, 0)) {
    return corrupt_data(path + ": " + std::to_string(actual_bytes) +
                        " bytes; expected at least a 64-byte header");
  }
  if (std::memcmp(fixed.magic, kMagic, sizeof kMagic) != 0) {
    return corrupt_data(path + ": bad magic; expected an Infill activation file (.iact)");
  }
  if (fixed.version != kFormatVersion) {
    return corrupt_data(path + ": format version " + std::to_string(fixed.version) +
                        "; expected " + std::to_string(kFormatVersion));
  }
  if (fixed.key_bytes == 0 || fixed.key_bytes > kMaxKeyBytes) {
    return corrupt_data(path + ": key length " + std::to_string(fixed.key_bytes) +
                        "; expected 1.." + std::to_string(kMaxKeyBytes));
  }
  if (fixed.steps <= 0 || fixed.blocks <= 0 || fixed.tokens <= 0 || fixed.hidden <= 0) {
    return corrupt_data(path + ": layout " + std::to_string(fixed.steps) + "x" +
                        std::to_string(fixed.blocks) + "x" + std::to_string(fixed.tokens) + "x" +
                        std::to_string(fixed.hidden) + "; expected positive sizes");
  }
  ParsedHeader h;
  h.layout = ActivationLayout{fixed.steps, fixed.blocks, fixed.tokens, fixed.hidden};
  // Each factor is below 2^31, so these products fit in 64 bits before the sanity limits.
  const uint64_t slabs = static_cast<uint64_t>(fixed.steps) * static_cast<uint64_t>(fixed.blocks);
  const uint64_t slab_bytes =
      static_cast<uint64_t>(fixed.tokens) * static_cast<uint64_t>(fixed.hidden) * 2 * 2;
  if (slabs > kMaxSlabs || slab_bytes > (uint64_t{1} << 40) ||
      fixed.slab_bytes != slab_bytes ||
      fixed.header_bytes != header_bytes_for(fixed.key_bytes, slabs) ||
      slab_bytes > (UINT64_MAX - fixed.header_bytes) / slabs ||
      fixed.file_bytes != fixed.header_bytes + slabs * slab_bytes) {
    return corrupt_data(path + ": header sizes are inconsistent with layout " +
                        std::to_string(fixed.steps) + "x" + std::to_string(fixed.blocks) + "x" +
                        std::to_string(fixed.tokens) + "x" + std::to_string(fixed.hidden));
  }
  if (actual_bytes != fixed.file_bytes) {
    return corrupt_data(path + ": " + std::to_string(actual_bytes) + " bytes; header expects " +
                        std::to_string(fixed.file_bytes) + " (truncated or extended file)");
  }
  std::vector<char> header(fixed.header_bytes);
  if (!pread_all(fd, header.data(), header.size(), 0)) {
    return corrupt_data(path + ": short read of the " + std::to_string(header.size()) +
                        "-byte header");
  }
  uint64_t stored = 0;
  std::memcpy(&stored, header.data() + header.size() - 8, 8);
  if (checksum(header.data(), header.size() - 8) != stored) {
    return corrupt_data(path + ": header checksum mismatch");
  }
  h.canonical.assign(header.data() + kFixedHeaderBytes, fixed.key_bytes);
  if (expected_canonical != nullptr && h.canonical != *expected_canonical) {
    return corrupt_data(path + ": holds key '" + h.canonical + "'; expected '" +
                        *expected_canonical + "'");
  }
  h.half_checksums.resize(2 * slabs);
  std::memcpy(h.half_checksums.data(), header.data() + kFixedHeaderBytes + fixed.key_bytes,
              slabs * 16);
  h.header_bytes = fixed.header_bytes;
  h.slab_bytes = slab_bytes;
  h.file_bytes = fixed.file_bytes;
  return h;
}

std::vector<char> build_header(const std::string& canonical, const ActivationEntry& entry) {
  const ActivationLayout& layout = entry.layout();
  const size_t slabs = static_cast<size_t>(layout.steps) * layout.blocks;
  const size_t slab_bytes = layout.slab_elements() * 2 * sizeof(uint16_t);
  FixedHeader fixed{};
  std::memcpy(fixed.magic, kMagic, sizeof kMagic);
  fixed.version = kFormatVersion;
  fixed.key_bytes = static_cast<uint32_t>(canonical.size());
  fixed.steps = layout.steps;
  fixed.blocks = layout.blocks;
  fixed.tokens = layout.tokens;
  fixed.hidden = layout.hidden;
  fixed.header_bytes = header_bytes_for(canonical.size(), slabs);
  fixed.slab_bytes = slab_bytes;
  fixed.file_bytes = fixed.header_bytes + slabs * slab_bytes;

  std::vector<char> header(fixed.header_bytes, 0);
  std::memcpy(header.data(), &fixed, sizeof fixed);
  std::memcpy(header.data() + kFixedHeaderBytes, canonical.data(), canonical.size());
  char* table = header.data() + kFixedHeaderBytes + canonical.size();
  const auto* data = reinterpret_cast<const char*>(entry.data());
  const size_t half = slab_bytes / 2;
  for (size_t i = 0; i < 2 * slabs; ++i) {
    const uint64_t sum = checksum(data + i * half, half);
    std::memcpy(table + 8 * i, &sum, 8);
  }
  const uint64_t header_sum = checksum(header.data(), header.size() - 8);
  std::memcpy(header.data() + header.size() - 8, &header_sum, 8);
  return header;
}

// Opens `path` read-only; not_found if it does not exist.
Result<std::pair<std::unique_ptr<Fd>, struct stat>> open_for_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return not_found(path + ": no such cache file");
    return io_error(path + ": cannot open: " + errno_text(err));
  }
  auto owned = std::make_unique<Fd>(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return io_error(path + ": cannot stat: " + errno_text(errno));
  return std::make_pair(std::move(owned), st);
}

std::atomic<uint64_t> g_temp_counter{0};

}  // namespace

std::string default_cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  // The XDG spec says relative values are invalid and must be ignored.
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/infill/activations";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] != '\0') return std::string(home) + "/.cache/infill/activations";
  return {};
}

Result<std::unique_ptr<DiskTier>> DiskTier::open(const std::string& dir, size_t budget_bytes) {
  if (dir.empty()) return invalid_argument("disk tier directory is empty; expected a path");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error(dir + ": cannot create the cache directory: " + ec.message());
  std::unique_ptr<DiskTier> tier(new DiskTier(dir, budget_bytes));
  INFILL_RETURN_IF_ERROR(tier->scan());
  return tier;
}

std::string DiskTier::path_of_stem(const std::string& stem) const { return dir_ + "/" + stem + kSuffix; }

std::string DiskTier::path_of(const ActivationKey& key) const { return path_of_stem(key.digest()); }

Status DiskTier::scan() {
  struct Found {
    std::string stem;
    ParsedHeader header;
    fs::file_time_type mtime;
  };
  std::vector<Found> found;
  std::error_code ec;
  fs::directory_iterator it(dir_, ec);
  if (ec) return io_error(dir_ + ": cannot list the cache directory: " + ec.message());
  const auto now = fs::file_time_type::clock::now();
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) return io_error(dir_ + ": cannot list the cache directory: " + ec.message());
    const fs::directory_entry& de = *it;
    std::error_code fec;
    if (!de.is_regular_file(fec)) continue;
    const std::string name = de.path().filename().string();
    const auto mtime = de.last_write_time(fec);
    if (fec) continue;
    if (name.find(kTempMarker) != std::string::npos) {
      // A writer that died mid-file; an hour is far longer than any live write takes.
      if (now - mtime > std::chrono::hours(1)) fs::remove(de.path(), fec);
      continue;
    }
    if (name.size() <= std::strlen(kSuffix) || !name.ends_with(kSuffix)) continue;
    const std::string path = de.path().string();
    auto opened = open_for_read(path);
    if (!opened.ok()) continue;
    auto header = read_header(opened->first->get(), static_cast<uint64_t>(opened->second.st_size),
                              path, nullptr);
    if (!header.ok()) {
      fs::remove(de.path(), fec);
      ++corrupt_dropped_;
      continue;
    }
    found.push_back(Found{name.substr(0, name.size() - std::strlen(kSuffix)),
                          std::move(header).value(), mtime});
  }
  // Oldest first, so that pushing each to the front leaves the newest most recently used.
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.mtime < b.mtime; });
  std::lock_guard<std::mutex> lock(mu_);
  for (Found& f : found) {
    lru_.push_front(f.stem);
    index_[f.stem] = IndexEntry{std::move(f.header.canonical), f.header.layout,
                                static_cast<size_t>(f.header.file_bytes), lru_.begin()};
    bytes_ += static_cast<size_t>(f.header.file_bytes);
  }
  evict_over_budget_locked();
  return Status::success();
}

void DiskTier::remove_locked(const std::string& stem, bool unlink_file) {
  auto it = index_.find(stem);
  if (it == index_.end()) return;
  bytes_ -= it->second.file_bytes;
  lru_.erase(it->second.lru);
  index_.erase(it);
  if (unlink_file) ::unlink(path_of_stem(stem).c_str());
}

void DiskTier::evict_over_budget_locked() {
  while (bytes_ > budget_bytes_ && !lru_.empty()) {
    const std::string victim = lru_.back();
    remove_locked(victim, /*unlink_file=*/true);
    ++evictions_;
  }
}

Status DiskTier::write(const ActivationKey& key, const ActivationEntry& entry) {
  const ActivationLayout& layout = entry.layout();
  if (layout.steps <= 0 || layout.blocks <= 0 || layout.tokens <= 0 || layout.hidden <= 0) {
    return invalid_argument("activation entry for " + key.canonical() + " has layout " +
                            std::to_string(layout.steps) + "x" + std::to_string(layout.blocks) +
                            "x" + std::to_string(layout.tokens) + "x" +
                            std::to_string(layout.hidden) + "; expected positive sizes");
  }
  const std::string canonical = key.canonical();
  if (canonical.size() > kMaxKeyBytes) {
    return invalid_argument("activation key is " + std::to_string(canonical.size()) +
                            " bytes long; expected at most " + std::to_string(kMaxKeyBytes));
  }
  const size_t slabs = static_cast<size_t>(layout.steps) * layout.blocks;
  const size_t file_bytes = header_bytes_for(canonical.size(), slabs) + entry.bytes();
  if (file_bytes > budget_bytes_) {
    return Status(ErrorCode::kResourceExhausted,
                  "activation entry for " + canonical + " needs " + std::to_string(file_bytes) +
                      " bytes on disk; the disk tier budget is " + std::to_string(budget_bytes_));
  }

  const std::vector<char> header = build_header(canonical, entry);
  const std::string stem = key.digest();
  const std::string final_path = path_of_stem(stem);
  const std::string temp_path = final_path + kTempMarker + std::to_string(::getpid()) + "-" +
                                std::to_string(g_temp_counter.fetch_add(1));
  {
    Fd fd(::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (fd.get() < 0) return io_error(temp_path + ": cannot create: " + errno_text(errno));
    const bool ok = write_all(fd.get(), header.data(), header.size()) &&
                    write_all(fd.get(), entry.data(), entry.bytes());
    const int write_err = errno;
    if (!ok || ::close(fd.release()) != 0) {
      const int err = ok ? errno : write_err;
      ::unlink(temp_path.c_str());
      return io_error(temp_path + ": cannot write " + std::to_string(file_bytes) +
                      " bytes: " + errno_text(err));
    }
  }

  std::lock_guard<std::mutex> lock(mu_);
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp_path.c_str());
    return io_error(final_path + ": cannot rename the written file into place: " +
                    errno_text(err));
  }
  // The rename replaced any previous file of this stem (same key, or a digest collision).
  remove_locked(stem, /*unlink_file=*/false);
  lru_.push_front(stem);
  index_[stem] = IndexEntry{canonical, layout, file_bytes, lru_.begin()};
  bytes_ += file_bytes;
  evict_over_budget_locked();
  return Status::success();
}

void DiskTier::drop_corrupt(const std::string& stem, uint64_t dev, uint64_t ino) {
  const std::string path = path_of_stem(stem);
  std::lock_guard<std::mutex> lock(mu_);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || static_cast<uint64_t>(st.st_dev) != dev ||
      static_cast<uint64_t>(st.st_ino) != ino) {
    return;  // already replaced by a fresh write (or gone): that file is not the corrupt one
  }
  remove_locked(stem, /*unlink_file=*/false);
  ::unlink(path.c_str());
  ++corrupt_dropped_;
}

void DiskTier::forget_missing(const std::string& stem) {
  const std::string path = path_of_stem(stem);
  std::lock_guard<std::mutex> lock(mu_);
  if (::access(path.c_str(), F_OK) != 0) remove_locked(stem, /*unlink_file=*/false);
}

Result<std::shared_ptr<ActivationEntry>> DiskTier::read(const ActivationKey& key, const HostAllocator& allocate) {
  const std::string canonical = key.canonical();
  const std::string stem = key.digest();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(stem);
    if (it == index_.end() || it->second.canonical != canonical) {
      return not_found("no disk cache entry for " + canonical);
    }
  }
  const std::string path = path_of_stem(stem);
  auto opened = open_for_read(path);
  if (!opened.ok()) {
    if (opened.status().code() == ErrorCode::kNotFound) forget_missing(stem);
    return opened.status();
  }
  const int fd = opened->first->get();
  const struct stat st = opened->second;
  auto fail = [&](Status status) -> Status {
    drop_corrupt(stem, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino));
    return status;
  };
  auto header = read_header(fd, static_cast<uint64_t>(st.st_size), path, &canonical);
  if (!header.ok()) return fail(header.status());

  auto entry = std::make_shared<ActivationEntry>(header->layout, allocate);
  auto* data = reinterpret_cast<char*>(entry->data());
  const size_t half = static_cast<size_t>(header->slab_bytes / 2);
  if (!pread_all(fd, data, entry->bytes(), header->header_bytes)) {
    return fail(corrupt_data(path + ": short read of " + std::to_string(entry->bytes()) +
                             " data bytes"));
  }
  for (size_t i = 0; i < header->half_checksums.size(); ++i) {
    if (checksum(data + i * half, half) != header->half_checksums[i]) {
      const size_t blocks = static_cast<size_t>(header->layout.blocks);
      return fail(corrupt_data(path + ": checksum mismatch in " + (i % 2 == 0 ? "K" : "V") +
                               " of slab (step " + std::to_string(i / 2 / blocks) +
                               ", block " + std::to_string(i / 2 % blocks) + ")"));
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(stem);
  if (it != index_.end()) lru_.splice(lru_.begin(), lru_, it->second.lru);
  return entry;
}

Status DiskTier::read_slab(const ActivationKey& key, int step, int block, uint16_t* k_out,
                           uint16_t* v_out) {
  const std::string canonical = key.canonical();
  const std::string stem = key.digest();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(stem);
    if (it == index_.end() || it->second.canonical != canonical) {
      return not_found("no disk cache entry for " + canonical);
    }
    const ActivationLayout& layout = it->second.layout;
    if (step < 0 || step >= layout.steps || block < 0 || block >= layout.blocks) {
      return out_of_range("slab (step " + std::to_string(step) + ", block " +
                          std::to_string(block) + ") is outside the cached layout of " +
                          std::to_string(layout.steps) + " steps x " +
                          std::to_string(layout.blocks) + " blocks");
    }
  }
  const std::string path = path_of_stem(stem);
  auto opened = open_for_read(path);
  if (!opened.ok()) {
    if (opened.status().code() == ErrorCode::kNotFound) forget_missing(stem);
    return opened.status();
  }
  const int fd = opened->first->get();
  const struct stat st = opened->second;
  auto fail = [&](Status status) -> Status {
    drop_corrupt(stem, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino));
    return status;
  };
  // The header is re-read rather than cached: it is small, and it proves this file (which a
  // concurrent write may have replaced) is the one whose checksums we use.
  auto header = read_header(fd, static_cast<uint64_t>(st.st_size), path, &canonical);
  if (!header.ok()) return fail(header.status());
  if (step >= header->layout.steps || block >= header->layout.blocks) {
    return out_of_range("slab (step " + std::to_string(step) + ", block " +
                        std::to_string(block) + ") is outside the cached layout");
  }
  const size_t index = static_cast<size_t>(step) * header->layout.blocks + block;
  const size_t half = static_cast<size_t>(header->slab_bytes / 2);
  const uint64_t offset = header->header_bytes + index * header->slab_bytes;
  if (!pread_all(fd, k_out, half, offset) || !pread_all(fd, v_out, half, offset + half)) {
    return fail(corrupt_data(path + ": short read of slab (step " + std::to_string(step) +
                             ", block " + std::to_string(block) + ")"));
  }
  if (checksum(k_out, half) != header->half_checksums[2 * index] ||
      checksum(v_out, half) != header->half_checksums[2 * index + 1]) {
    return fail(corrupt_data(path + ": checksum mismatch in slab (step " + std::to_string(step) +
                             ", block " + std::to_string(block) + ")"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(stem);
  if (it != index_.end()) lru_.splice(lru_.begin(), lru_, it->second.lru);
  return Status::success();
}

bool DiskTier::contains(const ActivationKey& key) const {
  const std::string stem = key.digest();
  const std::string canonical = key.canonical();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(stem);
  return it != index_.end() && it->second.canonical == canonical;
}

std::optional<ActivationLayout> DiskTier::layout_of(const ActivationKey& key) const {
  const std::string stem = key.digest();
  const std::string canonical = key.canonical();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(stem);
  if (it == index_.end() || it->second.canonical != canonical) return std::nullopt;
  return it->second.layout;
}

void DiskTier::erase(const ActivationKey& key) {
  const std::string stem = key.digest();
  const std::string canonical = key.canonical();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = index_.find(stem);
  if (it == index_.end() || it->second.canonical != canonical) return;
  remove_locked(stem, /*unlink_file=*/true);
}

size_t DiskTier::erase_if(const std::function<bool(std::string_view canonical)>& match) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> stems;
  for (const auto& [stem, entry] : index_)
    if (match(entry.canonical)) stems.push_back(stem);
  for (const std::string& stem : stems) remove_locked(stem, /*unlink_file=*/true);
  return stems.size();
}

DiskTierStats DiskTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return DiskTierStats{bytes_, index_.size(), evictions_, corrupt_dropped_};
}

}  // namespace infill
