// Config parsing, listen addresses, the token file, multipart and base64: pure functions.
#include "support/catch.h"

#include <sys/stat.h>

#include <fstream>

#include "server/multipart.h"
#include "server/server_config.h"
#include "support/temp_dir.h"

using namespace infill;

TEST_CASE("engine config: known keys parse, unknown keys and bad values are errors naming the key", "[server][config]") {
  auto c = parse_engine_config(R"({"listen": "127.0.0.1:9000", "workers": 2, "allowed_origins": ["http://localhost:3000"],
                                   "limits": {"max_body_bytes": 2048, "header_timeout_ms": 500}})",
                               "engine.json");
  REQUIRE(c.ok());
  CHECK(c->listen == "127.0.0.1:9000");
  CHECK(c->workers == 2);
  CHECK(c->allowed_origins.size() == 1);
  CHECK(c->limits.max_body_bytes == 2048);
  CHECK(c->limits.header_timeout_ms == 500);

  auto unknown = parse_engine_config(R"({"limits": {"max_body_byte": 1}})", "engine.json");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.status().message().find("engine.json: limits.max_body_byte is not a known key") == 0);
  auto type = parse_engine_config(R"({"workers": "two"})", "e.json");
  REQUIRE_FALSE(type.ok());
  CHECK(type.status().message() == "e.json: workers must be an integer");
  auto range = parse_engine_config(R"({"workers": 0})", "e.json");
  REQUIRE_FALSE(range.ok());
  CHECK(range.status().message().find("workers is 0") != std::string::npos);
  CHECK_FALSE(parse_engine_config("{not json", "e.json").ok());
  CHECK_FALSE(parse_engine_config("[]", "e.json").ok());
  CHECK_FALSE(parse_engine_config(R"({"listen": "nowhere"})", "e.json").ok());
  CHECK(load_engine_config("/nonexistent/engine.json").status().code() == ErrorCode::kNotFound);
}

TEST_CASE("engine config: device is cpu, cuda or cuda:N, or a list of them", "[server][config]") {
  CHECK(parse_engine_config(R"({})", "e.json")->device == "cpu");
  CHECK(parse_engine_config(R"({"device": "cuda:1"})", "e.json")->device == "cuda:1");
  auto bad = parse_engine_config(R"({"device": "gpu0"})", "e.json");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message() == "e.json: device: device \"gpu0\": expected cpu, cuda or cuda:N");
  CHECK_FALSE(parse_engine_config(R"({"device": 0})", "e.json").ok());
  // Several devices: a string with commas or an array.
  CHECK(parse_engine_config(R"({"device": "cuda:0,cuda:1"})", "e.json")->device == "cuda:0,cuda:1");
  CHECK(parse_engine_config(R"({"device": ["cpu", "cpu"]})", "e.json")->device == "cpu,cpu");
  auto bad_list = parse_engine_config(R"({"device": ["cpu", "gpu0"]})", "e.json");
  REQUIRE_FALSE(bad_list.ok());
  CHECK(bad_list.status().message() == "e.json: device: device list \"cpu,gpu0\": device \"gpu0\": expected cpu, cuda or cuda:N");
  CHECK_FALSE(parse_engine_config(R"({"device": []})", "e.json").ok());
  CHECK_FALSE(parse_engine_config(R"({"device": ["cpu", 1]})", "e.json").ok());
  CHECK_FALSE(parse_engine_config(R"({"device": "cpu,"})", "e.json").ok());
}

TEST_CASE("engine config: sequence_parallel and device_team_timeout_ms set the device team",
          "[server][config]") {
  auto defaults = parse_engine_config(R"({})", "e.json");
  REQUIRE(defaults.ok());
  CHECK(defaults->sequence_parallel);
  CHECK(defaults->device_team_timeout_ms == 60000);
  auto set = parse_engine_config(R"({"sequence_parallel": false, "device_team_timeout_ms": 2500})",
                                 "e.json");
  REQUIRE(set.ok());
  CHECK_FALSE(set->sequence_parallel);
  CHECK(set->device_team_timeout_ms == 2500);
  CHECK(parse_engine_config(R"({"device_team_timeout_ms": 1000})", "e.json")
            ->device_team_timeout_ms == 1000);
  CHECK(parse_engine_config(R"({"device_team_timeout_ms": 3600000})", "e.json")
            ->device_team_timeout_ms == 3600000);

  // Refused, naming the key and what it takes.
  const auto message = [](const char* json) {
    auto c = parse_engine_config(json, "e.json");
    return c.ok() ? std::string("accepted") : c.status().message();
  };
  CHECK(message(R"({"device_team_timeout_ms": 999})") ==
        "e.json: device_team_timeout_ms is 999, expected 1000..3600000 ms");
  CHECK(message(R"({"device_team_timeout_ms": 3600001})") ==
        "e.json: device_team_timeout_ms is 3600001, expected 1000..3600000 ms");
  CHECK(message(R"({"device_team_timeout_ms": -5})") ==
        "e.json: device_team_timeout_ms is -5, expected 1000..3600000 ms");
  CHECK(message(R"({"device_team_timeout_ms": "60s"})") ==
        "e.json: device_team_timeout_ms must be a number of milliseconds");
  CHECK(message(R"({"sequence_parallel": "yes"})") ==
        "e.json: sequence_parallel must be true or false");
  CHECK(message(R"({"sequence_parallel": 1})") ==
        "e.json: sequence_parallel must be true or false");
  CHECK(parse_engine_config(R"({"device_team_timeout_ms": 999})", "e.json").status().code() ==
        ErrorCode::kOutOfRange);
}

TEST_CASE("engine config: the device team's round, link and masked share", "[server][config]") {
  auto defaults = parse_engine_config(R"({})", "e.json");
  REQUIRE(defaults.ok());
  CHECK(defaults->device_team_round_ms == 50);
  CHECK_FALSE(defaults->device_team_link.has_value());  // the devices' own default
  CHECK(defaults->device_team_masked_share == 0.25);
  auto set = parse_engine_config(
      R"({"device_team_round_ms": 20, "device_team_link": {"latency_ms": 0.05, "gbytes_per_s": 25},
          "device_team_masked_share": 0.6})",
      "e.json");
  REQUIRE(set.ok());
  CHECK(set->device_team_round_ms == 20);
  REQUIRE(set->device_team_link.has_value());
  CHECK(set->device_team_link->latency_ms == 0.05);
  CHECK(set->device_team_link->gbytes_per_s == 25);
  CHECK(set->device_team_masked_share == 0.6);
  CHECK(parse_engine_config(R"({"device_team_masked_share": 1})", "e.json")->device_team_masked_share == 1);
  CHECK(parse_engine_config(R"({"device_team_link": {"latency_ms": 0, "gbytes_per_s": 1}})", "e.json")
            ->device_team_link->latency_ms == 0);

  const auto message = [](const char* json) {
    auto c = parse_engine_config(json, "e.json");
    return c.ok() ? std::string("accepted") : c.status().message();
  };
  CHECK(message(R"({"device_team_round_ms": 0})") == "e.json: device_team_round_ms is 0, expected 1..10000 ms");
  CHECK(message(R"({"device_team_round_ms": "50ms"})") ==
        "e.json: device_team_round_ms must be a number of milliseconds");
  CHECK(message(R"({"device_team_masked_share": 1.5})") ==
        "e.json: device_team_masked_share is 1.5, expected 0..1");
  CHECK(message(R"({"device_team_masked_share": "half"})") == "e.json: device_team_masked_share must be a number");
  CHECK(message(R"({"device_team_link": {"latency_ms": 0.05}})") ==
        "e.json: device_team_link needs both latency_ms and gbytes_per_s");
  CHECK(message(R"({"device_team_link": {"latency_ms": 0.05, "gbytes_per_s": 0}})") ==
        "e.json: device_team_link.gbytes_per_s is 0, expected 0.001..100000");
  CHECK(message(R"({"device_team_link": {"latency_ms": -1, "gbytes_per_s": 10}})") ==
        "e.json: device_team_link.latency_ms is -1, expected 0..1000 ms");
  CHECK_THAT(message(R"({"device_team_link": {"latency": 0.05, "gbytes_per_s": 10}})"),
             Catch::Contains("device_team_link.latency is not a known key (known: gbytes_per_s, latency_ms)"));
  CHECK(message(R"({"device_team_link": 25})") == "e.json: device_team_link must be an object");
}

TEST_CASE("engine config: step_graph_bytes sets the FLUX.2 step graphs' budget, off by default", "[server][config]") {
  auto defaults = parse_engine_config(R"({})", "e.json");
  REQUIRE(defaults.ok());
  CHECK(defaults->step_graph_bytes == 0);
  auto set = parse_engine_config(R"({"step_graph_bytes": 2147483648})", "e.json");
  REQUIRE(set.ok());
  CHECK(set->step_graph_bytes == 2147483648LL);
  auto refused = parse_engine_config(R"({"step_graph_bytes": -1})", "e.json");
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("step_graph_bytes") && Catch::Contains("-1"));
  refused = parse_engine_config(R"({"step_graph_bytes": "2G"})", "e.json");
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("step_graph_bytes"));
}

TEST_CASE("engine config: model is one folder or a list of them, the first the default", "[server][config]") {
  auto one = parse_engine_config(R"({"model": "/models/a"})", "e.json");
  REQUIRE(one.ok());
  CHECK(one->models == std::vector<std::string>{"/models/a"});
  auto several = parse_engine_config(R"({"model": ["/models/a", "/models/b"]})", "e.json");
  REQUIRE(several.ok());
  CHECK(several->models == std::vector<std::string>{"/models/a", "/models/b"});
  auto none = parse_engine_config(R"({})", "e.json");
  REQUIRE(none.ok());
  CHECK(none->models.empty());
  auto empty_list = parse_engine_config(R"({"model": []})", "e.json");
  REQUIRE_FALSE(empty_list.ok());
  CHECK(empty_list.status().message().find("e.json: model must be a model folder or a non-empty array") == 0);
  auto bad_element = parse_engine_config(R"({"model": ["/models/a", 3]})", "e.json");
  REQUIRE_FALSE(bad_element.ok());
  CHECK(bad_element.status().message().find("an element is 3") != std::string::npos);
}

TEST_CASE("listen addresses", "[server][config]") {
  auto v4 = parse_listen_address("127.0.0.1:8080");
  REQUIRE(v4.ok());
  CHECK(v4->first == "127.0.0.1");
  CHECK(v4->second == 8080);
  auto v6 = parse_listen_address("[::1]:0");
  REQUIRE(v6.ok());
  CHECK(v6->first == "::1");
  CHECK_FALSE(parse_listen_address("127.0.0.1").ok());
  CHECK_FALSE(parse_listen_address("127.0.0.1:65536").ok());
  CHECK_FALSE(parse_listen_address(":80").ok());
  CHECK_FALSE(parse_listen_address("[::1]80").ok());
}

TEST_CASE("the token is created once with mode 0600 and refused when others can read it", "[server][config]") {
  test::TempDir dir("infill-token");
  const std::string path = dir.file("conf/token");
  auto a = load_or_create_token(path);
  REQUIRE(a.ok());
  CHECK(a->size() == 64);
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  REQUIRE(::stat(dir.file("conf").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0700);
  auto b = load_or_create_token(path);
  REQUIRE(b.ok());
  CHECK(*a == *b);
  auto other = load_or_create_token(dir.file("conf/token2"));
  REQUIRE(other.ok());
  CHECK(*other != *a);
  ::chmod(path.c_str(), 0644);
  CHECK_FALSE(load_or_create_token(path).ok());
  CHECK(constant_time_equal("abc", "abc"));
  CHECK_FALSE(constant_time_equal("abc", "abd"));
  CHECK_FALSE(constant_time_equal("abc", "abcd"));
  CHECK_FALSE(constant_time_equal("", "a"));
}

TEST_CASE("multipart bodies and base64", "[server][multipart]") {
  auto b = multipart_boundary("multipart/form-data; boundary=\"abc;def\"");
  REQUIRE(b.ok());
  CHECK(*b == "abc;def");
  CHECK_FALSE(multipart_boundary("application/json").ok());
  CHECK_FALSE(multipart_boundary("multipart/form-data").ok());

  const std::string body =
      "--XX\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n"
      "--XX\r\nContent-Disposition: form-data; name=\"f\"; filename=\"m.png\"\r\nContent-Type: image/png\r\n\r\n\x89PNG\r\n--\r\n"
      "--XX--\r\n";
  auto parts = parse_multipart(body, "XX");
  REQUIRE(parts.ok());
  REQUIRE(parts->size() == 2);
  CHECK((*parts)[0].name == "a");
  CHECK((*parts)[0].data == "1");
  CHECK((*parts)[1].filename == "m.png");
  CHECK((*parts)[1].content_type == "image/png");
  CHECK((*parts)[1].data == "\x89PNG\r\n--");
  CHECK_FALSE(parse_multipart("no boundary here", "XX").ok());
  CHECK_FALSE(parse_multipart(body.substr(0, 60), "XX").ok());
  CHECK_FALSE(parse_multipart("--XX\r\nX-Other: 1\r\n\r\ndata\r\n--XX--", "XX").ok());

  for (const std::string& s : std::vector<std::string>{"", "f", "fo", "foo", "foob", "fooba", "foobar", std::string("\0\xff\x10", 3)}) {
    auto d = base64_decode(base64_encode(s));
    REQUIRE(d.ok());
    CHECK(*d == s);
  }
  CHECK(base64_encode("foobar") == "Zm9vYmFy");
  CHECK_FALSE(base64_decode("Zm9v!").ok());
  CHECK_FALSE(base64_decode("Zm=9v").ok());
}

TEST_CASE("engine config: float8_weights turns FP8 block weights on for FLUX.2 on a GPU and is off by default",
          "[server][config][float8]") {
  auto defaults = parse_engine_config(R"({})", "e.json");
  REQUIRE(defaults.ok());
  CHECK_FALSE(defaults->float8_weights);
  auto set = parse_engine_config(R"({"float8_weights": true})", "e.json");
  REQUIRE(set.ok());
  CHECK(set->float8_weights);
  auto refused = parse_engine_config(R"({"float8_weights": "yes"})", "e.json");
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("float8_weights"));
}

TEST_CASE("engine config: device_cache_bytes sets the device K/V tier's budget of each FLUX.2 model on a GPU",
          "[server][config]") {
  auto defaults = parse_engine_config(R"({})", "e.json");
  REQUIRE(defaults.ok());
  CHECK(defaults->device_cache_bytes == int64_t{8} << 30);
  auto set = parse_engine_config(R"({"device_cache_bytes": 1073741824})", "e.json");
  REQUIRE(set.ok());
  CHECK(set->device_cache_bytes == int64_t{1} << 30);
  auto refused = parse_engine_config(R"({"device_cache_bytes": -5})", "e.json");
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("device_cache_bytes") && Catch::Contains("-5"));
}

TEST_CASE("engine config: fused_norm_kernels turns the fused norm kernels on for FLUX.2 on a GPU and is off by default",
          "[server][config][fused-norms]") {
  auto defaults = parse_engine_config(R"({})", "e.json");
  REQUIRE(defaults.ok());
  CHECK_FALSE(defaults->fused_norm_kernels);
  auto set = parse_engine_config(R"({"fused_norm_kernels": true})", "e.json");
  REQUIRE(set.ok());
  CHECK(set->fused_norm_kernels);
  CHECK_FALSE(set->float8_weights);  // each option its own
  auto refused = parse_engine_config(R"({"fused_norm_kernels": 1})", "e.json");
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("fused_norm_kernels") && Catch::Contains("e.json"));
}
