#pragma once
/// The devices of one sequence-parallel forward, as the FLUX.2 transformer sees them: a rank
/// among `size()` and the one collective Ulysses needs, an all-to-all of rows. Every rank runs
/// the same forward at once, each on its own thread and device (model/device_group.h makes the
/// group over c10d: Gloo on the CPU, NCCL on GPUs).
/// Threading: a rank's member is used by one thread at a time.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace infill {

class SequenceGroup {
 public:
  virtual ~SequenceGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Where this rank computes; all_to_all takes and returns tensors there.
  virtual c10::Device device() const = 0;
  /// Rows to every rank and from every rank: rank j receives the `send_rows[j]` rows of `send`
  /// ([sum send_rows, C], contiguous) that follow those of the ranks before it; the result is
  /// what each rank sent to this one, in rank order: [sum recv_rows, C]. Every rank calls it
  /// with matching counts. Throws c10::Error when the collective fails or exceeds the group's
  /// timeout; the group is out of use from then on (every later call throws at once), so a
  /// rank never waits on peers that gave up.
  virtual at::Tensor all_to_all(const at::Tensor& send, const std::vector<int64_t>& send_rows,
                                const std::vector<int64_t>& recv_rows) = 0;
};

}  // namespace infill
