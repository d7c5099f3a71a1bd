#include "server/engine_check.h"

#include <memory>

#include "model/compute_device.h"
#include "pipeline/edit_model.h"
#include "server/model_registry.h"
#include "serving/device_fault.h"
#include "serving/device_list.h"
#include "serving/serving_runtime.h"

namespace infill {

EngineCheckReport check_engine(const ServiceOptions& options) {
  EngineCheckReport report;
  auto devices = resolve_device_list(options.device);
  if (!devices.ok()) {
    report.status = devices.status();
    return report;
  }
  for (const EngineDevice& d : *devices) {
    EngineCheckDevice c;
    c.device = d.label;
    c.description = describe_compute_device(d.device);
    report.devices.push_back(std::move(c));
  }

  ModelRegistryOptions mo = model_registry_options(options);
  mo.calibrate = false;  // the cost model's timing is no part of whether the setup works
  mo.cache_dir.clear();  // nor is the disk tier, which the check must not create
  mo.before_step = {};
  mo.may_step = {};
  auto registry = ModelRegistry::load(mo);
  if (!registry.ok()) {
    // With several devices the registry's load errors start with the device's label, and it
    // loads the devices in order: those before it hold the models, those after were not
    // tried. One device's errors are the load's own; a device fault (out of its memory) is
    // that device's, anything else the model's.
    Status st = registry.status();
    size_t at = report.devices.size();
    for (size_t i = 0; i < report.devices.size() && at == report.devices.size(); ++i) {
      if (st.message().rfind(report.devices[i].device + ": ", 0) == 0) at = i;
    }
    const bool device_fault = st.code() == ErrorCode::kResourceExhausted ||
                              classify_device_fault(st.message()) != DeviceFault::kNone;
    if (at == report.devices.size() && report.devices.size() == 1 && device_fault) {
      at = 0;
      st = Status(st.code(), report.devices[0].device + ": " + st.message());
    }
    if (at < report.devices.size()) {
      for (size_t i = 0; i < at; ++i) report.devices[i].checked = true;
      report.devices[at].checked = true;
      report.devices[at].fault = st.message();
    }
    report.status = st;
    return report;
  }
  const ModelRegistry& r = **registry;
  for (size_t slot = 0; slot < r.size(); ++slot) {
    const EditModelInfo& info = r.model(slot).info();
    report.models.push_back({mo.paths.at(slot), info.id, info.family});
  }
  // The registry's devices are the list's, in order; a device it left out has its fault.
  std::string first_cpu;
  std::string faults;
  for (size_t i = 0; i < report.devices.size() && i < r.devices().size(); ++i) {
    EngineCheckDevice& c = report.devices[i];
    const RegistryDevice& d = r.devices()[i];
    const ComputeDevice& device = (*devices)[i].device;
    c.checked = true;
    if (!d.loaded) {
      c.fault = d.fault;
      faults += (faults.empty() ? "" : "; ") + d.fault;
      continue;
    }
    if (!device.cuda) {
      if (first_cpu.empty())
        first_cpu = c.device;
      else
        c.shares_models_of = first_cpu;
      continue;
    }
    auto memory = cuda_device_memory(device.index);
    if (memory.ok()) c.memory = *memory;
  }
  if (!faults.empty()) {
    report.status =
        Status(ErrorCode::kResourceExhausted,
               faults + " (the engine would leave it out and serve on the other devices)");
  }
  report.device_team = r.runtime().team_status();
  report.team_timeout_ms = r.runtime().options().team_timeout_ms;
  return report;
}

nlohmann::json engine_check_json(const EngineCheckReport& report) {
  nlohmann::json models = nlohmann::json::array();
  for (const EngineCheckModel& m : report.models)
    models.push_back({{"path", m.path}, {"id", m.id}, {"family", m.family}});
  nlohmann::json devices = nlohmann::json::array();
  for (const EngineCheckDevice& d : report.devices) {
    nlohmann::json j = {{"device", d.device}, {"description", d.description}, {"ok", d.ok()}};
    if (!d.checked) j["checked"] = false;
    if (!d.fault.empty()) j["fault"] = d.fault;
    if (!d.shares_models_of.empty()) j["shares_models_of"] = d.shares_models_of;
    if (d.memory) {
      j["memory"] = {{"allocated_bytes", d.memory->allocated_bytes},
                     {"reserved_bytes", d.memory->reserved_bytes},
                     {"free_bytes", d.memory->free_bytes},
                     {"total_bytes", d.memory->total_bytes}};
    }
    devices.push_back(std::move(j));
  }
  nlohmann::json out = {{"ok", report.status.ok()}, {"models", models}, {"devices", devices}};
  if (!report.status.ok()) out["error"] = report.status.message();
  if (report.device_team) {
    out["device_team"] =
        report.device_team->ok()
            ? nlohmann::json{{"in_use", true}, {"timeout_ms", report.team_timeout_ms}}
            : nlohmann::json{{"in_use", false}, {"why", report.device_team->message()}};
  }
  return out;
}

}  // namespace infill
