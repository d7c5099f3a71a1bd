#include "pipeline/adapter_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/hash.h"
#include "pipeline/edit_model.h"

namespace infill {

namespace fs = std::filesystem;

namespace {

bool is_adapter_id(const std::string& s) { return std::regex_match(s, std::regex("[0-9a-f]{64}")); }

// Every occurrence of `from` in `s` replaced by `to`.
std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

void describe(StoredAdapter& s, const LoraAdapter& a) {
  s.format = lora_format_name(a.format);
  s.min_rank = a.min_rank();
  s.max_rank = a.max_rank();
  s.layers = static_cast<int64_t>(a.layers.size());
}

Status write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) return io_error(path + ": cannot write " + std::to_string(bytes.size()) + " bytes");
  return {};
}

}  // namespace

Result<std::shared_ptr<AdapterStore>> AdapterStore::open(const std::string& dir, int64_t host_bytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error("adapter store " + dir + ": cannot create the folder: " + ec.message());
  std::shared_ptr<AdapterStore> store(new AdapterStore(dir, host_bytes));
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const fs::path& p = entry.path();
    if (p.extension() != ".safetensors" || !is_adapter_id(p.stem().string())) continue;
    StoredAdapter s;
    s.id = p.stem().string();
    s.file_bytes = static_cast<int64_t>(entry.file_size(ec));
    std::ifstream meta(store->dir_ + "/" + s.id + ".json");
    const nlohmann::json j = nlohmann::json::parse(meta, nullptr, false);
    if (j.is_object() && j.contains("name") && j["name"].is_string()) s.name = j["name"].get<std::string>();
    store->files_[s.id] = std::move(s);
  }
  if (ec) return io_error("adapter store " + dir + ": cannot list the folder: " + ec.message());
  return store;
}

std::string AdapterStore::file_of(const std::string& id) const { return dir_ + "/" + id + ".safetensors"; }

Result<StoredAdapter> AdapterStore::add(std::string_view bytes, const std::string& name, const EditModel& model,
                                        bool& created) {
  const std::string id = sha256_hex(std::as_bytes(std::span<const char>(bytes.data(), bytes.size())));
  {
    std::lock_guard lock(mu_);
    if (const auto it = files_.find(id); it != files_.end()) {
      created = false;
      return it->second;
    }
  }
  // Written beside its final place, read by the model from there, then renamed: a file the
  // model refuses is never kept, and a reader never sees half a file.
  std::string tmp = dir_ + "/.upload-XXXXXX";
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) return io_error("adapter store " + dir_ + ": cannot create a file: " + std::strerror(errno));
  ::close(fd);
  if (Status st = write_file(tmp, bytes); !st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  auto adapter = model.read_adapter(tmp);
  if (!adapter.ok()) {
    ::unlink(tmp.c_str());
    const std::string upload = "upload '" + (name.empty() ? std::string("adapter") : name) + "'";
    return Status(adapter.status().code(), replace_all(adapter.status().message(), tmp, upload));
  }
  if (::rename(tmp.c_str(), file_of(id).c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return io_error("adapter store " + dir_ + ": cannot keep " + id + ": " + why);
  }
  // The name is a convenience; the adapter is usable without it.
  (void)write_file(dir_ + "/" + id + ".json", nlohmann::json{{"name", name}}.dump());
  StoredAdapter s;
  s.id = id;
  s.name = name;
  s.file_bytes = static_cast<int64_t>(bytes.size());
  describe(s, **adapter);
  std::lock_guard lock(mu_);
  created = files_.emplace(id, s).second;
  hold_locked(id + '\n' + model.info().id, *adapter);
  return files_.at(id);
}

std::vector<StoredAdapter> AdapterStore::list() const {
  std::lock_guard lock(mu_);
  std::vector<StoredAdapter> out;
  for (const auto& [_, s] : files_) out.push_back(s);
  return out;
}

std::optional<StoredAdapter> AdapterStore::find(const std::string& id) const {
  std::lock_guard lock(mu_);
  const auto it = files_.find(id);
  if (it == files_.end()) return std::nullopt;
  return it->second;
}

Status AdapterStore::remove(const std::string& id) {
  {
    std::lock_guard lock(mu_);
    if (files_.erase(id) == 0) return not_found("adapter " + id + " is not in the store (GET /v1/adapters lists them)");
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->first.rfind(id + '\n', 0) == 0) {
        host_bytes_ -= it->second->bytes();
        held_index_.erase(it->first);
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
  }
  ::unlink(file_of(id).c_str());
  ::unlink((dir_ + "/" + id + ".json").c_str());
  return {};
}

void AdapterStore::hold_locked(const std::string& key, std::shared_ptr<const LoraAdapter> adapter) {
  if (held_index_.count(key) != 0 || adapter->bytes() > host_budget_) return;
  held_.emplace_front(key, std::move(adapter));
  held_index_[key] = held_.begin();
  host_bytes_ += held_.front().second->bytes();
  while (host_bytes_ > host_budget_ && !held_.empty()) {
    host_bytes_ -= held_.back().second->bytes();
    held_index_.erase(held_.back().first);
    held_.pop_back();
    ++evictions_;
  }
}

bool AdapterStore::in_memory(const std::string& id, const EditModel& model) const {
  std::lock_guard lock(mu_);
  return held_index_.count(id + '\n' + model.info().id) > 0;
}

Result<std::shared_ptr<const LoraAdapter>> AdapterStore::get(const std::string& id, const EditModel& model) {
  const std::string key = id + '\n' + model.info().id;
  {
    std::lock_guard lock(mu_);
    if (const auto it = held_index_.find(key); it != held_index_.end()) {
      held_.splice(held_.begin(), held_, it->second);
      ++hits_;
      return held_.front().second;
    }
    if (files_.count(id) == 0) {
      return not_found("adapter " + id + " is not in the store (upload it with POST /v1/adapters)");
    }
    ++misses_;
  }
  auto adapter = model.read_adapter(file_of(id));
  if (!adapter.ok()) {
    return Status(adapter.status().code(), "adapter " + id + " does not fit model " + model.name() + ": " +
                                               adapter.status().message());
  }
  std::lock_guard lock(mu_);
  if (auto it = files_.find(id); it != files_.end() && it->second.format.empty()) describe(it->second, **adapter);
  hold_locked(key, *adapter);
  return *adapter;
}

Result<AdapterSet> AdapterStore::resolve(const std::vector<std::pair<std::string, double>>& ids, const EditModel& model) {
  AdapterSet set;
  for (const auto& [id, strength] : ids) {
    INFILL_ASSIGN_OR_RETURN(std::shared_ptr<const LoraAdapter> adapter, get(id, model));
    set.push_back({std::move(adapter), strength});
  }
  return set;
}

AdapterStoreStats AdapterStore::stats() const {
  std::lock_guard lock(mu_);
  return {files_.size(), host_bytes_, host_budget_, hits_, misses_, evictions_};
}

}  // namespace infill
