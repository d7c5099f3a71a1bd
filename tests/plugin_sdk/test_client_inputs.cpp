// libinfill_client without an engine: versions, enum names, endpoints, and every bad input
// (NULL pointers, wrong struct_size, bad values, unreachable engines) answered by an error
// object with a message naming the input, never a crash.
#include "support/catch.h"

#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <infill_protocol/edit_parameters.h>

#include "infill/infill_client.h"
#include "support/temp_dir.h"

namespace {

// Takes ownership of `e`: its code and message ("" / 0 when NULL).
struct Err {
  bool failed = false;
  infill_error_code code{};
  std::string message;
  int http = 0;
  explicit Err(infill_error* e) {
    if (!e) return;
    failed = true;
    code = infill_error_get_code(e);
    message = infill_error_message(e);
    http = infill_error_http_status(e);
    infill_error_delete(e);
  }
  bool contains(const std::string& s) const { return message.find(s) != std::string::npos; }
};

infill_client* make_client(const char* endpoint, uint32_t connect_timeout_ms = 2000) {
  infill_client_options o;
  infill_client_options_init(&o);
  o.endpoint = endpoint;
  o.token = "secret";
  o.connect_timeout_ms = connect_timeout_ms;
  infill_client* c = nullptr;
  infill_error* e = infill_client_create(&o, &c);
  if (e) {
    FAIL(infill_error_message(e));
  }
  return c;
}

}  // namespace

TEST_CASE("sdk: API version, library version and enum names", "[sdk]") {
  CHECK(infill_api_version() == INFILL_CLIENT_API_VERSION);
  CHECK(std::strlen(infill_library_version()) > 0);
  CHECK(std::string(infill_error_code_name(INFILL_ERROR_INVALID_ARGUMENT)) == "invalid_argument");
  CHECK(std::string(infill_error_code_name(INFILL_ERROR_ENGINE_LOST)) == "engine_lost");
  CHECK(std::string(infill_error_code_name(static_cast<infill_error_code>(999))) == "unknown");
  CHECK(std::string(infill_job_state_name(INFILL_JOB_CANCELLED)) == "cancelled");
  CHECK(std::string(infill_job_state_name(static_cast<infill_job_state>(0))) == "unknown");
  // Error accessors tolerate NULL.
  CHECK(infill_error_http_status(nullptr) == 0);
  CHECK(std::string(infill_error_engine_code(nullptr)).empty());
  infill_error_delete(nullptr);
}

TEST_CASE("sdk: create checks the options: version, struct_size, endpoint, client name", "[sdk]") {
  infill_client* c = reinterpret_cast<infill_client*>(0x1);
  infill_client_options o;
  infill_client_options_init(&o);
  CHECK(o.struct_size == sizeof o);
  CHECK(o.connect_timeout_ms == 5000);
  CHECK(o.cancel_on_destroy == 1);

  Err null_options(infill_client_create(nullptr, &c));
  CHECK(null_options.code == INFILL_ERROR_INVALID_ARGUMENT);
  CHECK(null_options.contains("options is NULL"));
  CHECK(c == nullptr);
  Err null_out(infill_client_create(&o, nullptr));
  CHECK(null_out.contains("out_client is NULL"));

  infill_client_options small = o;
  small.struct_size = 8;
  Err size(infill_client_create(&small, &c));
  CHECK(size.code == INFILL_ERROR_INVALID_ARGUMENT);
  CHECK(size.contains("infill_client_options.struct_size is 8"));
  CHECK(size.contains("infill_client_options_init"));

  infill_client_options newer = o;
  newer.api_version = INFILL_CLIENT_API_VERSION + 1;  // a newer minor than the library's
  Err minor(infill_client_create(&newer, &c));
  CHECK(minor.code == INFILL_ERROR_VERSION_MISMATCH);
  CHECK(minor.contains("API 1." + std::to_string(INFILL_CLIENT_API_VERSION_MINOR)));
  newer.api_version = (INFILL_CLIENT_API_VERSION_MAJOR + 1u) << 16;
  CHECK(Err(infill_client_create(&newer, &c)).code == INFILL_ERROR_VERSION_MISMATCH);

  struct Case {
    const char* endpoint;
    const char* expect;
  };
  for (const Case& k : {Case{"ftp://host:21", "not understood"}, Case{"http://127.0.0.1", "has no port"},
                        Case{"http://127.0.0.1:99999", "1..65535"}, Case{"http://:80", "no host"},
                        Case{"https://127.0.0.1:80", "https is not supported"}, Case{"unix:", "no socket path"},
                        Case{"http://127.0.0.1:80/v1", "has a path"}, Case{"engine.sock", "not understood"}}) {
    INFO(k.endpoint);
    infill_client_options bad = o;
    bad.endpoint = k.endpoint;
    Err e(infill_client_create(&bad, &c));
    CHECK(e.code == INFILL_ERROR_INVALID_ARGUMENT);
    CHECK(e.contains(k.expect));
    CHECK(c == nullptr);
  }
  infill_client_options bad_name = o;
  bad_name.client_name = "no spaces allowed";
  Err name(infill_client_create(&bad_name, &c));
  CHECK(name.code == INFILL_ERROR_INVALID_ARGUMENT);
  CHECK(name.contains("client_name"));
  infill_client_options bad_token = o;
  bad_token.endpoint = "http://127.0.0.1:9";
  bad_token.token = "abc\r\nX-Evil: 1";
  CHECK(Err(infill_client_create(&bad_token, &c)).contains("control character"));
  infill_client_options missing_file = o;
  missing_file.endpoint = "http://127.0.0.1:9";
  missing_file.token_file = "/nonexistent/infill/token";
  Err file(infill_client_create(&missing_file, &c));
  CHECK(file.code == INFILL_ERROR_IO);
  CHECK(file.contains("/nonexistent/infill/token"));

  // Good forms.
  for (const char* ep : {"unix:/tmp/x.sock", "unix:///tmp/x.sock", "http://127.0.0.1:7860", "http://[::1]:7860/",
                         "http://localhost:7860"}) {
    INFO(ep);
    infill_client_options good = o;
    good.endpoint = ep;
    good.token = "t";
    infill_client* ok = nullptr;
    CHECK_FALSE(Err(infill_client_create(&good, &ok)).failed);
    REQUIRE(ok != nullptr);
    CHECK(std::string(infill_client_name(ok)).rfind("sdk-", 0) == 0);
    infill_client_destroy(ok);
  }
  infill_client_destroy(nullptr);
}

TEST_CASE("sdk: the default endpoint follows XDG_RUNTIME_DIR as the engine does, INFILL_ENDPOINT overrides", "[sdk]") {
  const char* old_runtime = std::getenv("XDG_RUNTIME_DIR");
  const std::string saved = old_runtime ? old_runtime : "";
  ::unsetenv("INFILL_ENDPOINT");
  ::setenv("XDG_RUNTIME_DIR", "/run/user/4242", 1);
  char buf[256];
  const size_t n = infill_default_endpoint(buf, sizeof buf);
  CHECK(std::string(buf) == "unix:/run/user/4242/infill/engine.sock");
  CHECK(n == std::strlen(buf));
  char tiny[6];
  CHECK(infill_default_endpoint(tiny, sizeof tiny) == n);
  CHECK(std::string(tiny) == "unix:");
  CHECK(infill_default_endpoint(nullptr, 0) == n);
  infill_client* c = make_client(nullptr);
  CHECK(std::string(infill_client_endpoint(c)) == "unix:/run/user/4242/infill/engine.sock");
  infill_client_destroy(c);
  ::setenv("INFILL_ENDPOINT", "http://10.0.0.1:7860", 1);
  infill_default_endpoint(buf, sizeof buf);
  CHECK(std::string(buf) == "http://10.0.0.1:7860");
  ::unsetenv("INFILL_ENDPOINT");
  if (old_runtime) ::setenv("XDG_RUNTIME_DIR", saved.c_str(), 1);
  else ::unsetenv("XDG_RUNTIME_DIR");
}

TEST_CASE("sdk: NULL handles and wrong struct sizes are errors, not crashes", "[sdk]") {
  infill_health h;
  infill_health_init(&h);
  CHECK(Err(infill_client_health(nullptr, &h)).contains("client is NULL"));
  infill_client* c = make_client("unix:/nonexistent/engine.sock");
  CHECK(Err(infill_client_health(c, nullptr)).code == INFILL_ERROR_INVALID_ARGUMENT);
  infill_health small_health = h;
  small_health.struct_size = 4;
  CHECK(Err(infill_client_health(c, &small_health)).contains("infill_health.struct_size is 4"));

  infill_model_list* list = reinterpret_cast<infill_model_list*>(0x1);
  CHECK(Err(infill_client_list_models(c, nullptr)).contains("out_list is NULL"));
  CHECK(Err(infill_client_list_models(nullptr, &list)).code == INFILL_ERROR_INVALID_ARGUMENT);
  CHECK(list == nullptr);
  CHECK(infill_model_list_count(nullptr) == 0);
  CHECK(infill_model_list_get(nullptr, 0) == nullptr);
  infill_model_list_delete(nullptr);

  infill_template_info t;
  infill_template_info_init(&t);
  CHECK(Err(infill_client_upload_template(c, nullptr, 10, "x", &t)).contains("bytes is NULL"));
  CHECK(Err(infill_client_upload_template(c, "x", 0, "x", &t)).contains("size is 0"));
  infill_template_info small_t = t;
  small_t.struct_size = 1;
  CHECK(Err(infill_client_upload_template(c, "x", 1, "x", &small_t)).contains("infill_template_info.struct_size"));
  CHECK(Err(infill_client_upload_template_file(c, nullptr, &t)).contains("path is NULL"));
  Err missing(infill_client_upload_template_file(c, "/nonexistent/picture.png", &t));
  CHECK(missing.code == INFILL_ERROR_IO);
  CHECK(missing.contains("/nonexistent/picture.png"));
  CHECK(Err(infill_client_get_template(c, nullptr, &t)).contains("template_id is NULL"));
  CHECK(Err(infill_client_get_template(c, "abc", nullptr)).code == INFILL_ERROR_INVALID_ARGUMENT);

  // Jobs.
  CHECK(infill_job_id(nullptr) == 0);
  CHECK(Err(infill_job_cancel(nullptr)).contains("job is NULL"));
  CHECK(Err(infill_job_wait(nullptr, 10)).contains("job is NULL"));
  const void* png = nullptr;
  size_t size = 0;
  CHECK(Err(infill_job_result(nullptr, &png, &size)).code == INFILL_ERROR_INVALID_ARGUMENT);
  CHECK(infill_job_error(nullptr) == nullptr);
  CHECK(Err(infill_job_write_result(nullptr, "/tmp/x.png")).code == INFILL_ERROR_INVALID_ARGUMENT);
  infill_job_release(nullptr);
  infill_client_destroy(c);
}

TEST_CASE("sdk: edit parameters are checked before anything is sent, each message names the field", "[sdk]") {
  // The endpoint does not exist: every case below must fail before connecting.
  infill_client* c = make_client("unix:/nonexistent/engine.sock");
  int callbacks = 0;
  auto base = [&] {
    infill_edit_params p;
    infill_edit_params_init(&p);
    p.template_id = "0123";
    p.mask_rect[2] = p.mask_rect[3] = 8;
    p.user_data = &callbacks;
    p.on_done = [](void* user, const infill_done*) { ++*static_cast<int*>(user); };
    return p;
  };
  infill_job* job = reinterpret_cast<infill_job*>(0x1);
  CHECK(Err(infill_client_submit_edit(c, nullptr, &job)).contains("params is NULL"));
  CHECK(job == nullptr);
  CHECK(Err(infill_client_submit_edit(nullptr, nullptr, &job)).contains("client is NULL"));

  struct Case {
    const char* expect;
    std::function<void(infill_edit_params&)> change;
  };
  static const uint8_t pixels[4] = {0, 255, 255, 0};
  static const char png[] = "not really a png";
  const std::vector<Case> cases = {
      {"struct_size is 16", [](infill_edit_params& p) { p.struct_size = 16; }},
      {"template_id is required", [](infill_edit_params& p) { p.template_id = nullptr; }},
      {"template_id is required", [](infill_edit_params& p) { p.template_id = ""; }},
      {"mask: give one of", [](infill_edit_params& p) { p.mask_rect[2] = p.mask_rect[3] = 0; }},
      {"give only one of", [](infill_edit_params& p) { p.mask_png = png; p.mask_png_size = sizeof png; }},
      {"mask_png is NULL", [](infill_edit_params& p) { p.mask_rect[2] = p.mask_rect[3] = 0; p.mask_png_size = 10; }},
      {"mask_png_size is 0", [](infill_edit_params& p) { p.mask_rect[2] = p.mask_rect[3] = 0; p.mask_png = png; }},
      {"mask_pixels is NULL", [](infill_edit_params& p) { p.mask_rect[2] = p.mask_rect[3] = 0; p.mask_width = 2; p.mask_height = 2; }},
      {"mask_width x mask_height is 2x0",
       [](infill_edit_params& p) { p.mask_rect[2] = p.mask_rect[3] = 0; p.mask_pixels = pixels; p.mask_width = 2; }},
      {"mask_stride is 1, less than mask_width 2",
       [](infill_edit_params& p) {
         p.mask_rect[2] = p.mask_rect[3] = 0;
         p.mask_pixels = pixels;
         p.mask_width = p.mask_height = 2;
         p.mask_stride = 1;
       }},
      {"mask_rect is {-1, 0, 8, 8}", [](infill_edit_params& p) { p.mask_rect[0] = -1; }},
      {"mask_rect is {0, 0, 8, -3}", [](infill_edit_params& p) { p.mask_rect[3] = -3; }},
      {"steps is 5000", [](infill_edit_params& p) { p.steps = 5000; }},
      {"strength is 2", [](infill_edit_params& p) { p.strength = 2; }},
      {"strength is nan", [](infill_edit_params& p) { p.strength = std::nan(""); }},
      {"guidance is 30", [](infill_edit_params& p) { p.guidance = 30; }},
      {"guidance is 0.5", [](infill_edit_params& p) { p.guidance = 0.5; }},
      {"edit_class is 9", [](infill_edit_params& p) { p.edit_class = static_cast<infill_edit_class>(9); }},
      {"deadline_ms is -5", [](infill_edit_params& p) { p.deadline_ms = -5; }},
      {"preview_every_steps is 2000", [](infill_edit_params& p) { p.preview_every_steps = 2000; }},
      {"halo_tokens is 65", [](infill_edit_params& p) { p.halo_tokens = 65; }},
      {"feather_px is 300", [](infill_edit_params& p) { p.feather_px = 300; }},
      {"seed is 18446744073709551615", [](infill_edit_params& p) { p.seed = UINT64_MAX; }},
  };
  for (const Case& k : cases) {
    INFO(k.expect);
    infill_edit_params p = base();
    k.change(p);
    Err e(infill_client_submit_edit(c, &p, &job));
    CHECK(e.code == INFILL_ERROR_INVALID_ARGUMENT);
    CHECK(e.contains(k.expect));
    CHECK(e.contains("infill_edit_params."));
    CHECK(job == nullptr);
  }
  // A valid request to a missing engine: a connection error, and no callback.
  infill_edit_params p = base();
  Err down(infill_client_submit_edit(c, &p, &job));
  CHECK(down.code == INFILL_ERROR_CONNECTION);
  CHECK(down.contains("cannot connect"));
  CHECK(down.contains("/nonexistent/engine.sock"));
  infill_client_destroy(c);
  CHECK(callbacks == 0);
}

TEST_CASE("sdk: an unreachable engine is a connection error on every call", "[sdk]") {
  infill::test::TempDir dir("infill-sdk");
  infill_client* c = make_client(("unix:" + dir.file("engine.sock")).c_str());
  infill_health h;
  infill_health_init(&h);
  Err health(infill_client_health(c, &h));
  CHECK(health.code == INFILL_ERROR_CONNECTION);
  CHECK(health.contains("is infill-engine running?"));
  CHECK(health.http == 0);
  Err ready(infill_client_wait_ready(c, 300));
  CHECK(ready.code == INFILL_ERROR_TIMEOUT);
  CHECK(ready.contains("was not ready within 300 ms"));
  infill_client_destroy(c);

  // TCP: a closed port on loopback (port 9, discard, is never served here).
  infill_client* tcp = make_client("http://127.0.0.1:9");
  infill_model_list* list = nullptr;
  Err models(infill_client_list_models(tcp, &list));
  CHECK(models.code == INFILL_ERROR_CONNECTION);
  CHECK(models.contains("127.0.0.1:9"));
  CHECK(list == nullptr);
  infill_client_destroy(tcp);
}

TEST_CASE("sdk: every numeric parameter's range is the parameter table's, both edges", "[sdk][params]") {
  namespace proto = infill::protocol;
  infill_client* c = make_client("unix:/nonexistent/engine.sock");
  // The struct field of each numeric parameter the SDK sets; a new row in the table needs one.
  const std::map<std::string, std::function<void(infill_edit_params&, double)>> setters = {
      {"seed", [](infill_edit_params& p, double v) { p.seed = static_cast<uint64_t>(v); }},
      {"steps", [](infill_edit_params& p, double v) { p.steps = static_cast<uint32_t>(v); }},
      {"strength", [](infill_edit_params& p, double v) { p.strength = v; }},
      {"guidance", [](infill_edit_params& p, double v) { p.guidance = v; }},
      {"deadline_ms", [](infill_edit_params& p, double v) { p.deadline_ms = v; }},
      {"preview_every_steps", [](infill_edit_params& p, double v) { p.preview_every_steps = static_cast<uint32_t>(v); }},
      {"supersedes", [](infill_edit_params& p, double v) { p.supersedes = static_cast<uint64_t>(v); }},
      {"halo_tokens", [](infill_edit_params& p, double v) { p.halo_tokens = static_cast<int32_t>(v); }},
      {"feather_px", [](infill_edit_params& p, double v) { p.feather_px = v; }},
      {"adapters_from_step", [](infill_edit_params& p, double v) { p.adapters_from_step = static_cast<uint32_t>(v); }},
  };
  auto submit = [&](const std::string& name, double v) {
    infill_edit_params p;
    infill_edit_params_init(&p);
    p.template_id = "0123";
    p.mask_rect[2] = p.mask_rect[3] = 8;
    setters.at(name)(p, v);
    infill_job* job = nullptr;
    return Err(infill_client_submit_edit(c, &p, &job));
  };
  int checked = 0;
  for (const proto::EditParameter& row : proto::kEditParameters) {
    if (!(row.clients & proto::kSdk)) continue;
    if (row.type != proto::ParamType::kInteger && row.type != proto::ParamType::kNumber) continue;
    INFO(row.name);
    REQUIRE(setters.count(std::string(row.name)) == 1);
    const double step = row.type == proto::ParamType::kInteger ? 1.0 : 0.5;
    // Both edges pass the SDK's checks (the request then fails to connect) ...
    if (row.min > 0) CHECK(submit(std::string(row.name), row.min_exclusive ? row.min + step : row.min).code == INFILL_ERROR_CONNECTION);
    CHECK(submit(std::string(row.name), row.max).code == INFILL_ERROR_CONNECTION);
    // ... and one step beyond the top is refused, naming the table's range. (Below the
    // bottom is the struct's "unset" value for most fields, which the engine fills in.)
    if (row.max < proto::kMaxSafeInteger) {
      Err beyond = submit(std::string(row.name), row.max + step);
      CHECK(beyond.code == INFILL_ERROR_INVALID_ARGUMENT);
      CHECK(beyond.contains(std::string(row.name) + " is "));
      CHECK(beyond.contains("expected " + proto::range_text(row)));
    }
    ++checked;
  }
  CHECK(checked == static_cast<int>(setters.size()));
  infill_client_destroy(c);
}

TEST_CASE("sdk: the adapter and reference lists follow the parameter table: lengths, strengths, repeats", "[sdk][params]") {
  namespace proto = infill::protocol;
  infill_client* c = make_client("unix:/nonexistent/engine.sock");
  auto submit = [&](const std::function<void(infill_edit_params&)>& set) {
    infill_edit_params p;
    infill_edit_params_init(&p);
    p.template_id = "0123";
    p.mask_rect[2] = p.mask_rect[3] = 8;
    set(p);
    infill_job* job = nullptr;
    return Err(infill_client_submit_edit(c, &p, &job));
  };
  // Distinct ids, as many as asked.
  std::vector<std::string> ids;
  for (int i = 0; i < 16; ++i) ids.push_back("id" + std::to_string(i));
  int checked = 0;
  for (const proto::EditParameter& row : proto::kEditParameters) {
    if (!(row.clients & proto::kSdk)) continue;
    INFO(row.name);
    if (row.type == proto::ParamType::kAdapterList) {
      std::vector<infill_edit_adapter> adapters(row.max_length + 1);
      for (size_t i = 0; i < adapters.size(); ++i) {
        infill_edit_adapter_init(&adapters[i]);
        CHECK(adapters[i].strength == 1.0);
        adapters[i].id = ids[i].c_str();
      }
      auto with = [&](size_t count) {
        return submit([&](infill_edit_params& p) {
          p.adapters = adapters.data();
          p.adapter_count = count;
        });
      };
      // The table's longest list and both strength edges pass the SDK's checks (the request
      // then fails to connect) ...
      adapters[0].strength = row.min;
      adapters[1].strength = row.max;
      CHECK(with(row.max_length).code == INFILL_ERROR_CONNECTION);
      // ... one more entry, a strength beyond either edge, NaN, a missing id or an element
      // not prepared by its init are refused, naming the element.
      Err longer = with(row.max_length + 1);
      CHECK(longer.code == INFILL_ERROR_INVALID_ARGUMENT);
      CHECK(longer.contains("adapter_count is " + std::to_string(row.max_length + 1) + ", expected at most " +
                            std::to_string(row.max_length)));
      adapters[1].strength = row.max + 0.5;
      Err strong = with(2);
      CHECK(strong.code == INFILL_ERROR_INVALID_ARGUMENT);
      CHECK(strong.contains("infill_edit_params.adapters[1].strength is 10.5, expected " + proto::range_text(row)));
      adapters[1].strength = row.min - 0.5;
      CHECK(with(2).contains("adapters[1].strength is -10.5"));
      adapters[1].strength = std::nan("");
      CHECK(with(2).contains("adapters[1].strength is nan"));
      adapters[1].strength = 1;
      adapters[1].id = "";
      CHECK(with(2).contains("adapters[1].id is NULL or empty"));
      adapters[1].id = ids[1].c_str();
      adapters[1].struct_size = 0;
      CHECK(with(2).contains("adapters[1].struct_size is 0"));
      adapters[1].struct_size = sizeof(infill_edit_adapter);
      Err null_list = submit([](infill_edit_params& p) { p.adapter_count = 1; });
      CHECK(null_list.contains("adapters is NULL but adapter_count is 1"));
      ++checked;
    } else if (row.type == proto::ParamType::kTemplateList) {
      std::vector<const char*> refs;
      for (size_t i = 0; i <= row.max_length; ++i) refs.push_back(ids[i].c_str());
      auto with = [&](size_t count) {
        return submit([&](infill_edit_params& p) {
          p.references = refs.data();
          p.reference_count = count;
        });
      };
      CHECK(with(row.max_length).code == INFILL_ERROR_CONNECTION);
      Err longer = with(row.max_length + 1);
      CHECK(longer.code == INFILL_ERROR_INVALID_ARGUMENT);
      CHECK(longer.contains("reference_count is " + std::to_string(row.max_length + 1) + ", expected at most " +
                            std::to_string(row.max_length)));
      refs[2] = refs[0];
      Err repeat = with(3);
      CHECK(repeat.code == INFILL_ERROR_INVALID_ARGUMENT);
      CHECK(repeat.contains("references[2] repeats references[0], \"id0\""));
      refs[2] = nullptr;
      CHECK(with(3).contains("references[2] is NULL or empty"));
      Err null_list = submit([](infill_edit_params& p) { p.reference_count = 2; });
      CHECK(null_list.contains("references is NULL but reference_count is 2"));
      ++checked;
    }
  }
  CHECK(checked == 2);  // both list rows are the SDK's
  infill_client_destroy(c);
}

TEST_CASE("sdk: adapter calls check their inputs before the engine is asked", "[sdk]") {
  infill::test::TempDir dir("infill-sdk");
  infill_client* c = make_client(("unix:" + dir.file("engine.sock")).c_str());
  infill_adapter_info info;
  infill_adapter_info_init(&info);
  CHECK(info.struct_size == sizeof info);
  Err missing(infill_client_upload_adapter_file(c, dir.file("no-such-lora.safetensors").c_str(), nullptr, &info));
  CHECK(missing.code == INFILL_ERROR_IO);
  CHECK(missing.contains("cannot open the LoRA file " + dir.file("no-such-lora.safetensors")));
  Err no_path(infill_client_upload_adapter_file(c, nullptr, nullptr, &info));
  CHECK(no_path.code == INFILL_ERROR_INVALID_ARGUMENT);
  CHECK(no_path.contains("path is NULL or empty"));
  Err empty_bytes(infill_client_upload_adapter(c, "x", 0, "a.safetensors", nullptr, &info));
  CHECK(empty_bytes.contains("size is 0"));
  infill_adapter_info small = info;
  small.struct_size = 8;
  Err small_out(infill_client_upload_adapter(c, "x", 1, "a.safetensors", nullptr, &small));
  CHECK(small_out.contains("infill_adapter_info.struct_size is 8"));
  CHECK(Err(infill_client_delete_adapter(c, "")).contains("adapter_id is NULL or empty"));
  CHECK(Err(infill_client_get_adapter(c, "abc", nullptr)).contains("out (infill_adapter_info*) is NULL"));
  infill_adapter_list* list = nullptr;
  Err down(infill_client_list_adapters(c, &list));
  CHECK(down.code == INFILL_ERROR_CONNECTION);
  CHECK(list == nullptr);
  CHECK(infill_adapter_list_count(nullptr) == 0);
  CHECK(infill_adapter_list_get(nullptr, 0) == nullptr);
  infill_adapter_list_delete(nullptr);
  infill_client_destroy(c);
}
