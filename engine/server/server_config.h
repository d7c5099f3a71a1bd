#pragma once
/// Configuration of the engine daemon (JSON file plus flags), its limits, and the bearer token
/// of the TCP listener.
///
/// Pure functions and value types; thread-safe.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace infill {

/// Limits that keep one client from exhausting the engine.
struct ServerLimits {
  uint64_t max_body_bytes = uint64_t{64} << 20;  ///< request body; larger -> 413
  /// The body of POST /v1/adapters (a LoRA file: tens to hundreds of MB); larger -> 413.
  uint64_t max_adapter_bytes = uint64_t{4} << 30;
  uint32_t max_header_bytes = 16 << 10;           ///< request line + headers; larger -> 431
  int64_t max_image_pixels = 4096 * 4096;         ///< uploads (the model's own limit also applies)
  int max_queued_per_client = 16;                 ///< live edits per client id; more -> 429
  int max_live_edits = 256;                       ///< live edits over all clients; more -> 429
  int max_templates = 64;                         ///< decoded templates kept (LRU)
  int max_results = 1024;                         ///< finished edits kept until fetched or expired
  double result_ttl_ms = 10 * 60 * 1000.0;        ///< finished edits expire after this
  double header_timeout_ms = 10000;               ///< from connection / previous response to a full header
  double body_timeout_ms = 60000;                 ///< reading one body, writing one response
  double event_heartbeat_ms = 15000;              ///< SSE comment line when no event was sent
  int max_connections = 256;                      ///< concurrent connections; more are closed at once
};

/// The link between an engine's devices as the config states it (the device team's planner
/// predicts its all-to-alls from it): e.g. PCIe between GPUs without NVLink.
struct DeviceTeamLink {
  double latency_ms = 0;    ///< one all-to-all's fixed cost
  double gbytes_per_s = 0;  ///< what one device sends per second
};

struct EngineConfig {
  std::string socket_path;  ///< "" = $XDG_RUNTIME_DIR/infill/engine.sock
  std::string listen;       ///< "HOST:PORT" for TCP; "" = no TCP listener
  std::string token_file;   ///< "" = $XDG_CONFIG_HOME/infill/token
  /// Model folders; the first is the default. The config key `model` takes a string or an
  /// array of strings. Empty = the bundled model, else the build's random model.
  std::vector<std::string> models;
  /// Where the models compute: "cpu", "cuda" (every visible GPU), "cuda:N", or several
  /// separated by commas ("cuda:0,cuda:1", "cpu,cpu": serving/device_list.h). The config key
  /// `device` takes that string or an array of devices. Checked when the models load.
  std::string device = "cpu";
  /// With two or more devices: whether a whole-sequence step (a prepare run's, a full
  /// recompute's, a guided step's halves) may lease idle devices and run over them
  /// (serving/device_team.h). Config key `sequence_parallel`.
  bool sequence_parallel = true;
  /// The longest one collective of the device team may take (Gloo on CPUs, NCCL on GPUs); one
  /// that takes longer fails its step and takes the team out of use. Config key
  /// `device_team_timeout_ms`, 1000..3600000.
  double device_team_timeout_ms = 60000;
  /// The device team's planning round (serving/team_planner.h): a plan holds this long.
  /// Config key `device_team_round_ms`, 1..10000.
  double device_team_round_ms = 50;
  /// The link the planner assumes; unset: NVLink's figures among GPUs, Gloo over loopback
  /// among CPU devices (measured steps correct either). Config key `device_team_link`:
  /// {"latency_ms": 0..1000, "gbytes_per_s": 0.001..100000}, both required.
  std::optional<DeviceTeamLink> device_team_link;
  /// A masked step may run over several devices only when its mask covers at least this share
  /// of the image's tokens (WorkerOptions::team_masked_share). Config key
  /// `device_team_masked_share`, 0..1.
  double device_team_masked_share = 0.25;
  /// Each FLUX.2 model's budget of GPU memory for CUDA graphs of masked rounds
  /// (model/flux2_graph_cache.h); 0 (the default until a GPU run has checked their replays)
  /// turns them off. Config key `step_graph_bytes`, 0..2^40.
  int64_t step_graph_bytes = 0;
  /// FLUX.2 transformers on a GPU keep their block projections in FP8 (E4M3, a scale per
  /// output row) and multiply them with at::_scaled_mm (model/float8_linear.h): half the
  /// weight bytes per step, results a little further from bf16's. Needs compute capability
  /// 8.9+; refused at start on the CPU. Changes the models' ids (so no cache entry recorded
  /// with the other weights is read). Config key `float8_weights`, default false.
  bool float8_weights = false;
  /// FLUX.2 transformers on a GPU run their row norms (the pre-norms with their modulation,
  /// the QK RMSNorm with RoPE) as the project's fused CUDA kernels, one launch each instead of
  /// libtorch's dozen (kernels/fused_norms.h). Refused at start on the CPU. Config key
  /// `fused_norm_kernels`, default false until a GPU run has measured it faster
  /// (bench_flux2's `fused_norms` section).
  bool fused_norm_kernels = false;
  /// Workers per device.
  int workers = 1;
  int threads = 0;          ///< compute threads per worker; 0 = cores / (workers x devices)
  std::string cache_dir;    ///< disk tier of the activation cache; "" = default_cache_dir()
  /// Journal of accepted batch edits; "" = default_state_dir()/journal.sqlite, "off" = none.
  std::string journal;
  uint64_t ram_cache_bytes = uint64_t{2} << 30;
  /// Each FLUX.2 model's budget on its GPU for cached K/V in the compute dtype (the device tier,
  /// pipeline/device_kv_tier.h). The Qwen3 text encoder goes to the GPU only where it fits
  /// beside the transformer and this budget, so a smaller one leaves room for it on a smaller
  /// card. Config key `device_cache_bytes`, 0..2^40, default 8 GiB.
  int64_t device_cache_bytes = int64_t{8} << 30;
  /// The adapter store's memory tiers: LoRAs as read (host memory, pinned on a GPU) and their
  /// copies on a GPU model's device.
  uint64_t adapter_ram_bytes = uint64_t{2} << 30;
  uint64_t adapter_device_bytes = uint64_t{1} << 30;
  bool calibrate = true;    ///< time the cost model at start-up (cached per model and threads)
  double drain_timeout_ms = 10000;  ///< on SIGTERM: let live edits finish this long, then cancel
  /// Origins allowed to call the API from a browser (exact "scheme://host[:port]").
  std::vector<std::string> allowed_origins;
  ServerLimits limits;
};

/// Parses a config document. Unknown keys, wrong types and out-of-range values are errors
/// naming the key ("engine.json: limits.max_body_byte is not a known key").
Result<EngineConfig> parse_engine_config(std::string_view json_text, const std::string& name_for_errors);
/// Reads and parses `path`; a missing file is not_found.
Result<EngineConfig> load_engine_config(const std::string& path);

/// $XDG_RUNTIME_DIR/infill (or /tmp/infill-<uid> without it).
std::string default_runtime_dir();
/// $XDG_CONFIG_HOME/infill (or ~/.config/infill).
std::string default_config_dir();
/// $XDG_STATE_HOME/infill (or ~/.local/state/infill): the job journal.
std::string default_state_dir();

/// Splits "HOST:PORT" ("[::1]:8080" for IPv6). Errors name the text.
Result<std::pair<std::string, uint16_t>> parse_listen_address(std::string_view text);

/// Reads the token at `path`, or creates it (32 random bytes from the kernel's CSPRNG, hex)
/// with mode 0600 (parent directory created 0700). A token file readable by group or others
/// is an error.
Result<std::string> load_or_create_token(const std::string& path);

/// Compares in time independent of where the inputs differ (length differences still leak
/// the length, which is public: tokens have a fixed size).
bool constant_time_equal(std::string_view a, std::string_view b);

/// Creates `dir` (and parents) and sets its mode to 0700; error if it is not owned by us.
Status make_private_dir(const std::string& dir);

}  // namespace infill
