#pragma once
/// `infill-engine --check`: loads the models on every device of the engine as the engine's
/// start does (ModelRegistry, with the options load() gives it: model_registry_options), so
/// each GPU must hold every model and the device team is made as when serving; then stops
/// again without serving. No calibration and no disk tier. Reports each device: whether it
/// holds the models (a GPU: its memory after the load), or the fault that leaves it out.
///
/// Torch-free header. Threading: one call, on any thread; it blocks while the models load.

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "model/device_memory.h"
#include "server/engine_service.h"

namespace infill {

struct EngineCheckDevice {
  std::string device;       ///< its label: "cpu", "cpu:1", "cuda:0"
  std::string description;  ///< what it is ("cuda:0 (NVIDIA H200, 139.8 GiB)", "cpu (2 threads)")
  /// False when the check stopped before this device (an error at an earlier one).
  bool checked = false;
  std::string fault;  ///< why it cannot serve, naming it; "" when it holds every model
  /// A CPU device after the first serves the first's copy of the models (their memory is the
  /// process's): that device's label. "" otherwise.
  std::string shares_models_of;
  std::optional<DeviceMemory> memory;  ///< a GPU's memory once the models are on it

  bool ok() const { return checked && fault.empty(); }
};

struct EngineCheckModel {
  std::string path, id, family;
};

struct EngineCheckReport {
  /// Ok when every device holds every model; else the first fault, naming its device (or the
  /// device list's entry, or the model's file).
  Status status;
  std::vector<EngineCheckModel> models;  ///< in order: the first is the default
  /// Every device of the list, in order (empty when the list itself is wrong).
  std::vector<EngineCheckDevice> devices;
  /// Ok when the devices make a device team; else why they do not (one device, switched off,
  /// no backend in this build). Unset when the check stopped before the team.
  std::optional<Status> device_team;
  double team_timeout_ms = 0;  ///< the team's collective timeout, as the runtime took it
};

/// Checks `options` (the daemon's ServiceOptions; its calibration, disk tier and test step
/// seams are not used, its load seam is).
EngineCheckReport check_engine(const ServiceOptions& options);

/// The report as `--check` prints it: {"ok", "error" (when not ok), "models": [{path, id,
/// family}], "devices": [{device, description, ok, fault, shares_models_of, memory}],
/// "device_team": {in_use, why, timeout_ms}}.
nlohmann::json engine_check_json(const EngineCheckReport& report);

}  // namespace infill
