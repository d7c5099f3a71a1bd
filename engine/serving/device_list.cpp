#include "serving/device_list.h"

#include <algorithm>
#include <optional>

namespace infill {
namespace {

// One entry: a device, or nullopt for "cuda" (every visible GPU).
using Entry = std::optional<ComputeDevice>;

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

Result<std::vector<Entry>> parse_entries(std::string_view text) {
  std::vector<Entry> entries;
  size_t start = 0;
  for (;;) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = trim(text.substr(start, comma - start));
    if (item.empty()) {
      return invalid_argument(
          "device list \"" + std::string(text) +
          "\" has an empty entry; expected cpu, cuda or cuda:N separated by commas");
    }
    if (item == "cuda") {
      entries.push_back(std::nullopt);
    } else {
      auto device = parse_compute_device(item);
      if (!device.ok()) {
        if (text.find(',') == std::string_view::npos) return device.status();
        return Status(device.status().code(),
                      "device list \"" + std::string(text) + "\": " + device.status().message());
      }
      entries.push_back(*device);
    }
    if (comma == text.size()) break;
    start = comma + 1;
  }
  return entries;
}

}  // namespace

Status check_device_list(std::string_view text) {
  auto parsed = parse_entries(text);
  return parsed.ok() ? Status() : parsed.status();
}

int count_devices(std::string_view text, int cuda_devices) {
  auto parsed = parse_entries(text);
  if (!parsed.ok()) return 0;
  int n = 0;
  for (const Entry& e : *parsed) n += e ? 1 : cuda_devices;
  return n;
}

Result<std::vector<EngineDevice>> resolve_device_list(std::string_view text) {
  INFILL_ASSIGN_OR_RETURN(const std::vector<Entry> entries, parse_entries(text));
  std::vector<ComputeDevice> devices;
  for (const Entry& e : entries) {
    if (e) {
      devices.push_back(*e);
      continue;
    }
    const int count = cuda_device_count();
    if (count == 0) {
      const Status why = check_compute_device(ComputeDevice{true, 0});
      return Status(why.ok() ? ErrorCode::kUnimplemented : why.code(),
                    "cuda (every visible GPU): none is visible" +
                        (why.ok() ? std::string() : " (" + why.message() + ")"));
    }
    for (int i = 0; i < count; ++i) devices.push_back(ComputeDevice{true, i});
  }
  const auto cpus =
      std::count_if(devices.begin(), devices.end(), [](const ComputeDevice& d) { return !d.cuda; });
  std::vector<EngineDevice> out;
  int cpu_ordinal = 0;
  for (size_t i = 0; i < devices.size(); ++i) {
    const ComputeDevice& d = devices[i];
    INFILL_RETURN_IF_ERROR(check_compute_device(d));
    if (d.cuda && std::find(devices.begin(), devices.begin() + static_cast<std::ptrdiff_t>(i), d) !=
                      devices.begin() + static_cast<std::ptrdiff_t>(i)) {
      return invalid_argument(
          "device list \"" + std::string(text) + "\" names " + d.name() +
          " twice; a GPU is one device (--workers sets the workers of each device)");
    }
    std::string label = d.name();
    if (!d.cuda && cpus > 1) label = "cpu:" + std::to_string(cpu_ordinal++);
    out.push_back({d, std::move(label)});
  }
  return out;
}

}  // namespace infill
