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

// The host tier's key: the model's reading of the file.
std::string host_key(const std::string& id, const EditModel& model) { return id + '\n' + model.info().id; }
// The device tier's key: that reading on the model's device (a model may serve from several).
std::string device_key(const std::string& id, const EditModel& model) {
  return host_key(id, model) + '\n' + model.device().name();
}

}  // namespace

AdapterStore::AdapterStore(std::string dir, AdapterBudgets budgets) : dir_(std::move(dir)) {
  host_.budget = budgets.host_bytes;
  device_.budget = budgets.device_bytes;
}

Result<std::shared_ptr<AdapterStore>> AdapterStore::open(const std::string& dir, AdapterBudgets budgets) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return io_error("adapter store " + dir + ": cannot create the folder: " + ec.message());
  std::shared_ptr<AdapterStore> store(new AdapterStore(dir, budgets));
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
  host_.hold(host_key(id, model), *adapter);
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
    host_.drop_id(id);
    device_.drop_id(id);
  }
  ::unlink(file_of(id).c_str());
  ::unlink((dir_ + "/" + id + ".json").c_str());
  return {};
}

std::shared_ptr<const LoraAdapter> AdapterStore::Tier::find(const std::string& key) {
  const auto it = index.find(key);
  if (it == index.end()) return nullptr;
  lru.splice(lru.begin(), lru, it->second);
  return lru.front().second;
}

void AdapterStore::Tier::hold(const std::string& key, std::shared_ptr<const LoraAdapter> adapter) {
  if (index.count(key) != 0 || adapter->bytes() > budget) return;
  lru.emplace_front(key, std::move(adapter));
  index[key] = lru.begin();
  bytes += lru.front().second->bytes();
  while (bytes > budget && !lru.empty()) {
    bytes -= lru.back().second->bytes();
    index.erase(lru.back().first);
    lru.pop_back();
    ++counts.evictions;
  }
}

void AdapterStore::Tier::drop_id(const std::string& id) {
  for (auto it = lru.begin(); it != lru.end();) {
    if (it->first.rfind(id + '\n', 0) == 0) {
      bytes -= it->second->bytes();
      index.erase(it->first);
      it = lru.erase(it);
    } else {
      ++it;
    }
  }
}

AdapterTierStats AdapterStore::Tier::stats() const {
  AdapterTierStats s = counts;
  s.bytes = bytes;
  s.budget = budget;
  s.adapters = lru.size();
  return s;
}

bool AdapterStore::ready(const std::string& id, const EditModel& model) const {
  std::lock_guard lock(mu_);
  if (model.device().cuda) return device_.index.count(device_key(id, model)) > 0;
  return host_.index.count(host_key(id, model)) > 0;
}

Result<std::shared_ptr<const LoraAdapter>> AdapterStore::get(const std::string& id, const EditModel& model) {
  const bool on_gpu = model.device().cuda;
  std::shared_ptr<const LoraAdapter> host;
  {
    std::lock_guard lock(mu_);
    if (on_gpu) {
      if (auto held = device_.find(device_key(id, model))) {
        ++device_.counts.hits;
        return held;
      }
      ++device_.counts.misses;
    }
    host = host_.find(host_key(id, model));
    if (host) {
      ++host_.counts.hits;
      if (!on_gpu) return host;
    } else {
      if (files_.count(id) == 0) {
        return not_found("adapter " + id + " is not in the store (upload it with POST /v1/adapters)");
      }
      ++host_.counts.misses;
    }
  }
  if (!host) {
    auto read = model.read_adapter(file_of(id));
    if (!read.ok()) {
      return Status(read.status().code(), "adapter " + id + " does not fit model " + model.name() + ": " +
                                              read.status().message());
    }
    host = *read;
    std::lock_guard lock(mu_);
    if (auto it = files_.find(id); it != files_.end() && it->second.format.empty()) describe(it->second, *host);
    host_.hold(host_key(id, model), host);
  }
  if (!on_gpu) return host;
  INFILL_ASSIGN_OR_RETURN(std::shared_ptr<const LoraAdapter> on_device, model.adapter_on_device(host));
  std::lock_guard lock(mu_);
  device_.hold(device_key(id, model), on_device);
  return on_device;
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
  return {files_.size(), host_.stats(), device_.stats()};
}

}  // namespace infill
