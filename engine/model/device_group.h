#pragma once
/// The engine's process group: one member per compute device, all in this process (a step
/// loop thread per device, as the workers already are), created once at start over an
/// in-process c10d store: ProcessGroupGloo when the devices are CPUs, ProcessGroupNCCL when
/// they are GPUs. One process rather than a process per device: the workers, the activation
/// store and the adapter store are already shared in memory, so a rank of a sequence-parallel
/// forward writes its share of the K/V straight into the one entry, and nothing else (models,
/// caches, sockets) has to be split across processes.
///
/// A collective that fails, or does not complete within the timeout, throws on the ranks that
/// ran it and takes the whole group out of use: later calls on any member throw at once
/// naming the first failure, so no rank waits on peers that gave up.
/// Threading: a member is used by its own device's thread; health() from any thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/compute_device.h"
#include "model/sequence_group.h"

namespace infill {

struct DeviceGroupOptions {
  /// The longest a collective may take once every rank entered it.
  std::chrono::milliseconds timeout{60000};
  /// Test seam: asked before each collective of a rank (its rank, the count of its earlier
  /// collectives); false fails that collective there as a backend error would.
  std::function<bool(int rank, uint64_t call)> may_run;
};

class DeviceGroup final : public SequenceGroup {
 public:
  /// One member per device, in the order given (rank = position). Every device must be of one
  /// kind (CPUs: Gloo; GPUs: NCCL, one device each); errors name the devices and, when this
  /// build has no such backend, say so.
  static Result<std::vector<std::unique_ptr<DeviceGroup>>> create(const std::vector<ComputeDevice>& devices,
                                                                    DeviceGroupOptions options = {});
  ~DeviceGroup() override;

  int rank() const override;
  int size() const override;
  c10::Device device() const override;
  at::Tensor all_to_all(const at::Tensor& send, const std::vector<int64_t>& send_rows,
                        const std::vector<int64_t>& recv_rows) override;
  /// "gloo" or "nccl".
  const char* backend() const;
  /// Ok while the group is in use; else the failure that took it out of use.
  Status health() const;
  /// Collectives run by this member, and the seconds spent in them (the forward's share in
  /// communication, for benchmarks).
  uint64_t collectives() const;
  double collective_seconds() const;

  struct Impl;

 private:
  explicit DeviceGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace infill
