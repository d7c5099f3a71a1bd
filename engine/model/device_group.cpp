#include "model/device_group.h"

#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#if defined(INFILL_WITH_GLOO)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#if defined(INFILL_WITH_NCCL)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace infill {

namespace {

// What every member of one group shares: whether it is still in use.
struct GroupHealth {
  std::mutex mu;
  std::string failure;  // "" while in use
};

using AllToAll = std::function<c10::intrusive_ptr<c10d::Work>(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_rows,
                                                              std::vector<int64_t>& in_rows)>;

}  // namespace

struct DeviceGroup::Impl {
  int rank = 0;
  int size = 1;
  c10::Device device{c10::kCPU};
  const char* backend = "";
  DeviceGroupOptions options;
  std::shared_ptr<GroupHealth> health;
  AllToAll all_to_all;
  uint64_t calls = 0;
  double seconds = 0.0;

  [[noreturn]] void fail(const std::string& why) {
    std::string first;
    {
      std::lock_guard lock(health->mu);
      if (health->failure.empty()) health->failure = why;
      first = health->failure;
    }
    TORCH_CHECK(false, "device group (", backend, ", rank ", rank, " of ", size, "): ", why,
                first == why ? std::string() : "; the group was already out of use: " + first);
  }
};

DeviceGroup::DeviceGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DeviceGroup::~DeviceGroup() = default;

int DeviceGroup::rank() const { return impl_->rank; }
int DeviceGroup::size() const { return impl_->size; }
c10::Device DeviceGroup::device() const { return impl_->device; }
const char* DeviceGroup::backend() const { return impl_->backend; }
uint64_t DeviceGroup::collectives() const { return impl_->calls; }
double DeviceGroup::collective_seconds() const { return impl_->seconds; }

Status DeviceGroup::health() const {
  std::lock_guard lock(impl_->health->mu);
  if (impl_->health->failure.empty()) return {};
  return Status(ErrorCode::kUnavailable, "device group (" + std::string(impl_->backend) +
                                             ") is out of use: " + impl_->health->failure);
}

at::Tensor DeviceGroup::all_to_all(const at::Tensor& send, const std::vector<int64_t>& send_rows,
                                   const std::vector<int64_t>& recv_rows) {
  Impl& g = *impl_;
  {
    std::lock_guard lock(g.health->mu);
    TORCH_CHECK(g.health->failure.empty(), "device group (", g.backend, ", rank ", g.rank, " of ", g.size,
                ") is out of use: ", g.health->failure);
  }
  TORCH_CHECK(static_cast<int>(send_rows.size()) == g.size && static_cast<int>(recv_rows.size()) == g.size,
              "device group all_to_all: ", send_rows.size(), " send and ", recv_rows.size(), " receive counts for ",
              g.size, " ranks");
  int64_t sent = 0, received = 0;
  for (int64_t r : send_rows) sent += r;
  for (int64_t r : recv_rows) received += r;
  TORCH_CHECK(send.dim() == 2 && send.size(0) == sent, "device group all_to_all: send is ", send.sizes(), ", expected ",
              sent, " rows");
  TORCH_CHECK(send.device() == g.device, "device group all_to_all: send is on ", send.device(), ", rank ", g.rank,
              " computes on ", g.device);
  const uint64_t call = g.calls++;
  if (g.options.may_run && !g.options.may_run(g.rank, call)) g.fail("collective " + std::to_string(call) + " failed (test seam)");
  const auto start = std::chrono::steady_clock::now();
  at::Tensor in = send.contiguous();
  at::Tensor out = at::empty({received, send.size(1)}, send.options());
  std::vector<int64_t> out_rows = recv_rows, in_rows = send_rows;
  try {
    c10::intrusive_ptr<c10d::Work> work = g.all_to_all(out, in, out_rows, in_rows);
    if (!work->wait(g.options.timeout)) g.fail("collective " + std::to_string(call) + " did not complete");
  } catch (const c10::Error& e) {
    g.fail("collective " + std::to_string(call) + ": " + e.what_without_backtrace());
  } catch (const std::exception& e) {
    g.fail("collective " + std::to_string(call) + ": " + e.what());
  }
  g.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

Result<std::vector<std::unique_ptr<DeviceGroup>>> DeviceGroup::create(const std::vector<ComputeDevice>& devices,
                                                                      DeviceGroupOptions options) {
  if (devices.empty()) return invalid_argument("a device group needs at least one device");
  std::string names;
  for (const ComputeDevice& d : devices) {
    if (!names.empty()) names += ',';
    names += d.name();
  }
  const bool cuda = devices.front().cuda;
  for (const ComputeDevice& d : devices) {
    if (d.cuda != cuda) return invalid_argument("device group " + names + ": CPUs and GPUs do not share a process group");
  }
  if (cuda) {
    for (size_t i = 0; i < devices.size(); ++i) {
      for (size_t j = i + 1; j < devices.size(); ++j) {
        if (devices[i] == devices[j]) return invalid_argument("device group " + names + ": " + devices[i].name() + " is named twice (NCCL takes one rank per GPU)");
      }
    }
  }
#if !defined(INFILL_WITH_GLOO)
  if (!cuda) return invalid_argument("device group " + names + ": this build has no Gloo (c10d's CPU backend; install libgloo-dev and reconfigure)");
#endif
#if !defined(INFILL_WITH_NCCL)
  if (cuda) return invalid_argument("device group " + names + ": this build has no NCCL (build the cuda preset against a CUDA libtorch)");
#endif
  const int size = static_cast<int>(devices.size());
  auto health = std::make_shared<GroupHealth>();
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::unique_ptr<Impl>> members(size);
  std::vector<std::string> errors(size);
  // Gloo's members meet in their constructors (each connects to every other), so they are made
  // at once, a thread each.
  auto make = [&](int rank) {
    try {
      auto m = std::make_unique<Impl>();
      m->rank = rank;
      m->size = size;
      m->device = devices[rank].torch_device();
      m->options = options;
      m->health = health;
#if defined(INFILL_WITH_GLOO)
      if (!cuda) {
        auto o = c10d::ProcessGroupGloo::Options::create(options.timeout);
        o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
        o->threads = 1;
        auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, o);
        m->backend = "gloo";
        m->all_to_all = [pg](at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_rows, std::vector<int64_t>& in_rows) {
          return pg->alltoall_base(out, in, out_rows, in_rows);
        };
      }
#endif
#if defined(INFILL_WITH_NCCL)
      if (cuda) {
        auto o = c10d::ProcessGroupNCCL::Options::create();
        o->timeout = options.timeout;
        auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, o);
        m->backend = "nccl";
        m->all_to_all = [pg](at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_rows, std::vector<int64_t>& in_rows) {
          return pg->alltoall_base(out, in, out_rows, in_rows);
        };
      }
#endif
      members[rank] = std::move(m);
    } catch (const c10::Error& e) {
      errors[rank] = e.what_without_backtrace();
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(make, r);
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < size; ++r) {
    if (!errors[r].empty()) return Status(ErrorCode::kUnavailable, "device group " + names + ": rank " + std::to_string(r) + " (" + devices[r].name() + "): " + errors[r]);
  }
  std::vector<std::unique_ptr<DeviceGroup>> group;
  for (auto& m : members) group.push_back(std::unique_ptr<DeviceGroup>(new DeviceGroup(std::move(m))));
  return group;
}

}  // namespace infill
