#ifndef INFILL_CLIENT_H
#define INFILL_CLIENT_H
/// @file
/// libinfill_client: the C client of the Infill engine (`infill-engine`, docs/api.md).
///
/// The library talks HTTP/1.1 to an engine on a Unix socket (local) or on TCP (remote, with a
/// bearer token). It links neither libtorch nor Qt; a host application (an editor, a GIMP
/// plug-in, a render farm tool) can load it without dragging either in.
///
/// Conventions (docs/sdk.md has the full guide and examples):
/// - Every fallible call returns `infill_error*`: NULL on success, otherwise an error object the
///   caller owns and frees with infill_error_delete().
/// - Objects are opaque handles, created by `infill_<object>_create` / returned by a call and
///   freed by the matching `_destroy` / `_delete` / `_release`. The library frees what it
///   allocates; never pass its pointers to free().
/// - Every struct starts with `size_t struct_size`. Structs the caller fills are prepared by
///   their `*_init` function (which sets struct_size and the defaults); structs the library
///   fills carry the library's own struct_size, so a caller can test whether a field exists.
/// - Enums only grow, and 0 is never a real state: 0 means "unset / engine default".
/// - Strings are UTF-8 and NUL-terminated. Sizes are in bytes, durations in milliseconds.
///
/// Threading: every function is safe to call from any thread, concurrently, except
/// infill_client_destroy(), which must be the last call on its client (see there). Each client
/// runs one background thread that reads the engine's event stream and runs the callbacks of
/// the client's edits, one at a time (see infill_edit_params).

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && defined(INFILL_CLIENT_BUILDING)
#define INFILL_CLIENT_API __attribute__((visibility("default")))
#else
#define INFILL_CLIENT_API
#endif

/// The API version this header describes: (major << 16) | minor. A library accepts callers
/// compiled against the same major and a minor up to its own (structs only grow).
/// 1.1: infill_edit_params.model; infill_client_cancel_edit; infill_model_info.free_text and
/// .family; infill_done.cache_mode and .prompt_truncated.
/// 1.2: infill_edit_params.output_format; infill_done.media_type; infill_job_result_media_type.
/// 1.3: adapters (infill_client_upload_adapter, _list_adapters, _get_adapter, _delete_adapter);
/// infill_edit_params.adapters, .references and .adapters_from_step;
/// infill_done.adapters_from_step.
#define INFILL_CLIENT_API_VERSION_MAJOR 1
#define INFILL_CLIENT_API_VERSION_MINOR 3
#define INFILL_CLIENT_API_VERSION \
  ((uint32_t)((INFILL_CLIENT_API_VERSION_MAJOR << 16) | INFILL_CLIENT_API_VERSION_MINOR))

/// The API version of the loaded library, (major << 16) | minor.
INFILL_CLIENT_API uint32_t infill_api_version(void);

/// The library's release version, e.g. "0.1.0". Static storage.
INFILL_CLIENT_API const char* infill_library_version(void);

/* ---------------------------------------------------------------------------------------- */
/* Errors                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/// What went wrong. Values never change and new ones are only appended.
typedef enum infill_error_code {
  INFILL_ERROR_INVALID_ARGUMENT = 1,  ///< a NULL pointer, a wrong struct_size, a bad value
  INFILL_ERROR_VERSION_MISMATCH = 2,  ///< the caller was compiled against an incompatible API
  INFILL_ERROR_CONNECTION = 3,        ///< the engine could not be reached or the connection broke
  INFILL_ERROR_TIMEOUT = 4,           ///< no answer within the configured time
  INFILL_ERROR_PROTOCOL = 5,          ///< the engine's answer could not be understood
  INFILL_ERROR_UNAUTHORIZED = 6,      ///< 401 / 403: missing or wrong token, origin refused
  INFILL_ERROR_NOT_FOUND = 7,         ///< 404: unknown template or edit (evicted or expired)
  INFILL_ERROR_CONFLICT = 8,          ///< 409: e.g. the result of an edit that is not done
  INFILL_ERROR_RATE_LIMITED = 9,      ///< 429: too many edits; see infill_error_retry_after_s
  INFILL_ERROR_UNAVAILABLE = 10,      ///< 503: the engine is loading or overloaded
  INFILL_ERROR_TOO_LARGE = 11,        ///< 413: body or image above the engine's limits
  INFILL_ERROR_REJECTED = 12,         ///< another 4xx: the engine refused the request's content
  INFILL_ERROR_SERVER = 13,           ///< 5xx: the engine failed
  INFILL_ERROR_CANCELLED = 14,        ///< the edit was cancelled (infill_job_cancel, superseded)
  INFILL_ERROR_EXPIRED = 15,          ///< the edit missed its deadline
  INFILL_ERROR_EDIT_FAILED = 16,      ///< the engine accepted the edit and then failed it
  INFILL_ERROR_ENGINE_LOST = 17,      ///< the engine went away (or forgot the edit) while it ran
  INFILL_ERROR_CLIENT_CLOSED = 18,    ///< the client was destroyed while the edit ran
  INFILL_ERROR_IO = 19,               ///< a local file could not be read or written
  INFILL_ERROR_INTERNAL = 20          ///< a bug in this library
} infill_error_code;

/// An error; opaque. Owned by whoever the documentation says (usually the caller).
typedef struct infill_error infill_error;

/// The code. `error` must not be NULL.
INFILL_CLIENT_API infill_error_code infill_error_get_code(const infill_error* error);
/// A message naming the input at fault and what was expected. Valid while `error` lives.
INFILL_CLIENT_API const char* infill_error_message(const infill_error* error);
/// The HTTP status of the engine's answer, or 0 when the error did not come from one.
INFILL_CLIENT_API int infill_error_http_status(const infill_error* error);
/// The engine's own snake_case error code ("too_many_edits", "invalid_mask", ...; see
/// docs/api.md), or "" when the error did not come from the engine. Valid while `error` lives.
INFILL_CLIENT_API const char* infill_error_engine_code(const infill_error* error);
/// Seconds the engine asked to wait before retrying (Retry-After), or 0.
INFILL_CLIENT_API int infill_error_retry_after_s(const infill_error* error);
/// Frees an error the caller owns. NULL is allowed.
INFILL_CLIENT_API void infill_error_delete(infill_error* error);
/// The code's stable name, e.g. "invalid_argument"; "unknown" for other values. Static storage.
INFILL_CLIENT_API const char* infill_error_code_name(infill_error_code code);

/* ---------------------------------------------------------------------------------------- */
/* Client                                                                                   */
/* ---------------------------------------------------------------------------------------- */

/// A connection to one engine; opaque. Create with infill_client_create().
typedef struct infill_client infill_client;

/// Options of infill_client_create(). Prepare with infill_client_options_init().
typedef struct infill_client_options {
  size_t struct_size;    ///< set by infill_client_options_init
  uint32_t api_version;  ///< INFILL_CLIENT_API_VERSION, set by infill_client_options_init
  /// Where the engine is: "unix:/path/to/engine.sock" or "http://HOST:PORT" (HOST an IP
  /// address, a name, or [IPv6]). NULL or "": $INFILL_ENDPOINT when set, else the engine's
  /// default socket, unix:$XDG_RUNTIME_DIR/infill/engine.sock (see infill_default_endpoint).
  /// Copied by create.
  const char* endpoint;
  /// Bearer token for TCP endpoints. NULL: the contents of `token_file`, else of
  /// $INFILL_TOKEN, else of $XDG_CONFIG_HOME/infill/token (~/.config/infill/token) when that
  /// file exists. Not sent over Unix sockets. Copied by create.
  const char* token;
  /// A file holding the token (the engine's --token-file). NULL = see `token`.
  const char* token_file;
  /// The client name the engine scopes limits, `supersedes` and events by: 1-64 characters
  /// of A-Z a-z 0-9 . _ -. NULL: a name unique to this client ("sdk-<pid>-<n>"). Two clients
  /// must not share a name unless they never have edits in flight at the same time.
  const char* client_name;
  /// Timeouts and intervals below: 0 = the default.
  uint32_t connect_timeout_ms;  ///< default 5000
  uint32_t request_timeout_ms;  ///< one request and its answer; default 60000
  /// The event stream counts as dropped after this long without a byte (the engine sends a
  /// heartbeat every 15 s by default); default 45000.
  uint32_t stream_idle_timeout_ms;
  /// While the event stream is down and edits are in flight, the client reconnects every
  /// `reconnect_interval_ms` (default 500) and, once back, polls each edit's state. If the
  /// engine stays unreachable for `engine_lost_timeout_ms` (default 10000), every edit in
  /// flight ends with INFILL_ERROR_ENGINE_LOST (an engine restarting counts as unreachable
  /// until it answers again with its model loaded: raise this for engines that resume
  /// journaled batch edits after a restart).
  uint32_t reconnect_interval_ms;
  uint32_t engine_lost_timeout_ms;
  /// Nonzero (default): infill_client_destroy asks the engine to cancel the edits still in
  /// flight. Zero: they keep running on the engine (their results stay fetchable by id).
  int cancel_on_destroy;
} infill_client_options;

/// Sets struct_size, api_version and every default. `options` must not be NULL.
INFILL_CLIENT_API void infill_client_options_init(infill_client_options* options);

/// Creates a client. Checks the options (API version, struct_size, endpoint syntax, client
/// name) but does not connect: an engine that is down is reported by the first call that
/// needs it. On success *out_client is the new client (the caller owns it and destroys it
/// with infill_client_destroy); on error *out_client is NULL.
INFILL_CLIENT_API infill_error* infill_client_create(const infill_client_options* options,
                                                     infill_client** out_client);

/// Destroys a client. Edits still in flight are cancelled on the engine (unless
/// cancel_on_destroy is 0) and their `on_done` callbacks run with INFILL_ERROR_CLIENT_CLOSED,
/// on the calling thread, before this returns (from a callback: on the client's thread,
/// after the callback returns). No callback of this client runs after that. Job handles stay
/// valid until released. No other call on this client may be in progress or follow. NULL is
/// allowed.
INFILL_CLIENT_API void infill_client_destroy(infill_client* client);

/// The endpoint the client uses ("unix:/..." or "http://..."). Valid while the client lives.
INFILL_CLIENT_API const char* infill_client_endpoint(const infill_client* client);
/// The client name sent to the engine. Valid while the client lives.
INFILL_CLIENT_API const char* infill_client_name(const infill_client* client);

/// Writes the default endpoint ("unix:$XDG_RUNTIME_DIR/infill/engine.sock", or
/// "unix:/tmp/infill-<uid>/engine.sock" without XDG_RUNTIME_DIR; $INFILL_ENDPOINT overrides)
/// into `buffer` (NUL-terminated, truncated to `buffer_size`; `buffer` may be NULL when
/// buffer_size is 0). Returns the length without the NUL, like snprintf.
INFILL_CLIENT_API size_t infill_default_endpoint(char* buffer, size_t buffer_size);

/* ---------------------------------------------------------------------------------------- */
/* Engine state and models                                                                  */
/* ---------------------------------------------------------------------------------------- */

/// The engine's health (GET /health). Prepare with infill_health_init.
typedef struct infill_health {
  size_t struct_size;
  int ready;            ///< 1: the model is loaded; 0: the engine answers but is still loading
  uint32_t live_edits;  ///< edits in flight on the engine (all clients)
  char model_id[128];   ///< the loaded model's id, "" while loading
} infill_health;

INFILL_CLIENT_API void infill_health_init(infill_health* health);

/// Asks the engine whether it is up. Success with ready = 0 means the engine answers but is
/// loading its model. An engine that does not answer is INFILL_ERROR_CONNECTION.
INFILL_CLIENT_API infill_error* infill_client_health(infill_client* client, infill_health* out);

/// Polls /health until the engine is ready or `timeout_ms` passes (INFILL_ERROR_TIMEOUT,
/// naming the last reason). Useful after starting an engine process.
INFILL_CLIENT_API infill_error* infill_client_wait_ready(infill_client* client,
                                                         uint32_t timeout_ms);

/// One model the engine serves. Filled by the library; struct_size is the library's.
typedef struct infill_model_info {
  size_t struct_size;
  const char* id;           ///< e.g. "infill-tiny-1a2b..."
  const char* name;
  const char* description;
  uint32_t default_steps;
  const char* default_sampler;  ///< "euler_rf", "ddim"
  double default_guidance;
  /// The words a prompt may use; empty when the model takes no prompt.
  const char* const* vocabulary;
  size_t vocabulary_count;
  uint64_t max_image_pixels;  ///< width * height limit of templates
  uint32_t grid_pixels;       ///< templates are padded to a multiple of this
  /// 1: prompts are free text (a text encoder reads them; `vocabulary` is empty and means
  /// nothing); 0: prompts are words of `vocabulary`. (Added in 1.1: test struct_size.)
  int free_text;
  const char* family;  ///< "dit" or "flux2" ("" from an engine that does not say). (1.1)
} infill_model_info;

/// The engine's models; opaque. Every string and struct in it lives as long as the list.
typedef struct infill_model_list infill_model_list;

/// GET /v1/models. On success the caller owns *out_list (free with infill_model_list_delete).
INFILL_CLIENT_API infill_error* infill_client_list_models(infill_client* client,
                                                          infill_model_list** out_list);
INFILL_CLIENT_API size_t infill_model_list_count(const infill_model_list* list);
/// The model at `index`, or NULL when index >= count. Owned by the list.
INFILL_CLIENT_API const infill_model_info* infill_model_list_get(const infill_model_list* list,
                                                                 size_t index);
INFILL_CLIENT_API void infill_model_list_delete(infill_model_list* list);

/* ---------------------------------------------------------------------------------------- */
/* Templates                                                                                */
/* ---------------------------------------------------------------------------------------- */

/// Where a template is on its way to fast edits.
typedef enum infill_template_state {
  INFILL_TEMPLATE_READY = 1,      ///< decoded and encoded; the first edit prepares it
  INFILL_TEMPLATE_PREPARING = 2,  ///< an edit waits for its prepare job (the full denoising run)
  INFILL_TEMPLATE_PREPARED = 3    ///< the activation cache is filled: edits run at full speed
} infill_template_state;

/// A template on the engine. Prepare with infill_template_info_init; the library fills it.
typedef struct infill_template_info {
  size_t struct_size;
  char id[80];  ///< SHA-256 of the uploaded bytes, 64 hex digits
  uint32_t width, height;              ///< pixels of the image
  uint32_t model_width, model_height;  ///< the size the model works at
  uint32_t channels;
  char format[16];  ///< "u8", "u16", "f16", "f32"
  infill_template_state state;
  uint32_t edits_waiting;  ///< edits waiting for the prepare job
  int created;             ///< 1: new on the engine; 0: it had these bytes already
} infill_template_info;

INFILL_CLIENT_API void infill_template_info_init(infill_template_info* info);

/// Uploads an encoded image (PNG, JPEG, TIFF, EXR, PSD: anything the engine's OpenImageIO
/// reads) from memory. `name` (NULL allowed) labels it in the engine's messages. `out` may be
/// NULL. The bytes are not kept after the call returns.
INFILL_CLIENT_API infill_error* infill_client_upload_template(infill_client* client,
                                                              const void* bytes, size_t size,
                                                              const char* name,
                                                              infill_template_info* out);
/// Uploads an image file; its file name is the template's name.
INFILL_CLIENT_API infill_error* infill_client_upload_template_file(infill_client* client,
                                                                   const char* path,
                                                                   infill_template_info* out);
/// The template's current state (GET /v1/templates/{id}); INFILL_ERROR_NOT_FOUND once the
/// engine evicted it (upload it again).
INFILL_CLIENT_API infill_error* infill_client_get_template(infill_client* client,
                                                           const char* template_id,
                                                           infill_template_info* out);

/* ---------------------------------------------------------------------------------------- */
/* Adapters (LoRA)                                                                          */
/* ---------------------------------------------------------------------------------------- */

/// A LoRA file in the engine's adapter store (FLUX.2 models). Prepare with
/// infill_adapter_info_init; the library fills it. (Added in 1.3.)
typedef struct infill_adapter_info {
  size_t struct_size;
  char id[80];     ///< SHA-256 of the file's bytes, 64 hex digits: infill_edit_adapter.id
  char name[256];  ///< the name it was uploaded under ("" = none); cut at 255 bytes
  /// The file's naming scheme as the engine read it: "upstream", "kohya" or "diffusers"; ""
  /// for a file the engine found in its store and has not read since it started.
  char format[16];
  uint32_t min_rank, max_rank;  ///< the smallest and largest rank of its layers
  uint32_t layers;              ///< the model's layers it changes
  uint64_t bytes;               ///< the file's size
  int created;                  ///< upload: 1 when new on the engine, 0 when it had these bytes
} infill_adapter_info;

INFILL_CLIENT_API void infill_adapter_info_init(infill_adapter_info* info);

/// Uploads a LoRA (.safetensors, in the upstream, kohya or diffusers naming) from memory
/// (POST /v1/adapters). The engine reads it for `model` (an infill_model_info.id; NULL or "" =
/// the default model) before keeping it: a file that model cannot use is INFILL_ERROR_REJECTED
/// with engine code "invalid_adapter", whose message names the key at fault. The id is the
/// SHA-256 of the bytes: the same bytes again give the same adapter (created = 0). `name`
/// (NULL allowed) labels it; `out` may be NULL. The bytes are not kept after the call.
INFILL_CLIENT_API infill_error* infill_client_upload_adapter(infill_client* client, const void* bytes,
                                                             size_t size, const char* name,
                                                             const char* model,
                                                             infill_adapter_info* out);
/// Uploads a LoRA file; its file name is the adapter's name. A file that cannot be read is
/// INFILL_ERROR_IO naming the path.
INFILL_CLIENT_API infill_error* infill_client_upload_adapter_file(infill_client* client,
                                                                  const char* path,
                                                                  const char* model,
                                                                  infill_adapter_info* out);
/// One adapter (GET /v1/adapters/{id}); INFILL_ERROR_NOT_FOUND (engine code
/// "unknown_adapter") when the store does not hold it.
INFILL_CLIENT_API infill_error* infill_client_get_adapter(infill_client* client,
                                                          const char* adapter_id,
                                                          infill_adapter_info* out);
/// Removes an adapter from the engine's store (DELETE /v1/adapters/{id}); edits already
/// running with it finish with it. An id the store does not hold is INFILL_ERROR_NOT_FOUND.
INFILL_CLIENT_API infill_error* infill_client_delete_adapter(infill_client* client,
                                                             const char* adapter_id);

/// The engine's adapters; opaque. Every struct in it lives as long as the list.
typedef struct infill_adapter_list infill_adapter_list;

/// GET /v1/adapters. On success the caller owns *out_list (free with infill_adapter_list_delete).
INFILL_CLIENT_API infill_error* infill_client_list_adapters(infill_client* client,
                                                            infill_adapter_list** out_list);
INFILL_CLIENT_API size_t infill_adapter_list_count(const infill_adapter_list* list);
/// The adapter at `index`, or NULL when index >= count. Owned by the list; its struct_size is
/// the library's.
INFILL_CLIENT_API const infill_adapter_info* infill_adapter_list_get(const infill_adapter_list* list,
                                                                     size_t index);
INFILL_CLIENT_API void infill_adapter_list_delete(infill_adapter_list* list);

/* ---------------------------------------------------------------------------------------- */
/* Edits                                                                                    */
/* ---------------------------------------------------------------------------------------- */

/// How soon an edit is wanted; sets its default deadline.
typedef enum infill_edit_class {
  INFILL_CLASS_DEFAULT = 0,      ///< the engine's default (interactive)
  INFILL_CLASS_LIVE = 1,         ///< 0.8 s: a brush stroke in progress
  INFILL_CLASS_INTERACTIVE = 2,  ///< 5 s
  INFILL_CLASS_BATCH = 3         ///< 10 min; journaled by the engine, survives its restart
} infill_edit_class;

/// The state of an edit as this client knows it.
typedef enum infill_job_state {
  INFILL_JOB_QUEUED = 1,     ///< accepted by the engine
  INFILL_JOB_RUNNING = 2,    ///< its first step ran
  INFILL_JOB_DONE = 3,       ///< finished with a result
  INFILL_JOB_FAILED = 4,     ///< failed, or the engine / client went away (see the error)
  INFILL_JOB_CANCELLED = 5,  ///< cancelled or superseded
  INFILL_JOB_EXPIRED = 6     ///< missed its deadline
} infill_job_state;

/// The name of a job state ("queued", ...); "unknown" for other values. Static storage.
INFILL_CLIENT_API const char* infill_job_state_name(infill_job_state state);

/// Passed to `on_progress` after each denoising step. Valid during the callback only.
typedef struct infill_progress {
  size_t struct_size;
  uint64_t edit_id;
  uint32_t steps_done;  ///< strictly increasing from one call to the next
  uint32_t steps_total;
} infill_progress;

/// Passed to `on_preview` every `preview_every_steps` steps. Valid during the callback only.
typedef struct infill_preview {
  size_t struct_size;
  uint64_t edit_id;
  uint32_t steps_done;
  uint32_t width, height;  ///< of the preview image
  /// A PNG of the predicted image inside the mask's bounding box (plus a margin).
  const void* png;
  size_t png_size;
} infill_preview;

/// Passed to `on_done` exactly once per accepted edit. Valid during the callback only.
typedef struct infill_done {
  size_t struct_size;
  uint64_t edit_id;
  infill_job_state state;  ///< DONE, FAILED, CANCELLED or EXPIRED
  /// NULL when state is DONE; otherwise why. Owned by the job: the same object
  /// infill_job_error returns, valid while a handle of the job lives (else during the callback).
  const infill_error* error;
  /// state DONE: the result file, of the template's size; every pixel outside the mask is
  /// the template's own, at its depth. A PNG unless infill_edit_params.output_format asked for
  /// another format (or for the template's own): media_type says which. Otherwise NULL / 0.
  const void* png;
  size_t png_size;
  uint32_t steps_run;
  double total_ms;  ///< engine time from submission to the result
  /// How the engine used its activation cache: "off", "template_keyed", "prompt_keyed"; ""
  /// when it did not say. (Added in 1.1: test struct_size.)
  const char* cache_mode;
  /// 1 when the prompt was longer than the model's text encoder reads and was cut, as the
  /// model's own pipeline cuts it. (Added in 1.1.)
  int prompt_truncated;
  /// The result file's media type: "image/png", "image/tiff" or "image/x-exr"; "" when not
  /// DONE. (Added in 1.2: test struct_size.)
  const char* media_type;
  /// The K the edit ran with (infill_edit_params.adapters_from_step, Katz's K): the first
  /// schedule step that applied its adapters, as the engine reports it. 0 when the edit had no
  /// adapters, when it did not end DONE, or when the engine did not say. (Added in 1.3: test
  /// struct_size.)
  uint32_t adapters_from_step;
} infill_done;

typedef void (*infill_progress_fn)(void* user_data, const infill_progress* progress);
typedef void (*infill_preview_fn)(void* user_data, const infill_preview* preview);
typedef void (*infill_done_fn)(void* user_data, const infill_done* done);

/// One LoRA of an edit (infill_edit_params.adapters). Prepare each with
/// infill_edit_adapter_init. (Added in 1.3.)
typedef struct infill_edit_adapter {
  size_t struct_size;  ///< set by infill_edit_adapter_init; the same in every element of an array
  const char* id;      ///< required: infill_adapter_info.id
  double strength;     ///< -10..10 (the parameter table's range); 1 by infill_edit_adapter_init
} infill_edit_adapter;

/// Sets struct_size and strength = 1.
INFILL_CLIENT_API void infill_edit_adapter_init(infill_edit_adapter* adapter);

/// An edit request. Prepare with infill_edit_params_init, then set the template, one mask and
/// what else is needed. Pointers are read during infill_client_submit_edit only, except
/// `user_data`, which is passed to the callbacks.
typedef struct infill_edit_params {
  size_t struct_size;
  const char* template_id;  ///< required: infill_template_info.id

  /// The mask: exactly one of the three forms. 0 = keep, 255 = regenerate, grey = blend; it
  /// covers the whole template (same width and height).
  /// (1) An encoded image (PNG, ...) of the template's size; RGB uses the mean of R, G, B.
  const void* mask_png;
  size_t mask_png_size;
  /// (2) 8-bit grey pixels, row by row: mask_width x mask_height, `mask_stride` bytes apart
  /// (0 = mask_width). The library encodes them as PNG.
  const uint8_t* mask_pixels;
  uint32_t mask_width, mask_height;
  size_t mask_stride;
  /// (3) A rectangle x, y, width, height in template pixels; used when mask_rect[2] > 0.
  int32_t mask_rect[4];

  const char* prompt;        ///< words of the model's vocabulary, or free text (free_text models); NULL = ""
  uint64_t seed;             ///< default 0
  uint32_t steps;            ///< 1..1000; 0 = the model's default
  double strength;           ///< (0, 1]; 0 = 1
  double guidance;           ///< [1, 20]; 0 = the model's default
  const char* sampler;       ///< "euler_rf", "ddim"; NULL = the model's default
  infill_edit_class edit_class;
  double deadline_ms;             ///< relative to submission; 0 = by class
  uint32_t preview_every_steps;   ///< 0 = no previews
  /// An older edit of this client to cancel at its next step (live editing: each new stroke
  /// supersedes the last); 0 = none. That edit ends with INFILL_JOB_CANCELLED.
  uint64_t supersedes;
  int32_t halo_tokens;  ///< < 0 (default) = the engine's default (1)
  double feather_px;    ///< < 0 (default) = the engine's default (4)

  /// Callbacks, each optional. They run on the client's thread, one at a time across all
  /// edits of the client, in order per edit: on_progress / on_preview, then on_done exactly
  /// once (done, failed, cancelled, expired, engine lost, or client destroyed - see
  /// infill_client_destroy for that thread). They may run before infill_client_submit_edit
  /// returns. They must return promptly (they hold up the client's other edits' events);
  /// they may call this library, including infill_client_submit_edit and infill_job_cancel,
  /// but not infill_job_wait on an unfinished job. If submit returns an error, none of them
  /// runs.
  infill_progress_fn on_progress;
  infill_preview_fn on_preview;
  infill_done_fn on_done;
  void* user_data;

  /// API 1.1. The id of the model to run the edit on (infill_model_info.id, one of
  /// infill_client_list_models); NULL or "" = the engine's default model (the first it
  /// lists). An id the engine does not serve is INFILL_ERROR_REJECTED with engine code
  /// "unknown_model", whose message lists the ids it serves. Read only when the caller's
  /// struct_size covers it (callers compiled against API 1.0 get the default model).
  const char* model;

  /// API 1.2. The result's file format: "template" (the template's own: PNG, TIFF or
  /// OpenEXR, so 16-bit and float images come back at their depth), "png", "tiff" or "exr";
  /// NULL or "" = "png". Callers compiled against API 1.0 or 1.1 get PNG.
  const char* output_format;

  /// API 1.3. LoRAs applied in order (FLUX.2 models): `adapter_count` elements (at most 8),
  /// each with its id from infill_client_upload_adapter and a strength in -10..10. NULL / 0 =
  /// none. The array's stride is adapters[0].struct_size. An id the engine's store does not
  /// hold is INFILL_ERROR_NOT_FOUND with engine code "unknown_adapter"; a file the edit's model
  /// cannot use is INFILL_ERROR_REJECTED with "invalid_adapter", naming the key.
  const infill_edit_adapter* adapters;
  size_t adapter_count;
  /// API 1.3. Reference images besides the template (FLUX.2 models): `reference_count` template
  /// ids (at most 4, no repeats) from infill_client_upload_template. NULL / 0 = none.
  const char* const* references;
  size_t reference_count;
  /// API 1.3. Katz's K: the first schedule step that applies `adapters` (0..1000, the parameter
  /// table's range; 0, the default, applies them from the first step, right for 4-step
  /// distilled models). Earlier steps run without them, so that an adapter the engine is still
  /// reading holds them up no longer; the edit waits at step K until it is read. At most the
  /// edit's steps: more is INFILL_ERROR_REJECTED at submission (engine code
  /// "invalid_parameter"); K = steps runs the whole edit without the adapters. Part of the
  /// engine's cache keys. Read only from callers whose struct_size covers it.
  uint32_t adapters_from_step;
} infill_edit_params;

/// Sets struct_size and every default (no mask, no callbacks, halo and feather = -1).
INFILL_CLIENT_API void infill_edit_params_init(infill_edit_params* params);

/// An edit submitted by this client; opaque. The caller owns its handle and releases it
/// with infill_job_release; the edit itself runs on regardless.
typedef struct infill_job infill_job;

/// Submits an edit (POST /v1/edits) and returns once the engine accepted it. On success the
/// caller owns *out_job (NULL allowed when the caller only wants the callbacks) and exactly
/// one on_done call follows. Invalid parameters are reported here, with the engine's message
/// (e.g. INFILL_ERROR_REJECTED "mask is 63x48, template is 64x48").
INFILL_CLIENT_API infill_error* infill_client_submit_edit(infill_client* client,
                                                          const infill_edit_params* params,
                                                          infill_job** out_job);

/// The engine's id of the edit (the `supersedes` value for a later edit).
INFILL_CLIENT_API uint64_t infill_job_id(const infill_job* job);
/// The current state (QUEUED and RUNNING until on_done ran).
INFILL_CLIENT_API infill_job_state infill_job_get_state(const infill_job* job);
/// Steps done so far and in total (0 before the first step).
INFILL_CLIENT_API void infill_job_progress(const infill_job* job, uint32_t* steps_done,
                                           uint32_t* steps_total);
/// Asks the engine to stop the edit at its next step; it then ends as CANCELLED (on_done
/// follows). Cancelling an edit that already ended is not an error.
INFILL_CLIENT_API infill_error* infill_job_cancel(infill_job* job);
/// Cancels an edit by its id (infill_job_id), whichever client or process submitted it: the
/// engine stops it at its next step and it ends as CANCELLED. For watchers that outlive or
/// stand apart from the submitting process (the GIMP plug-in's). An edit that already ended
/// is not an error; an id the engine does not know is INFILL_ERROR_EDIT_FAILED naming it.
/// (Added in 1.1.)
INFILL_CLIENT_API infill_error* infill_client_cancel_edit(infill_client* client, uint64_t edit_id);
/// Blocks until on_done has returned (NULL) or `timeout_ms` passed (INFILL_ERROR_TIMEOUT).
/// UINT32_MAX waits without limit. Must not be called from a callback of an unfinished job.
INFILL_CLIENT_API infill_error* infill_job_wait(infill_job* job, uint32_t timeout_ms);
/// The result file of a DONE job (a PNG unless output_format asked otherwise; see
/// infill_job_result_media_type); owned by the job (valid until infill_job_release).
/// INFILL_ERROR_CONFLICT when the job is not DONE.
INFILL_CLIENT_API infill_error* infill_job_result(const infill_job* job, const void** png,
                                                  size_t* png_size);
/// The media type of a DONE job's result ("image/png", "image/tiff", "image/x-exr"); "" while
/// it is not DONE or for a NULL job. Owned by the job. (Added in 1.2.)
INFILL_CLIENT_API const char* infill_job_result_media_type(const infill_job* job);
/// Why an ended job did not finish DONE; NULL while running or when DONE. Owned by the job.
INFILL_CLIENT_API const infill_error* infill_job_error(const infill_job* job);
/// Writes the result PNG of a DONE job to a file.
INFILL_CLIENT_API infill_error* infill_job_write_result(const infill_job* job, const char* path);
/// Releases the caller's handle. The edit runs on and its callbacks still come. NULL allowed.
INFILL_CLIENT_API void infill_job_release(infill_job* job);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // INFILL_CLIENT_H
