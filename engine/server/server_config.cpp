#include "server/server_config.h"

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "serving/device_list.h"

namespace infill {
namespace {

using nlohmann::json;

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::string(v) : fallback;
}

// Typed readers: each names the key and the expected type.
Status read_string(const json& v, const std::string& key, std::string& out) {
  if (!v.is_string()) return invalid_argument(key + " must be a string");
  out = v.get<std::string>();
  return {};
}

Status read_int(const json& v, const std::string& key, int64_t lo, int64_t hi, int64_t& out) {
  if (!v.is_number_integer() && !v.is_number_unsigned()) return invalid_argument(key + " must be an integer");
  const int64_t x = v.is_number_unsigned() ? static_cast<int64_t>(std::min<uint64_t>(v.get<uint64_t>(), INT64_MAX))
                                           : v.get<int64_t>();
  if (x < lo || x > hi)
    return out_of_range(key + " is " + std::to_string(x) + ", expected " + std::to_string(lo) + ".." + std::to_string(hi));
  out = x;
  return {};
}

Status read_ms(const json& v, const std::string& key, double& out) {
  if (!v.is_number()) return invalid_argument(key + " must be a number of milliseconds");
  const double x = v.get<double>();
  if (!(x > 0 && x <= 24 * 3600 * 1000.0)) return out_of_range(key + " must be in (0, 86400000] ms");
  out = x;
  return {};
}

// Milliseconds within [lo, hi]; the error names the key, the value and the range.
Status read_ms_in(const json& v, const std::string& key, double lo, double hi, double& out) {
  if (!v.is_number()) return invalid_argument(key + " must be a number of milliseconds");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    const auto text = [](double ms) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.12g", ms);
      return std::string(buf);
    };
    return out_of_range(key + " is " + text(x) + ", expected " + text(lo) + ".." + text(hi) +
                        " ms");
  }
  out = x;
  return {};
}

// A plain number within [lo, hi]; the error names the key, the value and the range.
Status read_number_in(const json& v, const std::string& key, double lo, double hi, double& out) {
  if (!v.is_number()) return invalid_argument(key + " must be a number");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " is %.12g, expected %.12g..%.12g", x, lo, hi);
    return out_of_range(key + buf);
  }
  out = x;
  return {};
}

Status read_bool(const json& v, const std::string& key, bool& out) {
  if (!v.is_boolean()) return invalid_argument(key + " must be true or false");
  out = v.get<bool>();
  return {};
}

template <class T>
std::function<Status(const json&, const std::string&)> int_field(T& field, int64_t lo, int64_t hi) {
  return [&field, lo, hi](const json& v, const std::string& key) -> Status {
    int64_t x = 0;
    INFILL_RETURN_IF_ERROR(read_int(v, key, lo, hi, x));
    field = static_cast<T>(x);
    return {};
  };
}

using Fields = std::map<std::string, std::function<Status(const json&, const std::string&)>>;

Status read_object(const json& obj, const std::string& prefix, const Fields& fields) {
  if (!obj.is_object()) return invalid_argument((prefix.empty() ? std::string("the document") : prefix) + " must be an object");
  for (const auto& [key, value] : obj.items()) {
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    auto it = fields.find(key);
    if (it == fields.end()) {
      std::string known;
      for (const auto& f : fields) known += (known.empty() ? "" : ", ") + f.first;
      return invalid_argument(name + " is not a known key (known: " + known + ")");
    }
    INFILL_RETURN_IF_ERROR(it->second(value, name));
  }
  return {};
}

}  // namespace

Result<EngineConfig> parse_engine_config(std::string_view json_text, const std::string& name_for_errors) {
  json doc = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return invalid_argument(name_for_errors + ": not valid JSON");
  EngineConfig c;
  ServerLimits& l = c.limits;
  Fields limits = {
      {"max_body_bytes", int_field(l.max_body_bytes, 1024, int64_t{1} << 34)},
      {"max_adapter_bytes", int_field(l.max_adapter_bytes, 1024, int64_t{1} << 36)},
      {"max_header_bytes", int_field(l.max_header_bytes, 1024, 1 << 20)},
      {"max_image_pixels", int_field(l.max_image_pixels, 1, int64_t{1} << 32)},
      {"max_queued_per_client", int_field(l.max_queued_per_client, 1, 1 << 20)},
      {"max_live_edits", int_field(l.max_live_edits, 1, 1 << 20)},
      {"max_templates", int_field(l.max_templates, 1, 1 << 20)},
      {"max_results", int_field(l.max_results, 1, 1 << 24)},
      {"max_connections", int_field(l.max_connections, 1, 1 << 20)},
      {"result_ttl_ms", [&](const json& v, const std::string& k) { return read_ms(v, k, l.result_ttl_ms); }},
      {"header_timeout_ms", [&](const json& v, const std::string& k) { return read_ms(v, k, l.header_timeout_ms); }},
      {"body_timeout_ms", [&](const json& v, const std::string& k) { return read_ms(v, k, l.body_timeout_ms); }},
      {"event_heartbeat_ms", [&](const json& v, const std::string& k) { return read_ms(v, k, l.event_heartbeat_ms); }},
  };
  Fields top = {
      {"socket", [&](const json& v, const std::string& k) { return read_string(v, k, c.socket_path); }},
      {"listen", [&](const json& v, const std::string& k) { return read_string(v, k, c.listen); }},
      {"token_file", [&](const json& v, const std::string& k) { return read_string(v, k, c.token_file); }},
      {"model",
       [&](const json& v, const std::string& k) -> Status {
         // One folder, or several (the first is the default).
         c.models.clear();
         if (v.is_string()) {
           if (!v.get<std::string>().empty()) c.models.push_back(v.get<std::string>());
           return {};
         }
         if (!v.is_array() || v.empty()) return invalid_argument(k + " must be a model folder or a non-empty array of them");
         for (const auto& m : v) {
           if (!m.is_string() || m.get<std::string>().empty())
             return invalid_argument(k + " must be a model folder or a non-empty array of them; an element is " + m.dump());
           c.models.push_back(m.get<std::string>());
         }
         return {};
       }},
      {"device",
       [&](const json& v, const std::string& k) -> Status {
         // One device or several: a string (commas between devices) or an array of strings.
         if (v.is_array()) {
           if (v.empty()) return invalid_argument(k + " must be a device or a non-empty array of devices");
           c.device.clear();
           for (const auto& d : v) {
             if (!d.is_string())
               return invalid_argument(k + " must be a device or a non-empty array of devices; an element is " + d.dump());
             if (!c.device.empty()) c.device += ',';
             c.device += d.get<std::string>();
           }
         } else {
           INFILL_RETURN_IF_ERROR(read_string(v, k, c.device));
         }
         // The names only; whether this machine has the devices is checked when models load.
         const Status parsed = check_device_list(c.device);
         return parsed.ok() ? Status() : invalid_argument(k + ": " + parsed.message());
       }},
      {"cache_dir", [&](const json& v, const std::string& k) { return read_string(v, k, c.cache_dir); }},
      {"journal", [&](const json& v, const std::string& k) { return read_string(v, k, c.journal); }},
      {"workers", int_field(c.workers, 1, 64)},
      {"threads", int_field(c.threads, 0, 1024)},
      {"ram_cache_bytes", int_field(c.ram_cache_bytes, 0, int64_t{1} << 40)},
      {"device_cache_bytes", int_field(c.device_cache_bytes, 0, int64_t{1} << 40)},
      {"adapter_ram_bytes", int_field(c.adapter_ram_bytes, 0, int64_t{1} << 40)},
      {"adapter_device_bytes", int_field(c.adapter_device_bytes, 0, int64_t{1} << 40)},
      {"step_graph_bytes", int_field(c.step_graph_bytes, 0, int64_t{1} << 40)},
      {"float8_weights", [&](const json& v, const std::string& k) { return read_bool(v, k, c.float8_weights); }},
      {"fused_norm_kernels",
       [&](const json& v, const std::string& k) { return read_bool(v, k, c.fused_norm_kernels); }},
      {"drain_timeout_ms", [&](const json& v, const std::string& k) { return read_ms(v, k, c.drain_timeout_ms); }},
      {"calibrate", [&](const json& v, const std::string& k) { return read_bool(v, k, c.calibrate); }},
      {"sequence_parallel",
       [&](const json& v, const std::string& k) { return read_bool(v, k, c.sequence_parallel); }},
      // At least 1 s: a collective also waits for the slowest rank's share of a block, which
      // a large CPU step takes seconds over; at most an hour.
      {"device_team_timeout_ms",
       [&](const json& v, const std::string& k) {
         return read_ms_in(v, k, 1000, 3600000, c.device_team_timeout_ms);
       }},
      {"device_team_round_ms",
       [&](const json& v, const std::string& k) { return read_ms_in(v, k, 1, 10000, c.device_team_round_ms); }},
      {"device_team_link",
       [&](const json& v, const std::string& k) -> Status {
         DeviceTeamLink link{-1, -1};
         const Fields fields = {
             {"latency_ms",
              [&](const json& x, const std::string& n) { return read_ms_in(x, n, 0, 1000, link.latency_ms); }},
             {"gbytes_per_s",
              [&](const json& x, const std::string& n) { return read_number_in(x, n, 0.001, 100000, link.gbytes_per_s); }},
         };
         INFILL_RETURN_IF_ERROR(read_object(v, k, fields));
         if (link.latency_ms < 0 || link.gbytes_per_s < 0) {
           return invalid_argument(k + " needs both latency_ms and gbytes_per_s");
         }
         c.device_team_link = link;
         return {};
       }},
      {"device_team_masked_share",
       [&](const json& v, const std::string& k) { return read_number_in(v, k, 0, 1, c.device_team_masked_share); }},
      {"allowed_origins",
       [&](const json& v, const std::string& k) -> Status {
         if (!v.is_array()) return invalid_argument(k + " must be an array of strings");
         for (const auto& o : v) {
           if (!o.is_string()) return invalid_argument(k + " must be an array of strings");
           c.allowed_origins.push_back(o.get<std::string>());
         }
         return {};
       }},
      {"limits", [&](const json& v, const std::string& k) { return read_object(v, k, limits); }},
  };
  Status st = read_object(doc, "", top);
  if (!st.ok()) return Status(st.code(), name_for_errors + ": " + st.message());
  if (!c.listen.empty()) {
    auto addr = parse_listen_address(c.listen);
    if (!addr.ok()) return Status(addr.status().code(), name_for_errors + ": listen: " + addr.status().message());
  }
  return c;
}

Result<EngineConfig> load_engine_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found("config file " + path + " cannot be opened");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_engine_config(ss.str(), path);
}

std::string default_runtime_dir() {
  const std::string base = env_or("XDG_RUNTIME_DIR", "");
  if (!base.empty()) return base + "/infill";
  return "/tmp/infill-" + std::to_string(::getuid());
}

std::string default_config_dir() {
  const std::string base = env_or("XDG_CONFIG_HOME", env_or("HOME", "/tmp") + "/.config");
  return base + "/infill";
}

std::string default_state_dir() {
  const std::string base = env_or("XDG_STATE_HOME", env_or("HOME", "/tmp") + "/.local/state");
  return base + "/infill";
}

Result<std::pair<std::string, uint16_t>> parse_listen_address(std::string_view text) {
  const std::string s(text);
  std::string host;
  std::string port;
  if (!s.empty() && s.front() == '[') {
    const auto close = s.find(']');
    if (close == std::string::npos || close + 1 >= s.size() || s[close + 1] != ':')
      return invalid_argument("listen address " + s + " is not [IPv6]:PORT");
    host = s.substr(1, close - 1);
    port = s.substr(close + 2);
  } else {
    const auto colon = s.rfind(':');
    if (colon == std::string::npos) return invalid_argument("listen address " + s + " is not HOST:PORT");
    host = s.substr(0, colon);
    port = s.substr(colon + 1);
  }
  if (host.empty()) return invalid_argument("listen address " + s + " has no host");
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos)
    return invalid_argument("listen address " + s + ": port must be a number 0..65535");
  const long p = std::strtol(port.c_str(), nullptr, 10);
  if (p > 65535) return invalid_argument("listen address " + s + ": port must be a number 0..65535");
  return std::make_pair(host, static_cast<uint16_t>(p));
}

Status make_private_dir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return io_error("cannot create directory " + dir + ": " + ec.message());
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return io_error("cannot stat " + dir + ": " + std::strerror(errno));
  if (st.st_uid != ::getuid()) return invalid_argument("directory " + dir + " is not owned by this user");
  if (::chmod(dir.c_str(), 0700) != 0) return io_error("cannot chmod 0700 " + dir + ": " + std::strerror(errno));
  return {};
}

Result<std::string> load_or_create_token(const std::string& path) {
  const std::filesystem::path p(path);
  if (p.has_parent_path()) INFILL_RETURN_IF_ERROR(make_private_dir(p.parent_path().string()));
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if ((st.st_mode & 077) != 0) return invalid_argument("token file " + path + " is readable by others; chmod 600 it");
    std::ifstream in(path);
    std::string token;
    in >> token;
    if (token.size() < 32) return corrupt_data("token file " + path + " holds no token of at least 32 characters");
    return token;
  }
  unsigned char raw[32];
  size_t got = 0;
  while (got < sizeof raw) {
    const ssize_t n = ::getrandom(raw + got, sizeof raw - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return io_error(std::string("getrandom failed: ") + std::strerror(errno));
    }
    got += static_cast<size_t>(n);
  }
  static const char* kHex = "0123456789abcdef";
  std::string token;
  for (unsigned char b : raw) {
    token += kHex[b >> 4];
    token += kHex[b & 15];
  }
  // O_EXCL: two engines starting at once must not both write a token.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EEXIST) return load_or_create_token(path);
    return io_error("cannot create token file " + path + ": " + std::strerror(errno));
  }
  const std::string line = token + "\n";
  const bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ::close(fd);
  if (!ok) return io_error("cannot write token file " + path);
  return token;
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

}  // namespace infill
